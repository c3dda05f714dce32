import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * Recent authentication (docs/mfa.md#recent-authentication): a session keeps
 * when its person last proved themselves again after signing in, so changes
 * to factors can ask for a proof within REAUTH_WINDOW_SECONDS. A pending TOTP
 * set-up counts its wrong codes: it survives a typo, but not endless guessing.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { ts } = columnTypes(db)
  // Null until the first re-authentication: the sign-in (`created_at`) is the proof until then.
  await db.schema.alterTable('sessions').addColumn('reauthenticated_at', ts).execute()
  await db.schema.alterTable('totp_factors').addColumn('confirm_failures', 'integer', c => c.notNull().defaultTo(0)).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('totp_factors').dropColumn('confirm_failures').execute()
  await db.schema.alterTable('sessions').dropColumn('reauthenticated_at').execute()
}
