import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto'
import pg from 'pg'
import { CliError, UsageError } from './output.ts'
import { DATABASE_ROLE_PRIVILEGES, DEFAULT_DATABASE_ROLE_PRIVILEGES, OPTIONAL_DATABASE_ROLE_PRIVILEGES, roleNameProblem } from '../lib/pg-role-name.ts'

export { roleNameProblem }

/**
 * The optional database-user step (docs/cli.md, PRODUCT.md §10): a
 * PostgreSQL role in the service's relational database, created with a
 * locally computed SCRAM-SHA-256 verifier, so the plaintext password never
 * reaches the server, its logs or pg_stat_activity.
 */

export const PRIVILEGES = DATABASE_ROLE_PRIVILEGES
export type Privilege = typeof PRIVILEGES[number]
export const OPTIONAL_PRIVILEGES = OPTIONAL_DATABASE_ROLE_PRIVILEGES
export const DEFAULT_PRIVILEGES = DEFAULT_DATABASE_ROLE_PRIVILEGES

export function checkRoleName (name: string): void {
  const problem = roleNameProblem(name)
  if (problem !== undefined) throw new UsageError(`not a valid database role name ${JSON.stringify(name)}: ${problem}`)
}

/** The privileges `--privileges` asks for, plus `login`, which every database user has. */
export function parsePrivileges (list: string): Set<Privilege> {
  const items = list.split(',').map(s => s.trim().toLowerCase()).filter(s => s !== '')
  if (items.length === 0) throw new UsageError(`--privileges takes a comma-separated list of ${OPTIONAL_PRIVILEGES.join(', ')}`)
  for (const item of items) {
    if (!(PRIVILEGES as readonly string[]).includes(item)) {
      throw new UsageError(`unknown privilege "${item}"; choose from ${OPTIONAL_PRIVILEGES.join(', ')} (a database user always has LOGIN)`)
    }
  }
  return new Set([...items as Privilege[], 'login'])
}

export const SUPERUSER_WARNING = 'warning: superuser bypasses every permission check in the whole database cluster; grant it only to people who need it'

// RFC 3454 tables used by SASLprep (RFC 4013), as PostgreSQL's src/common/saslprep.c applies them.
const NON_ASCII_SPACE = /[\u00A0\u1680\u2000-\u200B\u202F\u205F\u3000]/g
// eslint-disable-next-line no-misleading-character-class
const MAPPED_TO_NOTHING = /[\u00AD\u034F\u1806\u180B-\u180D\u200B-\u200D\u2060\uFE00-\uFE0F\uFEFF]/g
// C.1.2, C.2.1, C.2.2, C.3, C.4, C.5, C.6, C.7, C.8, C.9 (code points above U+FFFF checked separately below).
// eslint-disable-next-line no-control-regex, no-misleading-character-class
const PROHIBITED = /[\u00A0\u1680\u2000-\u200B\u202F\u205F\u3000\u0000-\u001F\u007F\u0080-\u009F\u06DD\u070F\u180E\u200C\u200D\u2028\u2029\u2060-\u2063\u206A-\u206F\uFEFF\uFFF9-\uFFFC\uE000-\uF8FF\uFDD0-\uFDEF\uFFFE\uFFFF\uD800-\uDFFF\uFFFD\u0340\u0341\u200E\u200F\u202A-\u202E\u2FF0-\u2FFB]/u

function prohibitedAstral (codePoint: number): boolean {
  if (codePoint < 0x10000) return false
  if ((codePoint & 0xFFFE) === 0xFFFE) return true // C.4 non-characters at the end of each plane
  if (codePoint >= 0x1D173 && codePoint <= 0x1D17A) return true // C.2.2 musical control characters
  if (codePoint >= 0xF0000) return true // C.3 private use planes 15 and 16
  return codePoint === 0xE0001 || (codePoint >= 0xE0020 && codePoint <= 0xE007F) // C.9 tags
}

/**
 * SASLprep as PostgreSQL applies it to passwords: ASCII is taken as it is;
 * otherwise non-ASCII spaces become spaces, "mapped to nothing" characters go,
 * the result is NFKC-normalized, and if it holds a prohibited character the
 * original string is used instead (PostgreSQL falls back to the raw bytes).
 * Not checked: unassigned code points and the bidirectional rule, where
 * PostgreSQL would also fall back (node-postgres skips the same checks).
 */
export function saslprep (password: string): string {
  // eslint-disable-next-line no-control-regex
  if (/^[\u0000-\u007F]*$/.test(password)) return password
  const prepared = password.replace(NON_ASCII_SPACE, ' ').replace(MAPPED_TO_NOTHING, '').normalize('NFKC')
  if (PROHIBITED.test(prepared)) return password
  for (const char of prepared) if (prohibitedAstral(char.codePointAt(0)!)) return password
  return prepared
}

/**
 * `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (RFC 5803), as
 * PostgreSQL's scram_build_secret makes it; stored as-is by CREATE ROLE.
 */
export function scramVerifier (password: string, { salt = randomBytes(16), iterations = 4096 }: { salt?: Buffer, iterations?: number } = {}): string {
  const salted = pbkdf2Sync(Buffer.from(saslprep(password), 'utf8'), salt, iterations, 32, 'sha256')
  const clientKey = createHmac('sha256', salted).update('Client Key').digest()
  const storedKey = createHash('sha256').update(clientKey).digest()
  const serverKey = createHmac('sha256', salted).update('Server Key').digest()
  return `SCRAM-SHA-256$${iterations}:${salt.toString('base64')}$${storedKey.toString('base64')}:${serverKey.toString('base64')}`
}

/**
 * Every attribute spelled out, so the role has exactly the requested ones
 * whatever the defaults; LOGIN always (see OPTIONAL_PRIVILEGES).
 */
export function createRoleSql (name: string, privileges: ReadonlySet<Privilege>, verifier: string | undefined): string {
  checkRoleName(name)
  const attributes = [
    'LOGIN',
    privileges.has('superuser') ? 'SUPERUSER' : 'NOSUPERUSER',
    privileges.has('createdb') ? 'CREATEDB' : 'NOCREATEDB',
    privileges.has('createrole') ? 'CREATEROLE' : 'NOCREATEROLE',
    'INHERIT', 'NOREPLICATION', 'NOBYPASSRLS'
  ]
  if (verifier !== undefined) {
    if (!/^SCRAM-SHA-256\$\d+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$/.test(verifier)) throw new Error('not a SCRAM-SHA-256 verifier')
    attributes.push(`PASSWORD ${pg.escapeLiteral(verifier)}`)
  }
  // CREATE ROLE is a utility statement and takes no bind parameters: the name is validated above and quoted here.
  return `CREATE ROLE ${pg.escapeIdentifier(name)} WITH ${attributes.join(' ')}`
}

/** Connects to SERVICE_DATABASE_URL; the error names the host, never the URL (which may hold a password). */
export async function connectServiceDb (env: NodeJS.ProcessEnv = process.env): Promise<pg.Client> {
  const url = env.SERVICE_DATABASE_URL
  if (url === undefined || url === '') throw new UsageError('set SERVICE_DATABASE_URL to the service\'s PostgreSQL database (postgres://...), connected as a role that may create roles')
  if (!/^postgres(ql)?:\/\//.test(url)) throw new UsageError('SERVICE_DATABASE_URL must start with postgres://')
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000, application_name: 'gatehouse-cli' })
  client.on('error', () => {})
  try {
    await client.connect()
  } catch (error) {
    let host = '?'
    try { host = new URL(url).host } catch {}
    throw new CliError(`cannot connect to SERVICE_DATABASE_URL (${host}): ${(error as Error).message}`)
  }
  return client
}

/** The service database as events name it: host, port and database, never the user or password. */
export function serviceDatabaseName (env: NodeJS.ProcessEnv = process.env): string {
  const url = new URL(env.SERVICE_DATABASE_URL!)
  const database = decodeURIComponent(url.pathname.replace(/^\//, '')) || decodeURIComponent(url.username) || 'postgres'
  return `${url.hostname === '' ? 'localhost' : url.hostname}:${url.port === '' ? '5432' : url.port}/${database}`.replace(/[\s@]/g, '_').slice(0, 300)
}

export async function roleExists (client: pg.Client, name: string): Promise<boolean> {
  const result = await client.query('SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1', [name])
  return result.rowCount !== null && result.rowCount > 0
}

function existsError (name: string): CliError {
  return new CliError(`a database role named "${name}" already exists; gatehouse never alters an existing role`)
}

/** Creates the role, or fails if one of that name exists (never ALTER ROLE). */
export async function createRole (client: pg.Client, name: string, privileges: ReadonlySet<Privilege>, password: string | undefined): Promise<void> {
  const sql = createRoleSql(name, privileges, password === undefined ? undefined : scramVerifier(password))
  if (await roleExists(client, name)) throw existsError(name)
  try {
    await client.query(sql)
  } catch (error) {
    throw pgFailure(error, name)
  }
}

/** Drops exactly the named role; fails if there is none. */
export async function dropRole (client: pg.Client, name: string): Promise<void> {
  checkRoleName(name)
  if (!await roleExists(client, name)) throw new CliError(`no database role is named "${name}"`)
  try {
    await client.query(`DROP ROLE ${pg.escapeIdentifier(name)}`)
  } catch (error) {
    throw pgFailure(error, name)
  }
}

function pgFailure (error: unknown, name: string): CliError {
  const e = error as { code?: string, message?: string, detail?: string }
  if (e.code === '42710') return existsError(name)
  if (e.code === '2BP01') {
    return new CliError(`the role "${name}" still owns objects or holds privileges (${e.detail?.split('\n')[0] ?? e.message}); ` +
      `in each database where it does, run: REASSIGN OWNED BY ${pg.escapeIdentifier(name)} TO CURRENT_USER; DROP OWNED BY ${pg.escapeIdentifier(name)}`)
  }
  return new CliError(`PostgreSQL refused: ${e.message ?? String(error)}`)
}
