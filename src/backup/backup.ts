import type { Config } from '../config.ts'
import { MIGRATION_NAMES } from '../db/migrate.ts'
import { RELEASE } from '../system/release.ts'
import {
  BackupDatabaseError, closeConnection, describe, execute, openPgConnection, openSqliteConnection, readRows, type Connection
} from './backup-database.ts'
import { BACKUP_FORMAT, BACKUP_FORMAT_VERSION, BackupFileError, BackupWriter, readBackup, type BackupHeader, type TableSummary } from './backup-file.ts'

export interface BackupReport {
  file: string
  dialect: 'sqlite' | 'postgres'
  gatehouse: string
  migration: string
  snapshot_at: string
  bytes: number
  tables: Record<string, TableSummary>
}

/** A database of DATABASE_URL, for backup and restore: a SQLite path, or PostgreSQL and its schema. */
export type Target = { dialect: 'sqlite', path: string } | { dialect: 'postgres', url: string, schema: string | undefined }

export function targetOf (config: Pick<Config, 'databaseUrl' | 'databaseSchema'>): Target {
  if (config.databaseUrl.startsWith('sqlite:')) {
    const path = config.databaseUrl.slice('sqlite:'.length)
    if (path === '' || path === ':memory:') throw new BackupDatabaseError('DATABASE_URL is an in-memory SQLite database: there is nothing to back up or restore into')
    return { dialect: 'sqlite', path }
  }
  return { dialect: 'postgres', url: config.databaseUrl, schema: config.databaseSchema }
}

/**
 * The migrations of a database or backup, refused when they are not the
 * first ones of this release's list: rows of a newer schema would not fit.
 */
export function checkMigrations (migrations: string[], what: string): void {
  const unknown = migrations.filter(name => !MIGRATION_NAMES.includes(name))
  if (unknown.length > 0) {
    throw new BackupDatabaseError(`${what} has migrations this gatehouse (${RELEASE}) does not know: ${unknown.join(', ')}; use the release that ran them, or a later one`)
  }
  if (migrations.some((name, i) => MIGRATION_NAMES[i] !== name)) throw new BackupDatabaseError(`${what} has skipped migrations: ${migrations.join(', ')}`)
}

/**
 * Opens one read snapshot: every table is read as it stood at one instant,
 * while the service goes on writing. SQLite: a read transaction on a
 * connection of its own (in WAL mode, writers do not wait for it and it sees
 * none of their later commits). PostgreSQL: one REPEATABLE READ READ ONLY
 * transaction, which sees the database as of its first statement.
 */
async function openSnapshot (target: Target): Promise<Connection> {
  if (target.dialect === 'sqlite') {
    let connection: Connection
    try {
      connection = openSqliteConnection(target.path, { mustExist: true })
    } catch (error) {
      throw new BackupDatabaseError(`cannot open the SQLite database ${target.path}: ${(error as Error).message}`)
    }
    // BEGIN alone takes no snapshot; the first read does.
    if (connection.dialect === 'sqlite') {
      connection.sqlite.exec('begin')
      connection.sqlite.prepare('select count(*) from sqlite_master').get()
    }
    return connection
  }
  const connection = await openPgConnection(target.url, target.schema)
  await execute(connection, 'begin isolation level repeatable read read only')
  return connection
}

/** `gatehouse backup FILE`: one snapshot of every table of the list, written to FILE. */
export async function takeBackup (config: Pick<Config, 'databaseUrl' | 'databaseSchema'>, file: string): Promise<BackupReport> {
  const target = targetOf(config)
  const connection = await openSnapshot(target)
  let writer: BackupWriter | undefined
  try {
    const snapshotAt = new Date().toISOString()
    const { migrations, tables } = await describe(connection)
    if (migrations === null) throw new BackupDatabaseError(`DATABASE_URL holds no gatehouse database${target.dialect === 'postgres' ? ` (schema ${target.schema ?? 'public'})` : ''}`)
    checkMigrations(migrations, 'the database')
    writer = await BackupWriter.create(file)
    const header: BackupHeader = {
      format: BACKUP_FORMAT,
      format_version: BACKUP_FORMAT_VERSION,
      gatehouse: RELEASE,
      dialect: target.dialect,
      migrations,
      snapshot_at: snapshotAt,
      tables: tables.map(t => ({ name: t.table.name, columns: t.columns.map((c, i) => [c, t.kinds[i]!]) }))
    }
    await writer.header(header)
    for (const present of tables) {
      await writer.startTable(present.table.name, present.kinds)
      for await (const batch of readRows(connection, present)) await writer.rows(batch)
      await writer.endTable()
    }
    await execute(connection, 'rollback')
    const { bytes, tables: summaries } = await writer.finish()
    return { file, dialect: target.dialect, gatehouse: RELEASE, migration: migrations.at(-1)!, snapshot_at: snapshotAt, bytes, tables: summaries }
  } catch (error) {
    await writer?.abandon()
    throw error
  } finally {
    await closeConnection(connection)
  }
}

/** `gatehouse backup --verify FILE`: reads the whole file and checks every count and checksum; throws BackupFileError if any is wrong. */
export async function verifyBackup (file: string): Promise<Omit<BackupReport, 'bytes'> & { bytes: number }> {
  const items = readBackup(file)
  let header: BackupHeader | undefined
  for (;;) {
    const next = await items.next()
    if (next.done === true) {
      const { stat } = await import('node:fs/promises')
      if (header === undefined) throw new BackupFileError(`${file} has no header`)
      checkMigrations(header.migrations, file)
      return {
        file,
        dialect: header.dialect,
        gatehouse: header.gatehouse,
        migration: header.migrations.at(-1)!,
        snapshot_at: header.snapshot_at,
        bytes: (await stat(file)).size,
        tables: next.value.tables
      }
    }
    if (next.value.type === 'header') header = next.value.header
  }
}
