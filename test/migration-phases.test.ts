import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, it } from 'node:test'
import { sql } from 'kysely'
import { defaultConfig } from '../src/config.ts'
import { createDb, isPostgres, type Db } from '../src/db/database.ts'
import { MIGRATION_NAMES, migrationPhase, migrateTo } from '../src/db/migrate.ts'
import { dialects, dropSchema } from './helpers.ts'

interface Column {
  table: string
  column: string
  /** A row written without this column still goes in: it may be null, has a default, or is generated. */
  optional: boolean
}

/** Every column of the schema's own tables (not the migrator's, not SQLite's or a full-text index's internals). */
async function columnsOf (db: Db, schema: string | undefined): Promise<Column[]> {
  if (isPostgres(db)) {
    const { rows } = await sql<{ table: string, column: string, nullable: string, dflt: string | null, generated: string | null, identity: string }>`
      select table_name as table, column_name as column, is_nullable as nullable, column_default as dflt,
             generation_expression as generated, is_identity as identity
        from information_schema.columns c
        join information_schema.tables t using (table_schema, table_name)
       where table_schema = ${schema!} and t.table_type = 'BASE TABLE' and table_name not like 'kysely_migration%'`.execute(db)
    return rows.map(row => ({ table: row.table, column: row.column, optional: row.nullable === 'YES' || row.dflt !== null || row.generated !== null || row.identity === 'YES' }))
  }
  const tables = await sql<{ name: string }>`
    select name from sqlite_master
     where type = 'table' and name not like 'kysely_migration%' and name not like 'sqlite_%'
       and lower(coalesce(sql, '')) not like 'create virtual table%'`.execute(db)
  const virtualTables = await sql<{ name: string }>`select name from sqlite_master where type = 'table' and lower(coalesce(sql, '')) like 'create virtual table%'`.execute(db)
  // A full-text or R-tree index keeps its data in shadow tables named after it (users_search_data, ...).
  const shadow = (name: string): boolean => virtualTables.rows.some(v => name.startsWith(`${v.name}_`))
  const columns: Column[] = []
  for (const { name } of tables.rows.filter(t => !shadow(t.name))) {
    const { rows } = await sql<{ name: string, notnull: number, dflt_value: string | null, pk: number, hidden: number }>`
      select name, "notnull", dflt_value, pk, hidden from pragma_table_xinfo(${name})`.execute(db)
    for (const row of rows) {
      // An INTEGER PRIMARY KEY is the rowid, which SQLite fills in; hidden 2 and 3 are generated columns.
      columns.push({ table: name, column: row.name, optional: row.notnull === 0 || row.dflt_value !== null || row.hidden >= 2 || row.pk === 1 })
    }
  }
  return columns
}

const key = (c: Column): string => `${c.table}.${c.column}`

/**
 * What `migration` did that an instance of the release before it could not
 * bear: a column of its tables gone, or a new one on its tables that its
 * inserts, which do not name it, cannot leave out.
 */
function breakingChanges (before: Column[], after: Column[]): string[] {
  const afterByKey = new Map(after.map(c => [key(c), c]))
  const tablesBefore = new Set(before.map(c => c.table))
  const beforeKeys = new Set(before.map(key))
  const problems: string[] = []
  for (const column of before) {
    if (!afterByKey.has(key(column))) problems.push(`removes ${key(column)}`)
  }
  for (const column of after) {
    if (tablesBefore.has(column.table) && !beforeKeys.has(key(column)) && !column.optional) problems.push(`adds ${key(column)} as NOT NULL without a default`)
  }
  return problems
}

for (const dialect of dialects()) {
  describe(`migration phases on ${dialect.name}`, () => {
    it('every migration marked expand keeps every column an earlier release reads and adds none its inserts must fill', { timeout: 120_000 }, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'gatehouse-phases-'))
      const schema = dialect.url !== undefined ? `gh_test_${randomBytes(6).toString('hex')}` : undefined
      const db = createDb(defaultConfig({ databaseUrl: dialect.url ?? `sqlite:${join(dir, 'phases.db')}`, databaseSchema: schema, logLevel: 'silent' }))
      try {
        const findings: string[] = []
        let before = await columnsOf(db, schema)
        for (const name of MIGRATION_NAMES) {
          await migrateTo(db, name, schema)
          const after = await columnsOf(db, schema)
          if (migrationPhase(name) === 'expand') findings.push(...breakingChanges(before, after).map(problem => `${name} (expand) ${problem}`))
          before = after
        }
        assert.deepEqual(findings, [], 'mark these contract, or make them additive')
      } finally {
        await db.destroy()
        if (dialect.url !== undefined) await dropSchema(dialect.url, schema!)
        rmSync(dir, { recursive: true, force: true })
      }
    })

    it('the check finds a dropped column and a new NOT NULL column without a default, and passes a nullable one', { timeout: 60_000 }, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'gatehouse-phases-'))
      const schema = dialect.url !== undefined ? `gh_test_${randomBytes(6).toString('hex')}` : undefined
      const db = createDb(defaultConfig({ databaseUrl: dialect.url ?? `sqlite:${join(dir, 'phases.db')}`, databaseSchema: schema, logLevel: 'silent' }))
      const table = (name: string): ReturnType<typeof sql.table> => sql.table(schema !== undefined ? `${schema}.${name}` : name)
      try {
        await migrateTo(db, MIGRATION_NAMES[0]!, schema)
        await sql`create table ${table('scratch')} (id text primary key)`.execute(db)
        const before = await columnsOf(db, schema)
        await sql`alter table ${table('users')} drop column email`.execute(db)
        await sql`alter table ${table('users')} add column may_be_left_out text`.execute(db)
        // SQLite adds no NOT NULL column without a default to a table; a migration would rebuild the table.
        if (schema !== undefined) {
          await sql`alter table ${table('scratch')} add column must_be_filled text not null`.execute(db)
        } else {
          await sql`drop table scratch`.execute(db)
          await sql`create table scratch (id text primary key, must_be_filled text not null)`.execute(db)
        }
        assert.deepEqual(breakingChanges(before, await columnsOf(db, schema)).sort(), [
          'adds scratch.must_be_filled as NOT NULL without a default',
          'removes users.email'
        ])
      } finally {
        await db.destroy()
        if (dialect.url !== undefined) await dropSchema(dialect.url, schema!)
        rmSync(dir, { recursive: true, force: true })
      }
    })
  })
}
