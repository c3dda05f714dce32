import { sql, type Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * The mail outbox (docs/email.md#the-outbox): one row per message, written in
 * the transaction of what it tells about, sent by the mail worker. The
 * recipient and the template's values are sealed in `payload` (they may hold
 * a one-time link) and erased once the message is sent or given up.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts } = columnTypes(db)
  await db.schema.createTable('mail_outbox')
    .addColumn('id', uuid, c => c.primaryKey())
    // A user's mail goes with the user: nobody is left to tell.
    .addColumn('user_id', uuid, c => c.references('users.id').onDelete('cascade'))
    .addColumn('template', 'text', c => c.notNull())
    .addColumn('payload', 'text')
    .addColumn('status', 'text', c => c.notNull().check(sql`status in ('pending', 'sent', 'failed')`))
    .addColumn('attempts', 'integer', c => c.notNull())
    .addColumn('next_attempt_at', ts, c => c.notNull())
    .addColumn('locked_until', ts)
    .addColumn('lock_token', 'text')
    .addColumn('last_error', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('finished_at', ts)
    .execute()
  // What the workers' claim scans: only pending rows, soonest first.
  await db.schema.createIndex('mail_outbox_due_idx').on('mail_outbox')
    .column('next_attempt_at').where(sql.ref('status'), '=', 'pending').execute()
  await db.schema.createIndex('mail_outbox_user_idx').on('mail_outbox').column('user_id').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('mail_outbox').execute()
}
