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

/** Why `name` may not be a role name, or undefined when it may. */
export function roleNameProblem (name: string): string | undefined {
  if (Buffer.byteLength(name, 'utf8') > 63) return 'it is longer than 63 bytes, which PostgreSQL would silently truncate'
  if (!ROLE_NAME.test(name)) return 'a role name starts with a-z or _ and has only a-z, 0-9, _ and $ (no capitals, quotes, spaces or other characters)'
  if (name.startsWith('pg_')) return 'names starting with pg_ are reserved by PostgreSQL'
  if (RESERVED.has(name)) return `"${name}" is reserved`
  return undefined
}
