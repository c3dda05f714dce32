import { sql, type Kysely } from 'kysely'
import { columnTypes, isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * One-time account tokens (docs/email.md): the links and codes of
 * invitations, password resets and e-mail verification. Only digests are
 * stored: SHA-256 of the link's secret, and of the short code (salted with
 * the token's id, so equal codes do not show as equal digests). A token is
 * bound to its purpose and account, and an e-mail verification to the
 * address it confirms. `used_at` is set once, by the one UPDATE that
 * consumes it or by what ends it early (`ended_reason`: used, replaced,
 * revoked, code_attempts).
 *
 * Users gain `email_verified` and `invitation_pending` (invited, not yet
 * accepted: no password can sign in until the invitation sets one).
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts, bool } = columnTypes(db)
  const no = isPostgres(db) ? sql`false` : sql`0`
  await db.schema.createTable('account_tokens')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('purpose', 'text', c => c.notNull().check(sql`purpose in ('invitation', 'password_reset', 'email_verification')`))
    .addColumn('digest', 'text', c => c.notNull())
    .addColumn('code_digest', 'text', c => c.notNull())
    .addColumn('code_failures', 'integer', c => c.notNull().defaultTo(0))
    // The address an e-mail verification confirms; null for the other purposes.
    .addColumn('email', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('expires_at', ts, c => c.notNull())
    .addColumn('used_at', ts)
    .addColumn('ended_reason', 'text')
    .execute()
  await db.schema.createIndex('account_tokens_digest_unique').on('account_tokens').column('digest').unique().execute()
  await db.schema.createIndex('account_tokens_user_purpose_idx').on('account_tokens').columns(['user_id', 'purpose']).execute()
  await db.schema.createIndex('account_tokens_expires_idx').on('account_tokens').column('expires_at').execute()
  await db.schema.alterTable('users').addColumn('email_verified', bool, c => c.notNull().defaultTo(no)).execute()
  await db.schema.alterTable('users').addColumn('invitation_pending', bool, c => c.notNull().defaultTo(no)).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('users').dropColumn('invitation_pending').execute()
  await db.schema.alterTable('users').dropColumn('email_verified').execute()
  await db.schema.dropTable('account_tokens').execute()
}
