import type BetterSqlite3 from 'better-sqlite3'
import type pg from 'pg'
import { isoFromTimestamptz, type DialectName } from '../db/database.ts'
import { loadPg } from '../db/pg-driver.ts'
import { Sqlite } from '../db/sqlite-binding.ts'
import { BACKUP_TABLES, isSearchIndexTable, TABLES_BY_NAME, UNSAVED_TABLES, type BackupTable, type ColumnKind } from './backup-tables.ts'

/**
 * The two databases as the backup reads and the restore writes them: one
 * connection each (never the service's pool), values turned into the
 * portable form of the file and back.
 */
export type Connection =
  | { dialect: 'sqlite', sqlite: BetterSqlite3.Database }
  | { dialect: 'postgres', client: pg.Client, schema: string | undefined }

/** A table as this database has it: the columns of the list it holds, in the list's order. */
export interface PresentTable { table: BackupTable, columns: string[], kinds: ColumnKind[] }

const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const ROWS_PER_FETCH = 2000

export class BackupDatabaseError extends Error {}

export function openSqliteConnection (path: string, options: { mustExist: boolean }): Connection {
  const sqlite = new Sqlite(path, { fileMustExist: options.mustExist, timeout: 10_000 })
  sqlite.pragma('foreign_keys = ON')
  return { dialect: 'sqlite', sqlite }
}

const INT8_OID = 20
const TIMESTAMPTZ_OID = 1184

export async function openPgConnection (url: string, schema: string | undefined): Promise<Connection> {
  const { Client, types } = loadPg()
  const client = new Client({
    connectionString: url,
    // Timestamps in the ISO form SQLite stores; bigints (sign counts, time steps) as numbers.
    types: {
      getTypeParser: ((oid: number, format?: string) => {
        if (format === 'binary') return types.getTypeParser(oid, 'binary')
        if (oid === TIMESTAMPTZ_OID) return isoFromTimestamptz
        if (oid === INT8_OID) return (text: string) => Number(text)
        return types.getTypeParser(oid, 'text')
      }) as typeof types.getTypeParser
    },
    options: `-c TimeZone=UTC -c statement_timeout=0 -c idle_in_transaction_session_timeout=0${schema !== undefined ? ` -c search_path=${schema}` : ''}`
  })
  client.on('error', () => {})
  await client.connect()
  return { dialect: 'postgres', client, schema }
}

export async function closeConnection (connection: Connection): Promise<void> {
  if (connection.dialect === 'sqlite') connection.sqlite.close()
  else await connection.client.end().catch(() => {})
}

const quoted = (name: string): string => `"${name}"`

/** Table name → its columns, for the tables of gatehouse's schema (the configured schema on PostgreSQL). */
async function columnsOf (connection: Connection): Promise<Map<string, string[]>> {
  const found = new Map<string, string[]>()
  if (connection.dialect === 'sqlite') {
    const tables = connection.sqlite.prepare("select name from sqlite_master where type = 'table'").pluck().all() as string[]
    for (const name of tables) {
      found.set(name, (connection.sqlite.prepare(`pragma table_info(${quoted(name)})`).all() as Array<{ name: string }>).map(c => c.name))
    }
    return found
  }
  const { rows } = await connection.client.query<{ table: string, column: string }>(`
    select table_name as table, column_name as column from information_schema.columns
    where table_schema = coalesce($1, current_schema()) order by ordinal_position`, [connection.schema ?? null])
  for (const { table, column } of rows) found.set(table, [...(found.get(table) ?? []), column])
  return found
}

/**
 * The applied migrations (null: no gatehouse schema here) and the tables of
 * the list this database holds. A column the list does not know stops here:
 * its values would be lost.
 */
export async function describe (connection: Connection): Promise<{ migrations: string[] | null, tables: PresentTable[] }> {
  const columns = await columnsOf(connection)
  if (!columns.has('kysely_migration')) return { migrations: null, tables: [] }
  const migrations = connection.dialect === 'sqlite'
    ? connection.sqlite.prepare('select name from kysely_migration order by name').pluck().all() as string[]
    : (await connection.client.query<{ name: string }>('select name from kysely_migration order by name')).rows.map(r => r.name)
  // sqlite_* are SQLite's own (sqlite_stat1 after ANALYZE, sqlite_sequence).
  const strangers = [...columns.keys()].filter(name => !TABLES_BY_NAME.has(name) && !UNSAVED_TABLES.has(name) && !isSearchIndexTable(name) && !name.startsWith('sqlite_'))
  if (strangers.length > 0) throw new BackupDatabaseError(`the database has tables this gatehouse does not know (${strangers.sort().join(', ')}): use the gatehouse release that made them`)
  const tables: PresentTable[] = []
  for (const table of BACKUP_TABLES) {
    const present = columns.get(table.name)
    if (present === undefined) continue
    const unknown = present.filter(c => table.columns[c] === undefined && !(table.derived ?? []).includes(c))
    if (unknown.length > 0) throw new BackupDatabaseError(`table ${table.name} has columns this gatehouse does not know (${unknown.join(', ')}): use the gatehouse release that made them`)
    const names = Object.keys(table.columns).filter(c => present.includes(c))
    tables.push({ table, columns: names, kinds: names.map(c => table.columns[c]!) })
  }
  return { migrations, tables }
}

/** The file's form of a value read from either database. */
function portable (kind: ColumnKind, value: unknown): unknown {
  if (value === null || value === undefined) return null
  switch (kind) {
    case 'bool': return value === true || value === 1 || value === 1n
    case 'int': return typeof value === 'bigint' ? Number(value) : value
    case 'json': return typeof value === 'string' ? JSON.parse(value) : value
    case 'blob': return (value as Buffer).toString('base64')
    case 'ts': {
      if (typeof value !== 'string' || ISO_MS.test(value)) return value
      const date = new Date(value)
      return Number.isNaN(date.getTime()) ? value : date.toISOString()
    }
    default: return value
  }
}

/** A file value as the database takes it: JSON as text, SQLite's booleans as 0/1, blobs as bytes. */
export function bindable (dialect: DialectName, kind: ColumnKind, value: unknown): unknown {
  if (value === null) return null
  if (kind === 'json') return JSON.stringify(value)
  if (kind === 'blob') return Buffer.from(value as string, 'base64')
  if (kind === 'bool' && dialect === 'sqlite') return value === true ? 1 : 0
  return value
}

function orderBy (connection: Connection, present: PresentTable): string {
  // Byte order on both: SQLite compares text by bytes; PostgreSQL's "C" collation does, and uuids compare as their hex.
  return present.table.primaryKey.map(c => present.table.columns[c] === 'text' && connection.dialect === 'postgres' ? `${quoted(c)} collate "C"` : quoted(c)).join(', ')
}

/** A table's rows in primary-key order, in batches, as the file writes them. Run inside the caller's snapshot. */
export async function * readRows (connection: Connection, present: PresentTable): AsyncGenerator<unknown[][]> {
  const text = `select ${present.columns.map(quoted).join(', ')} from ${quoted(present.table.name)} order by ${orderBy(connection, present)}`
  const convert = (row: unknown[]): unknown[] => row.map((value, i) => portable(present.kinds[i]!, value))
  if (connection.dialect === 'sqlite') {
    let batch: unknown[][] = []
    for (const row of connection.sqlite.prepare(text).raw(true).iterate() as IterableIterator<unknown[]>) {
      batch.push(convert(row))
      if (batch.length >= ROWS_PER_FETCH) {
        yield batch
        batch = []
      }
    }
    if (batch.length > 0) yield batch
    return
  }
  const { client } = connection
  await client.query(`declare gatehouse_backup_rows no scroll cursor for ${text}`)
  try {
    for (;;) {
      const { rows } = await client.query({ text: `fetch ${ROWS_PER_FETCH} from gatehouse_backup_rows`, rowMode: 'array' })
      if (rows.length === 0) break
      yield (rows as unknown[][]).map(convert)
    }
  } finally {
    await client.query('close gatehouse_backup_rows')
  }
}

/** Inserts rows of the file (portable values, in `columns` order) into the open transaction. */
export async function insertRows (connection: Connection, present: PresentTable, rows: unknown[][]): Promise<void> {
  const { table, columns, kinds } = present
  const bind = (row: unknown[]): unknown[] => row.map((value, i) => bindable(connection.dialect, kinds[i]!, value))
  const into = `insert into ${quoted(table.name)} (${columns.map(quoted).join(', ')}) values `
  if (connection.dialect === 'sqlite') {
    const statement = connection.sqlite.prepare(`${into}(${columns.map(() => '?').join(', ')})`)
    for (const row of rows) statement.run(bind(row))
    return
  }
  // Several rows per statement, well inside PostgreSQL's 65,535 parameters.
  const perStatement = Math.max(1, Math.floor(30_000 / columns.length))
  for (let start = 0; start < rows.length; start += perStatement) {
    const slice = rows.slice(start, start + perStatement)
    const values: unknown[] = []
    const tuples = slice.map(row => {
      const first = values.length
      values.push(...bind(row))
      return `(${columns.map((_, i) => `$${first + i + 1}`).join(', ')})`
    })
    await connection.client.query(into + tuples.join(', '), values)
  }
}

/** Sets a self-referencing column (a user's manager) once every row of its table is in. */
export async function setReferences (connection: Connection, table: string, column: string, pairs: Array<[string, string]>): Promise<void> {
  const text = `update ${quoted(table)} set ${quoted(column)} = $1 where id = $2`
  if (connection.dialect === 'sqlite') {
    const statement = connection.sqlite.prepare(text.replace('$1', '?').replace('$2', '?'))
    for (const [id, reference] of pairs) statement.run(reference, id)
    return
  }
  for (const [id, reference] of pairs) await connection.client.query(text, [reference, id])
}

/** Names of the tables of the list that hold at least one row. */
export async function tablesWithRows (connection: Connection, tables: PresentTable[]): Promise<string[]> {
  const found: string[] = []
  for (const { table } of tables) {
    const text = `select 1 from ${quoted(table.name)} limit 1`
    const any = connection.dialect === 'sqlite'
      ? connection.sqlite.prepare(text).get() !== undefined
      : (await connection.client.query(text)).rows.length > 0
    if (any) found.push(table.name)
  }
  return found
}

export async function execute (connection: Connection, text: string): Promise<void> {
  if (connection.dialect === 'sqlite') connection.sqlite.exec(text)
  else await connection.client.query(text)
}
