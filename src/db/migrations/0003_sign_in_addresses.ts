import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * The addresses each user signed in from, and when last: a sign-in from one
 * of them is from a known client, which an account lock does not shut out.
 * One row per user and address, so asking costs one primary-key look-up
 * however many failed attempts an attacker has made the event log record.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts } = columnTypes(db)
  await db.schema.createTable('sign_in_addresses')
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('client_ip', 'text', c => c.notNull())
    .addColumn('last_sign_in_at', ts, c => c.notNull())
    .addPrimaryKeyConstraint('sign_in_addresses_pk', ['user_id', 'client_ip'])
    .execute()
  await db.schema.createIndex('sign_in_addresses_last_idx').on('sign_in_addresses').column('last_sign_in_at').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('sign_in_addresses').execute()
}
