import { Migrator, sql, type Migration } from 'kysely'
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

// Listed here rather than read from a folder, so a bundled or compiled build carries them.
const migrations: Record<string, Migration> = {
  '0001_init': m0001,
  '0002_sessions': m0002,
  '0003_sign_in_addresses': m0003,
  '0004_mfa': m0004,
  '0005_webhooks': m0005,
  '0006_sso': m0006,
  '0007_credential_notify': m0007,
  '0008_reauthentication': m0008,
  '0009_events_occurred_at': m0009,
  '0010_idempotency_keys': m0010
}

/**
 * Brings the schema up to date. Safe to run from several instances at once:
 * Kysely's migrator takes an advisory lock on PostgreSQL.
 */
export async function migrateToLatest (db: Db, schema?: string): Promise<string[]> {
  if (await isUpToDate(db, schema)) return []
  if (schema !== undefined && isPostgres(db)) {
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
  const migrator = new Migrator({
    db,
    provider: { getMigrations: async () => migrations },
    // Without this the migrator finds its bookkeeping tables in any schema and skips creating them in ours.
    ...(schema !== undefined && isPostgres(db) ? { migrationTableSchema: schema } : {})
  })
  const { error, results } = await migrator.migrateToLatest()
  if (error !== undefined) throw error
  return (results ?? []).filter(r => r.status === 'Success').map(r => r.migrationName)
}

/**
 * Whether the schema already has exactly this release's migrations, read in
 * one query. Most starts find it so, and the migrator's own path there (its
 * tables, its lock, on PostgreSQL a transaction) cost a PostgreSQL start
 * 66 ms against 31 ms for this query (its first connection included). Another instance's migration in progress is not visible until
 * it commits, so this says false and the migrator waits on its lock.
 */
async function isUpToDate (db: Db, schema: string | undefined): Promise<boolean> {
  const table = schema !== undefined && isPostgres(db) ? sql.table(`${schema}.kysely_migration`) : sql.table('kysely_migration')
  let applied: string[]
  try {
    applied = (await sql<{ name: string }>`select name from ${table}`.execute(db)).rows.map(row => row.name)
  } catch {
    // No such table: a new database, which the migrator sets up.
    return false
  }
  const known = Object.keys(migrations)
  return applied.length === known.length && known.every(name => applied.includes(name))
}
