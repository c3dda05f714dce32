import type { Kysely } from 'kysely'

export const phase = 'expand'

/**
 * Sessions a person can see (docs/sessions.md#your-sessions): how each was
 * opened, so a list of sessions can say "password", "LDAP", "OIDC (okta)" or
 * "passkey". `sign_in_method` is one of `password`, `ldap`, `oidc`,
 * `passkey`; `sign_in_provider` names the OIDC provider. Sessions from before
 * this migration keep null: unknown. A sign-in that stops for a second
 * factor keeps its first step's method on the challenge until the session
 * is opened.
 */
export async function up (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').addColumn('sign_in_method', 'text').execute()
  await db.schema.alterTable('sessions').addColumn('sign_in_provider', 'text').execute()
  await db.schema.alterTable('mfa_challenges').addColumn('sign_in_method', 'text').execute()
  await db.schema.alterTable('mfa_challenges').addColumn('sign_in_provider', 'text').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('mfa_challenges').dropColumn('sign_in_provider').execute()
  await db.schema.alterTable('mfa_challenges').dropColumn('sign_in_method').execute()
  await db.schema.alterTable('sessions').dropColumn('sign_in_provider').execute()
  await db.schema.alterTable('sessions').dropColumn('sign_in_method').execute()
}
