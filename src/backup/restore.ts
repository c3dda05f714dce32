import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { open, rename, rm } from 'node:fs/promises'
import { basename, dirname, join } from 'node:path'
import { Kysely, PostgresDialect, type PostgresPool } from 'kysely'
import type pg from 'pg'
import type { Config } from '../config.ts'
import { createDb, type Database, type Db } from '../db/database.ts'
import { MIGRATION_NAMES, migrateTo, migrateToInTransaction } from '../db/migrate.ts'
import {
  BackupDatabaseError, closeConnection, describe, execute, insertRows, openPgConnection, openSqliteConnection, readRows,
  setReferences, tablesWithRows, type Connection, type PresentTable
} from './backup-database.ts'
import { readBackup, TableDigest, type BackupFooter, type BackupHeader, type BackupItem, type TableSummary } from './backup-file.ts'
import { checkMigrations, targetOf } from './backup.ts'

export interface RestoreReport {
  file: string
  /** Where it went: the SQLite file, or PostgreSQL's schema. */
  into: string
  from_dialect: 'sqlite' | 'postgres'
  migration: string
  /** Migrations run after the rows were in, when the backup is from an earlier release. */
  upgraded: string[]
  tables: Record<string, TableSummary>
}

type Items = AsyncGenerator<BackupItem, BackupFooter>

/**
 * Loads the rows of the file into the connection's open transaction, in the
 * file's table order (foreign keys point backwards), then reads every table
 * back and compares count and checksum with the file: what the database
 * holds is what was backed up, whichever database wrote the file.
 */
async function loadRows (connection: Connection, header: BackupHeader, items: Items): Promise<Record<string, TableSummary>> {
  const { tables } = await describe(connection)
  const present = new Map(tables.map(t => [t.table.name, t]))
  const targets = new Map<string, PresentTable>()
  for (const { name, columns } of header.tables) {
    const table = present.get(name)
    const names = columns.map(([column]) => column)
    if (table === undefined || table.columns.join() !== names.join()) throw new BackupDatabaseError(`the restored schema's table ${name} does not have the backup's columns`)
    targets.set(name, table)
  }
  const references: Array<{ table: string, column: string, pairs: Array<[string, string]> }> = []
  let footer: BackupFooter
  for (;;) {
    const next = await items.next()
    if (next.done === true) {
      footer = next.value
      break
    }
    const item = next.value
    if (item.type !== 'rows') continue
    const target = targets.get(item.table)!
    let rows = item.rows
    for (const column of target.table.selfReferences ?? []) {
      const at = target.columns.indexOf(column)
      const id = target.columns.indexOf('id')
      if (at === -1) continue
      let entry = references.find(r => r.table === item.table && r.column === column)
      if (entry === undefined) references.push(entry = { table: item.table, column, pairs: [] })
      const pairs = entry.pairs
      rows = rows.map(row => {
        if (row[at] === null) return row
        pairs.push([row[id] as string, row[at] as string])
        const copy = row.slice()
        copy[at] = null
        return copy
      })
    }
    await insertRows(connection, target, rows)
  }
  for (const { table, column, pairs } of references) await setReferences(connection, table, column, pairs)
  for (const [name, target] of targets) {
    const digest = new TableDigest(target.kinds)
    for await (const batch of readRows(connection, target)) for (const row of batch) digest.add(row)
    const read = digest.summary()
    const expected = footer.tables[name]!
    if (read.rows !== expected.rows || read.sha256 !== expected.sha256) {
      throw new BackupDatabaseError(`table ${name} read back differs from the backup (${read.rows} rows against ${expected.rows}): nothing was restored`)
    }
  }
  return footer.tables
}

function refuseNonEmpty (withRows: string[], where: string): never {
  throw new BackupDatabaseError(`${where} is not empty (rows in ${withRows.join(', ')}); restore into an empty database, or pass --force to replace everything gatehouse keeps there`)
}

/** A Kysely handle whose every statement runs on `client`, inside the transaction the caller opened on it. */
function kyselyOn (client: pg.Client): Db {
  const pool = {
    connect: async () => ({ query: client.query.bind(client), release: () => {} }),
    end: async () => {}
  } as unknown as PostgresPool
  return new Kysely<Database>({ dialect: new PostgresDialect({ pool }) })
}

/**
 * PostgreSQL: one transaction does it all (the schema's migrations, gatehouse's
 * tables emptied under --force, every row, the read-back), so a failure
 * anywhere leaves the schema as it was, and no instance sees a part of it.
 */
async function restorePostgres (url: string, schema: string | undefined, header: BackupHeader, items: Items, force: boolean): Promise<{ tables: Record<string, TableSummary>, upgraded: string[] }> {
  const connection = await openPgConnection(url, schema)
  if (connection.dialect !== 'postgres') throw new Error('unreachable')
  const where = `the PostgreSQL schema ${schema ?? 'public'}`
  try {
    await execute(connection, 'begin')
    const { migrations, tables } = await describe(connection)
    if (migrations !== null) {
      checkMigrations(migrations, where)
      const withRows = await tablesWithRows(connection, tables)
      if (withRows.length > 0) {
        if (!force) refuseNonEmpty(withRows, where)
        // Only gatehouse's own tables: whatever else shares the schema is left alone.
        await execute(connection, `truncate ${tables.map(t => `"${t.table.name}"`).join(', ')}`)
      }
    }
    const db = kyselyOn(connection.client)
    await migrateToInTransaction(db, header.migrations.at(-1)!, schema)
    const restored = await loadRows(connection, header, items)
    const latest = MIGRATION_NAMES.at(-1)!
    const upgraded = header.migrations.at(-1) === latest ? [] : await migrateToInTransaction(db, latest, schema)
    await execute(connection, 'commit')
    return { tables: restored, upgraded }
  } catch (error) {
    await execute(connection, 'rollback').catch(() => {})
    throw error
  } finally {
    await closeConnection(connection)
  }
}

async function sqliteRowsAt (path: string): Promise<string[] | 'not a database'> {
  if (!existsSync(path)) return []
  let connection: Connection | undefined
  try {
    connection = openSqliteConnection(path, { mustExist: true })
    const { migrations, tables } = await describe(connection)
    if (migrations !== null) checkMigrations(migrations, path)
    return await tablesWithRows(connection, tables)
  } catch (error) {
    if (error instanceof BackupDatabaseError) throw error
    return 'not a database'
  } finally {
    if (connection !== undefined) await closeConnection(connection)
  }
}

async function syncFile (path: string): Promise<void> {
  const handle = await open(path, 'r')
  try { await handle.sync() } finally { await handle.close() }
}

/**
 * SQLite: the database is built in a new file beside the target (migrated,
 * loaded in one transaction, read back, integrity-checked), and renamed over
 * the target only once complete: the target is the old file or the whole new
 * one, never a part.
 */
async function restoreSqlite (path: string, header: BackupHeader, items: Items, force: boolean): Promise<{ tables: Record<string, TableSummary>, upgraded: string[] }> {
  const existing = await sqliteRowsAt(path)
  if (existing === 'not a database' && !force) throw new BackupDatabaseError(`${path} exists and is not a gatehouse database; pass --force to replace it`)
  if (Array.isArray(existing) && existing.length > 0 && !force) refuseNonEmpty(existing, path)
  const building = join(dirname(path), `.${basename(path)}.restore-${randomBytes(4).toString('hex')}`)
  const remove = async (): Promise<void> => { for (const suffix of ['', '-wal', '-shm']) await rm(building + suffix, { force: true }) }
  try {
    const migrated = createDb({ databaseUrl: `sqlite:${building}`, databaseSchema: undefined, databasePoolSize: 1, databaseStatementTimeoutMs: 10_000, databaseQueryTimeoutMs: 10_000, databaseAcquireTimeoutMs: 10_000 })
    try { await migrateTo(migrated, header.migrations.at(-1)!) } finally { await migrated.destroy() }
    const connection = openSqliteConnection(building, { mustExist: true })
    if (connection.dialect !== 'sqlite') throw new Error('unreachable')
    let tables: Record<string, TableSummary>
    try {
      execute(connection, 'begin')
      tables = await loadRows(connection, header, items)
      execute(connection, 'commit')
    } catch (error) {
      if (connection.sqlite.inTransaction) execute(connection, 'rollback')
      throw error
    } finally {
      await closeConnection(connection)
    }
    let upgraded: string[] = []
    if (header.migrations.at(-1) !== MIGRATION_NAMES.at(-1)) {
      const upgrading = createDb({ databaseUrl: `sqlite:${building}`, databaseSchema: undefined, databasePoolSize: 1, databaseStatementTimeoutMs: 10_000, databaseQueryTimeoutMs: 10_000, databaseAcquireTimeoutMs: 10_000 })
      try { upgraded = await migrateTo(upgrading, MIGRATION_NAMES.at(-1)!) } finally { await upgrading.destroy() }
    }
    const check = openSqliteConnection(building, { mustExist: true })
    if (check.dialect !== 'sqlite') throw new Error('unreachable')
    try {
      const integrity = check.sqlite.pragma('integrity_check', { simple: true })
      if (integrity !== 'ok') throw new BackupDatabaseError(`the restored database fails SQLite's integrity check: ${String(integrity)}`)
      const orphans = check.sqlite.pragma('foreign_key_check') as unknown[]
      if (orphans.length > 0) throw new BackupDatabaseError(`the restored database has ${orphans.length} rows whose foreign keys point nowhere`)
      // One file, no WAL beside it, for the rename; the service turns WAL on again when it opens it.
      check.sqlite.pragma('journal_mode = DELETE')
    } finally {
      check.sqlite.close()
    }
    await syncFile(building)
    // A WAL left by the old file would be replayed into the new one.
    for (const suffix of ['-wal', '-shm']) await rm(path + suffix, { force: true })
    await rename(building, path)
    await syncFile(dirname(path))
    return { tables, upgraded }
  } catch (error) {
    await remove()
    throw error
  }
}

/** `gatehouse restore FILE`: into DATABASE_URL, empty unless `force`. */
export async function restoreBackup (config: Pick<Config, 'databaseUrl' | 'databaseSchema'>, file: string, options: { force: boolean }): Promise<RestoreReport> {
  const target = targetOf(config)
  const items = readBackup(file)
  const first = await items.next()
  if (first.done === true || first.value.type !== 'header') throw new BackupDatabaseError(`${file} has no header`)
  const header = first.value.header
  checkMigrations(header.migrations, file)
  const done = target.dialect === 'sqlite'
    ? await restoreSqlite(target.path, header, items, options.force)
    : await restorePostgres(target.url, target.schema, header, items, options.force)
  return {
    file,
    into: target.dialect === 'sqlite' ? target.path : `PostgreSQL schema ${target.schema ?? 'public'}`,
    from_dialect: header.dialect,
    migration: header.migrations.at(-1)!,
    upgraded: done.upgraded,
    tables: done.tables
  }
}
