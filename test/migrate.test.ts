import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, it } from 'node:test'
import { sql } from 'kysely'
import pg from 'pg'
import { buildApp } from '../src/app.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import { createDb, isPostgres, type Db } from '../src/db/database.ts'
import { MIGRATION_NAMES, migrateTo, migrateToLatest } from '../src/db/migrate.ts'
import { auth, dialects, dropSchema, uniqueName } from './helpers.ts'

const postgres = dialects().find(d => d.name === 'postgres')

describe('migrations on a PostgreSQL database shared with others', () => {
  it('succeed while other clients create and drop schemas of their own (the migrator reads only its own schema)', { skip: postgres === undefined ? 'TEST_DATABASE_URL is not set' : false, timeout: 120_000 }, async () => {
    const url = postgres!.url!
    const churning = { stop: false }
    // Two neighbours, each making and dropping a schema with a table as fast as they can.
    const neighbour = async (): Promise<void> => {
      const client = new pg.Client({ connectionString: url })
      await client.connect()
      try {
        while (!churning.stop) {
          const schema = `gh_neighbour_${randomBytes(6).toString('hex')}`
          await client.query(`create schema "${schema}"`)
          await client.query(`create table "${schema}".t (id serial primary key, a text, b text)`)
          await client.query(`drop schema "${schema}" cascade`)
        }
      } finally {
        await client.end()
      }
    }
    const neighbours = [neighbour(), neighbour()]
    const failures: string[] = []
    const admin = new pg.Client({ connectionString: url })
    await admin.connect()
    try {
      // Before the migrator was limited to its own schema, about six in ten of these failed (3F000).
      for (let i = 0; i < 12; i++) {
        const schema = `gh_test_${randomBytes(6).toString('hex')}`
        const db = createDb(defaultConfig({ databaseUrl: url, databaseSchema: schema }))
        try {
          const applied = await migrateToLatest(db, schema)
          assert.ok(applied.length > 0, 'a fresh schema gets every migration')
        } catch (error) {
          failures.push(`${(error as { code?: string }).code ?? ''} ${(error as Error).message}`)
        } finally {
          await db.destroy()
          await admin.query(`drop schema if exists "${schema}" cascade`)
        }
      }
    } finally {
      churning.stop = true
      await Promise.all(neighbours)
      await admin.end()
    }
    assert.deepEqual(failures, [])
  })
})

/**
 * Everything of the schema that a migration makes, as comparable text:
 * tables with their columns (by name: a `down` that adds a column back adds
 * it last), indexes, triggers, views; on PostgreSQL also constraints,
 * functions, sequences and extended statistics. The migrator's own tables,
 * and what SQLite makes for them (their automatic indexes), are left out: they
 * outlive the last `down`, and the first snapshot is taken before they exist.
 */
async function schemaOf (db: Db, schema: string | undefined): Promise<string[]> {
  if (!isPostgres(db)) {
    const objects = await sql<{ type: string, name: string, tbl_name: string, sql: string | null }>`
      select type, name, tbl_name, sql from sqlite_master where tbl_name not like 'kysely_migration%' order by type, name`.execute(db)
    const described: string[] = []
    for (const object of objects.rows) {
      if (object.type !== 'table') {
        described.push(`${object.type} ${object.name} on ${object.tbl_name}: ${object.sql ?? '(automatic)'}`)
        continue
      }
      const columns = await sql<Record<string, unknown>>`select name, type, "notnull", dflt_value, pk, hidden from pragma_table_xinfo(${object.name}) order by name`.execute(db)
      const keys = await sql<Record<string, unknown>>`select "table", "from", "to", on_update, on_delete from pragma_foreign_key_list(${object.name}) order by "from"`.execute(db)
      const virtual = object.sql?.toLowerCase().startsWith('create virtual table') === true ? ` ${object.sql}` : ''
      described.push(`table ${object.name}${virtual}: ${JSON.stringify(columns.rows)} references ${JSON.stringify(keys.rows)}`)
    }
    return described
  }
  const own = schema!
  const rows = await sql<{ line: string }>`
    select 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || udt_name || ' null:' || is_nullable
      || ' default:' || coalesce(column_default, '-') || ' generated:' || coalesce(generation_expression, '-') as line
      from information_schema.columns where table_schema = ${own} and table_name not like 'kysely_migration%'
    union all
    select 'index ' || indexname || ': ' || indexdef from pg_indexes where schemaname = ${own} and tablename not like 'kysely_migration%'
    union all
    select 'constraint ' || c.conrelid::regclass::text || ' ' || c.conname || ': ' || pg_get_constraintdef(c.oid)
      from pg_constraint c join pg_namespace n on n.oid = c.connamespace
      where n.nspname = ${own} and c.conrelid::regclass::text not like '%kysely_migration%'
    union all
    select 'trigger ' || t.tgname || ': ' || pg_get_triggerdef(t.oid)
      from pg_trigger t join pg_class r on r.oid = t.tgrelid join pg_namespace n on n.oid = r.relnamespace
      where n.nspname = ${own} and not t.tgisinternal
    union all
    select 'function ' || p.proname || ': ' || pg_get_functiondef(p.oid)
      from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = ${own}
    union all
    select 'relation ' || r.relname || ' kind ' || r.relkind::text
      from pg_class r join pg_namespace n on n.oid = r.relnamespace
      where n.nspname = ${own} and r.relkind in ('S', 'v', 'm', 'c') and r.relname not like 'kysely_migration%'
    union all
    select 'view ' || viewname || ': ' || definition from pg_views where schemaname = ${own}
    union all
    select 'statistics ' || s.stxname || ': ' || pg_get_statisticsobjdef(s.oid)
      from pg_statistic_ext s join pg_namespace n on n.oid = s.stxnamespace where n.nspname = ${own}
    union all
    select 'type ' || t.typname from pg_type t join pg_namespace n on n.oid = t.typnamespace
      where n.nspname = ${own} and t.typtype in ('e', 'd')
    order by 1`.execute(db)
  return rows.rows.map(row => row.line)
}

/** A user in a group with an API key, made through the API, so that every `down` meets rows and not only tables. */
async function addData (db: Db, config: Config): Promise<void> {
  const app = await buildApp({ config, db, logger: false })
  try {
    const { generatedKey } = await bootstrap(app.db, app.passwords, config, app.log)
    await app.ready()
    const headers = auth(generatedKey!)
    const group = await app.inject({ method: 'POST', url: '/auth/api/groups', headers, payload: { display_name: uniqueName('group') } })
    assert.equal(group.statusCode, 201, group.body)
    const user = await app.inject({ method: 'POST', url: '/auth/api/users', headers, payload: { username: uniqueName('rolled'), email: 'rolled@example.com', groups: [group.json().display_name] } })
    assert.equal(user.statusCode, 201, user.body)
    const key = await app.inject({ method: 'POST', url: '/auth/api/api-keys', headers, payload: { name: 'rolled back', scopes: ['users:read'] } })
    assert.equal(key.statusCode, 201, key.body)
  } finally {
    await app.close()
  }
}

for (const dialect of dialects()) {
  describe(`every migration's down on ${dialect.name}`, () => {
    it('undoes its up exactly, newest first down to an empty schema, with rows in the tables, and the migrations then apply again', { timeout: 120_000 }, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'gatehouse-migrate-'))
      const schema = dialect.url !== undefined ? `gh_test_${randomBytes(6).toString('hex')}` : undefined
      const config = defaultConfig({ databaseUrl: dialect.url ?? `sqlite:${join(dir, 'down.db')}`, databaseSchema: schema, logLevel: 'silent' })
      const db = createDb(config)
      try {
        // After each migration on the way up, what the schema is; the way down must pass through the same states.
        const states = [await schemaOf(db, schema)]
        for (const name of MIGRATION_NAMES) {
          assert.deepEqual(await migrateTo(db, name, schema), [name])
          states.push(await schemaOf(db, schema))
        }
        assert.equal(states[0]!.length, 0, 'before the first migration the schema holds nothing')
        await addData(db, config)
        assert.deepEqual(await schemaOf(db, schema), states.at(-1), 'the app adds no schema of its own')
        for (let i = MIGRATION_NAMES.length - 1; i >= 0; i--) {
          assert.deepEqual(await migrateTo(db, i === 0 ? null : MIGRATION_NAMES[i - 1]!, schema), [MIGRATION_NAMES[i]])
          assert.deepEqual(await schemaOf(db, schema), states[i], `${MIGRATION_NAMES[i]}'s down leaves the schema as it was before its up`)
        }
        assert.deepEqual(await migrateToLatest(db, schema), MIGRATION_NAMES)
        assert.deepEqual(await schemaOf(db, schema), states.at(-1))
      } finally {
        await db.destroy()
        if (dialect.url !== undefined) await dropSchema(dialect.url, schema!)
        rmSync(dir, { recursive: true, force: true })
      }
    })
  })
}
