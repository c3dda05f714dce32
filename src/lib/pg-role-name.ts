// Shared by the CLI (`gatehouse db-user`, `users create --db-user`) and the
// console, which shows that command: kept apart from src/cli/pg-role.ts so the
// service does not load the CLI's table printer and PostgreSQL client with it.

/** Names CREATE ROLE refuses or that would shadow a role every cluster has. */
const RESERVED = new Set(['postgres', 'public', 'none', 'current_user', 'session_user', 'current_role', 'all'])
/** Lower-case, so quoting changes nothing; 63 bytes at most, so PostgreSQL never truncates two names into one. */
export const ROLE_NAME_PATTERN = '^[a-z_][a-z0-9_$]{0,62}$'
const ROLE_NAME = new RegExp(ROLE_NAME_PATTERN)

/** What a created role may have, in the order reports list them. */
export const DATABASE_ROLE_PRIVILEGES = ['superuser', 'createdb', 'createrole', 'login'] as const

/**
 * What `--privileges` chooses from. A database user always has LOGIN, as
 * CREATE USER gives it: a role for a person that cannot log in is no use to
 * them. `login` is still accepted in the list (older scripts pass it) and
 * changes nothing.
 */
export const OPTIONAL_DATABASE_ROLE_PRIVILEGES = ['superuser', 'createdb', 'createrole'] as const
export const DEFAULT_DATABASE_ROLE_PRIVILEGES = 'createdb'

/**
 * The one spelling of the seed's usual choice, superuser and create-database,
 * that the CLI's help, the console's hint and the docs all show (issue 41:
 * three spellings had drifted apart).
 */
export const SUPERUSER_PRIVILEGES_OPTION = '--privileges createdb,superuser'

/** How `--privileges` is explained wherever it is: the CLI's help and the console's hint. */
export const PRIVILEGES_HELP = `comma-separated, from ${OPTIONAL_DATABASE_ROLE_PRIVILEGES.join(', ')}; the role always has LOGIN; for a superuser: ${SUPERUSER_PRIVILEGES_OPTION}`

/** Why `name` may not be a role name, or undefined when it may. */
export function roleNameProblem (name: string): string | undefined {
  if (Buffer.byteLength(name, 'utf8') > 63) return 'it is longer than 63 bytes, which PostgreSQL would silently truncate'
  if (!ROLE_NAME.test(name)) return 'a role name starts with a-z or _ and has only a-z, 0-9, _ and $ (no capitals, quotes, spaces or other characters)'
  if (name.startsWith('pg_')) return 'names starting with pg_ are reserved by PostgreSQL'
  if (RESERVED.has(name)) return `"${name}" is reserved`
  return undefined
}
