import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/** Sign-in: sessions, and the per-account failure count behind account locking. */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts } = columnTypes(db)

  await db.schema.createTable('sessions')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    // SHA-256 of the token, hex; the token itself is never stored.
    .addColumn('digest', 'text', c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('last_seen_at', ts, c => c.notNull())
    .addColumn('expires_at', ts, c => c.notNull())
    .addColumn('ended_at', ts)
    .addColumn('client_ip', 'text')
    .addColumn('user_agent', 'text')
    .execute()
  await db.schema.createIndex('sessions_digest_unique').on('sessions').column('digest').unique().execute()
  await db.schema.createIndex('sessions_user_id_idx').on('sessions').column('user_id').execute()

  await db.schema.alterTable('users').addColumn('failed_logins', 'integer', c => c.notNull().defaultTo(0)).execute()
  await db.schema.alterTable('users').addColumn('locked_until', ts).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('users').dropColumn('locked_until').execute()
  await db.schema.alterTable('users').dropColumn('failed_logins').execute()
  await db.schema.dropTable('sessions').execute()
}
