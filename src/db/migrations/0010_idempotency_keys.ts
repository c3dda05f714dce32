import { sql, type Kysely } from 'kysely'
import { columnTypes, isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * Idempotency keys (docs/api.md, "Retry-safe writes"): one row per key a
 * credential sent to one operation, holding the first answer so that a retry
 * gets it again. In the database, so every instance sees the same keys.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { ts } = columnTypes(db)
  await db.schema.createTable('idempotency_keys')
    // `api_key:<id>` or `user:<id>`: one client's key never finds another's answer.
    .addColumn('scope', 'text', c => c.notNull())
    .addColumn('method', 'text', c => c.notNull())
    .addColumn('path', 'text', c => c.notNull())
    .addColumn('key', 'text', c => c.notNull())
    .addColumn('fingerprint', 'text', c => c.notNull())
    .addColumn('state', 'text', c => c.notNull().check(sql`state in ('in_progress', 'done')`))
    // Which request holds an in-progress key, and until when; another may take it over only after that.
    .addColumn('lock_token', 'text')
    .addColumn('locked_until', ts)
    .addColumn('status_code', 'integer')
    .addColumn('response_headers', 'text')
    .addColumn('response_body', sql.raw(isPostgres(db) ? 'bytea' : 'blob'))
    .addColumn('created_at', ts, c => c.notNull())
    // The insert of a first request decides a race: the loser finds the winner's row.
    .addPrimaryKeyConstraint('idempotency_keys_pk', ['scope', 'method', 'path', 'key'])
    .execute()
  // For the hourly purge.
  await db.schema.createIndex('idempotency_keys_created_at_idx').on('idempotency_keys').column('created_at').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('idempotency_keys').execute()
}
