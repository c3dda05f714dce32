import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import SQLite from 'better-sqlite3'
import {
  Kysely,
  PostgresAdapter,
  PostgresDialect,
  SqliteDialect,
  sql,
  type ColumnType,
  type SqliteDatabase
} from 'kysely'
import pg from 'pg'
import type { Config } from '../config.ts'

/** Timestamps are written as RFC 3339 strings; PostgreSQL hands back Date, SQLite the string. */
type Timestamp = ColumnType<Date | string, string, string>
type NullableTimestamp = ColumnType<Date | string | null, string | null, string | null>
/** JSON arrays: jsonb on PostgreSQL (parsed by the driver), text on SQLite. Always written as a JSON string. */
type JsonArray = ColumnType<string[] | string, string, string>
/** boolean on PostgreSQL, 0/1 on SQLite (converted at binding, see withIntegerBooleans). */
type Bool = ColumnType<boolean | number, boolean, boolean>

export interface UsersTable {
  id: string
  username: string
  /** Case-folded username; the unique index that makes "unique ignoring case" a database rule. */
  username_key: string
  email: string | null
  email_key: string | null
  first_name: string | null
  last_name: string | null
  role: 'admin' | 'user'
  groups: JsonArray
  disabled: Bool
  password_hash: string | null
  version: number
  created_at: Timestamp
  updated_at: Timestamp
  last_login_at: NullableTimestamp
  password_changed_at: NullableTimestamp
  /** Consecutive failed sign-ins; reset by a successful one. */
  failed_logins: ColumnType<number, number | undefined, number>
  locked_until: NullableTimestamp
}

export interface SessionsTable {
  id: string
  user_id: string
  digest: string
  created_at: Timestamp
  last_seen_at: Timestamp
  expires_at: Timestamp
  ended_at: NullableTimestamp
  client_ip: string | null
  user_agent: string | null
}

export interface ApiKeysTable {
  id: string
  name: string
  /** The visible start of the secret, for recognising a key in lists and logs. */
  prefix: string
  /** SHA-256 of the whole secret, hex. The secret itself is never stored. */
  digest: string
  scopes: JsonArray
  /** The user the key acts for; null for keys that belong to the deployment (bootstrap, CLI). */
  user_id: string | null
  created_by_type: string
  created_by_id: string | null
  created_at: Timestamp
  expires_at: NullableTimestamp
  last_used_at: NullableTimestamp
  revoked_at: NullableTimestamp
}

export interface EventsTable {
  id: string
  type: string
  occurred_at: Timestamp
  actor_type: string
  actor_id: string | null
  target_type: string | null
  target_id: string | null
  request_id: string | null
  client_ip: string | null
  data: ColumnType<Record<string, unknown> | string, string, never>
}

export interface MetaTable {
  key: string
  value: string
}

export interface Database {
  users: UsersTable
  api_keys: ApiKeysTable
  events: EventsTable
  sessions: SessionsTable
  gatehouse_meta: MetaTable
}

export type Db = Kysely<Database>
export type DialectName = 'sqlite' | 'postgres'

export function dialectOf (db: Kysely<any>): DialectName {
  return db.getExecutor().adapter instanceof PostgresAdapter ? 'postgres' : 'sqlite'
}

export function isPostgres (db: Kysely<any>): boolean {
  return dialectOf(db) === 'postgres'
}

export function createDb (config: Pick<Config, 'databaseUrl' | 'databaseSchema' | 'databasePoolSize' | 'databaseStatementTimeoutMs'>): Db {
  if (config.databaseUrl.startsWith('sqlite:')) {
    return new Kysely<Database>({
      dialect: new SqliteDialect({ database: openSqlite(config.databaseUrl.slice('sqlite:'.length), config.databaseStatementTimeoutMs) })
    })
  }
  const pool = new pg.Pool({
    connectionString: config.databaseUrl,
    max: config.databasePoolSize,
    connectionTimeoutMillis: 5000,
    idleTimeoutMillis: 30_000,
    statement_timeout: config.databaseStatementTimeoutMs,
    ...(config.databaseSchema !== undefined ? { options: `-c search_path=${config.databaseSchema}` } : {})
  })
  // An idle client losing its server must not crash the process; the next query reports it.
  pool.on('error', () => {})
  return new Kysely<Database>({ dialect: new PostgresDialect({ pool }) })
}

function openSqlite (path: string, busyTimeoutMs: number): SqliteDatabase {
  const file = path === ':memory:' || path === '' ? ':memory:' : path
  if (file !== ':memory:') mkdirSync(dirname(file), { recursive: true })
  const raw = new SQLite(file, { timeout: busyTimeoutMs })
  raw.pragma('journal_mode = WAL')
  raw.pragma('synchronous = NORMAL')
  raw.pragma('foreign_keys = ON')
  // Kysely prepares every statement anew; preparing is a large share of a short query's cost.
  const statements = new Map<string, SqliteStatement>()
  return {
    close: () => raw.close(),
    prepare: (text: string) => {
      let statement = statements.get(text)
      if (statement === undefined) {
        if (statements.size >= 1000) statements.clear()
        statement = withIntegerBooleans(raw.prepare(text))
        statements.set(text, statement)
      }
      return statement
    }
  }
}

type SqliteStatement = ReturnType<SqliteDatabase['prepare']>

/**
 * better-sqlite3 refuses to bind booleans, and SQLite stores them as 0/1
 * anyway: convert at the binding, which costs one pass over the parameters
 * (a Kysely plugin would rewrite every query's syntax tree instead).
 */
function withIntegerBooleans (statement: SQLite.Statement): SqliteStatement {
  const bind = (parameters: ReadonlyArray<unknown>): unknown[] =>
    parameters.map(p => typeof p === 'boolean' ? (p ? 1 : 0) : p)
  return {
    reader: statement.reader,
    all: (parameters) => statement.all(bind(parameters)),
    run: (parameters) => statement.run(bind(parameters)),
    iterate: (parameters) => statement.iterate(bind(parameters))
  }
}

/** Cheap round trip used by /readyz. */
export async function pingDb (db: Db): Promise<void> {
  await sql`select 1`.execute(db)
}

export function toIso (value: Date | string): string
export function toIso (value: Date | string | null): string | null
export function toIso (value: Date | string | null): string | null {
  if (value === null) return null
  return value instanceof Date ? value.toISOString() : value
}

export function toBool (value: boolean | number): boolean {
  return value === true || value === 1
}

export function toStringArray (value: string[] | string): string[] {
  return typeof value === 'string' ? JSON.parse(value) as string[] : value
}
