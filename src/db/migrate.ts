import { Migrator, NO_MIGRATIONS, sql, type DatabaseIntrospector, type Migration, type MigrationResultSet } from 'kysely'
import { isPostgres, type Db } from './database.ts'
import * as m0001 from './migrations/0001_init.ts'
import * as m0002 from './migrations/0002_sessions.ts'
import * as m0003 from './migrations/0003_sign_in_addresses.ts'
import * as m0004 from './migrations/0004_mfa.ts'
import * as m0005 from './migrations/0005_webhooks.ts'
import * as m0006 from './migrations/0006_sso.ts'
import * as m0007 from './migrations/0007_credential_notify.ts'
import * as m0008 from './migrations/0008_reauthentication.ts'
import * as m0009 from './migrations/0009_events_occurred_at.ts'
import * as m0010 from './migrations/0010_idempotency_keys.ts'
import * as m0011 from './migrations/0011_session_details.ts'
import * as m0012 from './migrations/0012_groups.ts'
import * as m0013 from './migrations/0013_scim.ts'
import * as m0014 from './migrations/0014_mail.ts'
import * as m0015 from './migrations/0015_account_tokens.ts'
import * as m0016 from './migrations/0016_user_search.ts'
import * as m0017 from './migrations/0017_scim_enterprise.ts'
import * as m0018 from './migrations/0018_group_member_order.ts'
import * as m0019 from './migrations/0019_users_page_stamp.ts'
import * as m0020 from './migrations/0020_sign_in_quiet_notify.ts'
import * as m0021 from './migrations/0021_user_json.ts'
import * as m0022 from './migrations/0022_user_search_trigram_statistics.ts'
import * as m0023 from './migrations/0023_user_json_column.ts'
import * as m0024 from './migrations/0024_user_json_sqlite_column.ts'
import * as m0025 from './migrations/0025_group_name_key.ts'
import * as m0026 from './migrations/0026_login_throttle_windows.ts'
import * as m0027 from './migrations/0027_event_trace.ts'
import * as m0028 from './migrations/0028_drop_user_json.ts'

/**
 * What a migration does to what the running release reads and writes. An
 * `expand` migration only adds: tables, columns that are nullable or have a
 * default, indexes, triggers. The previous release's reads and writes work on
 * the migrated schema, so it can run while instances of that release serve
 * (docs/operations.md, Upgrades). A `contract` migration drops or renames,
 * or adds what an earlier release's writes do not fill (a NOT NULL column
 * without a default); it ships in a release after the last one that reads or
 * writes what it changes, so every instance that may still run is past it.
 * test/migration-phases.test.ts checks each `expand` against the schema, and
 * test/rolling-upgrade.test.ts runs the previous release on the migrated one.
 */
export type MigrationPhase = 'expand' | 'contract'

type PhasedMigration = Migration & { phase: MigrationPhase }

// Listed here rather than read from a folder, so a bundled or compiled build carries them.
const migrations: Record<string, PhasedMigration> = {
  '0001_init': m0001,
  '0002_sessions': m0002,
  '0003_sign_in_addresses': m0003,
  '0004_mfa': m0004,
  '0005_webhooks': m0005,
  '0006_sso': m0006,
  '0007_credential_notify': m0007,
  '0008_reauthentication': m0008,
  '0009_events_occurred_at': m0009,
  '0010_idempotency_keys': m0010,
  '0011_session_details': m0011,
  '0012_groups': m0012,
  '0013_scim': m0013,
  '0014_mail': m0014,
  '0015_account_tokens': m0015,
  '0016_user_search': m0016,
  '0017_scim_enterprise': m0017,
  '0018_group_member_order': m0018,
  '0019_users_page_stamp': m0019,
  '0020_sign_in_quiet_notify': m0020,
  '0021_user_json': m0021,
  '0022_user_search_trigram_statistics': m0022,
  '0023_user_json_column': m0023,
  '0024_user_json_sqlite_column': m0024,
  '0025_group_name_key': m0025,
  '0026_login_throttle_windows': m0026,
  '0027_event_trace': m0027,
  '0028_drop_user_json': m0028
}

/** This release's migrations, oldest first. */
export const MIGRATION_NAMES: readonly string[] = Object.keys(migrations)

/** Whether the migration named expands or contracts the schema. */
export function migrationPhase (name: string): MigrationPhase {
  const migration = migrations[name]
  if (migration === undefined) throw new Error(`no migration is named ${name}`)
  return migration.phase
}

/**
 * Brings the schema up to date. Safe to run from several instances at once:
 * Kysely's migrator takes an advisory lock on PostgreSQL. Each migration is
 * applied in a transaction of its own (one `migrateUp` at a time), so a
 * migration's locks are held for that migration only, not until the last
 * pending one commits: the running release's requests wait at most for one
 * (issue 40: all pending in one transaction kept `users` locked for 186 s).
 */
export async function migrateToLatest (db: Db, schema?: string): Promise<string[]> {
  if ((await schemaState(db, schema)).pending.length === 0) return []
  await createSchema(db, schema)
  const migrator = migratorOf(db, schema)
  const applied: string[] = []
  for (;;) {
    const step = succeeded(await migrator.migrateUp())
    if (step.length === 0) return applied
    applied.push(...step)
  }
}

/** Where a database stands against this release's migrations. */
export interface SchemaState {
  /** This release's migrations the database has not run, oldest first. */
  pending: string[]
  /**
   * Migrations the database has run that this release does not know: a newer
   * release migrated it (the first step of a rolling upgrade). Within a release
   * migrations only add, so this release still reads and writes it.
   */
  newer: string[]
}

/**
 * What `serve` does with the schema at start. `migrate` (MIGRATE_ON_START,
 * default true) runs the pending migrations, one instance at a time under the
 * migrator's lock; false refuses a database that is behind, so that only the
 * deployment's `gatehouse migrate` job changes the schema.
 */
export async function prepareSchemaAtStart (db: Db, schema: string | undefined, options: { migrate: boolean, log: { info: (o: object, msg: string) => void } }): Promise<void> {
  const state = await schemaState(db, schema)
  if (state.newer.length > 0 && state.pending.length === 0) {
    options.log.info({ newer: state.newer }, `the database has ${state.newer.length} migration(s) of a newer release (${state.newer.join(', ')}); this release serves on it`)
  }
  if (state.pending.length === 0) return
  if (!options.migrate) throw new SchemaBehindError(state.pending)
  const applied = await migrateToLatest(db, schema)
  if (applied.length > 0) options.log.info({ applied }, `applied ${applied.length} migration(s)`)
}

/** MIGRATE_ON_START=false met a database that is behind this release. */
export class SchemaBehindError extends Error {
  constructor (pending: string[]) {
    super(`the database is behind this release: ${pending.length} migration(s) to run (${pending.join(', ')}), and MIGRATE_ON_START=false; ` +
      'run `gatehouse migrate` with this DATABASE_URL (and DATABASE_SCHEMA) first, then start again')
    this.name = 'SchemaBehindError'
  }
}

/**
 * Brings the schema to where migration `target` left it, applying or undoing
 * (newest first) the migrations in between; `null` undoes all of them. Returns
 * the names of the migrations run, in the order they ran. Every `down` is
 * exercised through this by test/migrate.test.ts.
 */
export async function migrateTo (db: Db, target: string | null, schema?: string): Promise<string[]> {
  if (target !== null && !(target in migrations)) throw new Error(`no migration is named ${target}`)
  await createSchema(db, schema)
  return succeeded(await migratorOf(db, schema).migrateTo(target ?? NO_MIGRATIONS))
}

async function createSchema (db: Db, schema: string | undefined): Promise<void> {
  if (schema === undefined || !isPostgres(db)) return
  try {
    await sql`create schema if not exists ${sql.id(schema)}`.execute(db)
  } catch (error) {
    // Two instances creating it at the same moment: PostgreSQL fails the
    // loser with a duplicate key despite `if not exists` (as Kysely's
    // migrator, which does the same for its own tables, notes).
    const made = await sql<{ found: number }>`select 1 as found from pg_namespace where nspname = ${schema}`.execute(db)
    if (made.rows.length === 0) throw error
  }
}

/**
 * As migrateTo, on a handle whose one connection is already inside a
 * transaction that the caller commits or rolls back: the migrator opens none
 * of its own. gatehouse restore runs the migrations and loads the rows in one
 * PostgreSQL transaction, so a restore that fails leaves nothing behind.
 */
export async function migrateToInTransaction (db: Db, target: string, schema?: string): Promise<string[]> {
  if (!(target in migrations)) throw new Error(`no migration is named ${target}`)
  await createSchema(db, schema)
  return succeeded(await migratorOf(db, schema, { disableTransactions: true }).migrateTo(target))
}

function migratorOf (db: Db, schema: string | undefined, options: { disableTransactions?: boolean } = {}): Migrator {
  return new Migrator({
    ...options,
    db: isPostgres(db) ? withSchemaIntrospection(db, schema) : db,
    provider: { getMigrations: async () => migrations },
    // Without this the migrator finds its bookkeeping tables in any schema and skips creating them in ours.
    ...(schema !== undefined && isPostgres(db) ? { migrationTableSchema: schema } : {})
  })
}

function succeeded ({ error, results }: MigrationResultSet): string[] {
  if (error !== undefined) throw error
  return (results ?? []).filter(r => r.status === 'Success').map(r => r.migrationName)
}

/**
 * The schema's state, read in one query. Most starts find nothing pending,
 * and the migrator's own path there (its tables, its lock, on PostgreSQL a
 * transaction) cost a PostgreSQL start 66 ms against 31 ms for this query
 * (its first connection included). Another instance's migration in progress
 * is not visible until it commits, so this says pending and the migrator
 * waits on its lock.
 */
export async function schemaState (db: Db, schema: string | undefined): Promise<SchemaState> {
  const table = schema !== undefined && isPostgres(db) ? sql.table(`${schema}.kysely_migration`) : sql.table('kysely_migration')
  let applied: string[]
  try {
    applied = (await sql<{ name: string }>`select name from ${table}`.execute(db)).rows.map(row => row.name)
  } catch {
    // No such table: a new database, which the migrator sets up.
    return { pending: [...MIGRATION_NAMES], newer: [] }
  }
  const ran = new Set(applied)
  return { pending: MIGRATION_NAMES.filter(name => !ran.has(name)), newer: applied.filter(name => !(name in migrations)).sort() }
}

/**
 * On PostgreSQL, the migrator looks for its bookkeeping tables in our schema
 * only. Kysely's own introspection reads every table of every schema in the
 * database for that (kysely-org/kysely#1419, #1537), and fails the migration
 * when a schema is dropped meanwhile by someone else (3F000 "schema … does not
 * exist") or is one this role may not use. Reproduced beside two clients
 * creating and dropping schemas: 40 of 64 migrations failed; with this, none
 * (test/migrate.test.ts). The migrator reads nothing but the names.
 */
function withSchemaIntrospection (db: Db, schema: string | undefined): Db {
  const ours = schema !== undefined ? sql`${schema}` : sql`current_schema()`
  const introspection: DatabaseIntrospector = {
    async getSchemas () {
      const { rows } = await sql<{ name: string }>`select nspname as name from pg_catalog.pg_namespace where nspname = ${ours}`.execute(db)
      return rows
    },
    async getTables () {
      const { rows } = await sql<{ name: string, schema: string }>`
        select table_name as name, table_schema as schema from information_schema.tables where table_schema = ${ours}`.execute(db)
      return rows.map(row => ({ ...row, isView: false, columns: [] }))
    },
    async getMetadata () {
      return { tables: await this.getTables() }
    }
  }
  // Everything else is the handle itself (its methods bound to it: Kysely keeps its state in private fields).
  return new Proxy(db, {
    get: (target, property) => {
      if (property === 'introspection') return introspection
      const value: unknown = Reflect.get(target, property, target)
      return typeof value === 'function' ? value.bind(target) : value
    }
  })
}
