import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * Single sign-on: the accounts at external identity providers (OpenID
 * Connect, LDAP) that sign in as a gatehouse user, and whether a user may
 * sign in with a local password at all.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts, bool, json } = columnTypes(db)

  // Off for a user who must come through an identity provider; the global
  // switch (PASSWORD_SIGN_IN=off) turns it off for everyone at once.
  await db.schema.alterTable('users')
    .addColumn('password_sign_in', bool, c => c.notNull().defaultTo(true))
    .execute()

  await db.schema.createTable('user_identities')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    // 'oidc:<provider id>' or 'ldap'.
    .addColumn('provider', 'text', c => c.notNull())
    // What the provider calls the account for good: an ID token's `sub`, an LDAP entry's DN.
    .addColumn('subject', 'text', c => c.notNull())
    // As the provider last reported it, for display only; never used to find the user again.
    .addColumn('email', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('last_sign_in_at', ts)
    .execute()
  await db.schema.createIndex('user_identities_provider_subject_unique').on('user_identities').columns(['provider', 'subject']).unique().execute()
  await db.schema.createIndex('user_identities_user_id_idx').on('user_identities').column('user_id').execute()

  // OpenID providers added through the API (those from OIDC_PROVIDERS live in the configuration only).
  await db.schema.createTable('oidc_providers')
    .addColumn('id', 'text', c => c.primaryKey())
    .addColumn('display_name', 'text', c => c.notNull())
    .addColumn('issuer', 'text', c => c.notNull())
    .addColumn('client_id', 'text', c => c.notNull())
    // Sealed with MFA_ENCRYPTION_KEY (lib/secret-box.ts); null for a public client (PKCE only).
    .addColumn('client_secret', 'text')
    .addColumn('scopes', json, c => c.notNull())
    .addColumn('enabled', bool, c => c.notNull())
    .addColumn('jit', bool, c => c.notNull())
    .addColumn('link_by_email', bool, c => c.notNull())
    .addColumn('groups_claim', 'text')
    // {"<provider group>": ["<gatehouse group>", …]}
    .addColumn('group_map', json, c => c.notNull())
    .addColumn('admin_groups', json, c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('updated_at', ts, c => c.notNull())
    .execute()

  // A sign-in on its way through a provider: single-use, minutes long. Found by the digest of its `state`.
  await db.schema.createTable('oidc_logins')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('state_digest', 'text', c => c.notNull().unique())
    .addColumn('provider_id', 'text', c => c.notNull())
    .addColumn('code_verifier', 'text', c => c.notNull())
    .addColumn('nonce', 'text', c => c.notNull())
    .addColumn('next', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('expires_at', ts, c => c.notNull())
    .addColumn('used_at', ts)
    .execute()
  await db.schema.createIndex('oidc_logins_expires_at_idx').on('oidc_logins').column('expires_at').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('oidc_logins').execute()
  await db.schema.dropTable('oidc_providers').execute()
  await db.schema.dropTable('user_identities').execute()
  await db.schema.alterTable('users').dropColumn('password_sign_in').execute()
}
