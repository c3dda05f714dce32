import { Migrator, sql, type Migration } from 'kysely'
import { isPostgres, type Db } from './database.ts'
import * as m0001 from './migrations/0001_init.ts'
import * as m0002 from './migrations/0002_sessions.ts'

// Listed here rather than read from a folder, so a bundled or compiled build carries them.
const migrations: Record<string, Migration> = {
  '0001_init': m0001,
  '0002_sessions': m0002
}

/**
 * Brings the schema up to date. Safe to run from several instances at once:
 * Kysely's migrator takes an advisory lock on PostgreSQL.
 */
export async function migrateToLatest (db: Db, schema?: string): Promise<string[]> {
  if (schema !== undefined && isPostgres(db)) {
    await sql`create schema if not exists ${sql.id(schema)}`.execute(db)
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
