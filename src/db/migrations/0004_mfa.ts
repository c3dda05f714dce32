import { sql, type Kysely } from 'kysely'
import { columnTypes, isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * Second factors: an authenticator app's TOTP secret (encrypted), passkeys,
 * recovery codes (digests), and the short-lived challenges of two-step
 * sign-in and of WebAuthn ceremonies. Sessions remember whether a second
 * factor was shown, for `X-Auth-MFA`.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const pg = isPostgres(db)
  const { uuid, ts, json, bool } = columnTypes(db)

  await db.schema.createTable('totp_factors')
    .addColumn('user_id', uuid, c => c.primaryKey().references('users.id').onDelete('cascade'))
    // AES-256-GCM under MFA_ENCRYPTION_KEY (see lib/secret-box.ts); never the plain secret.
    .addColumn('secret', 'text', c => c.notNull())
    // Null while enrolment waits for its first code.
    .addColumn('confirmed_at', ts)
    // The RFC 6238 time step of the last accepted code: a code is accepted once, and never an older one.
    .addColumn('last_time_step', 'bigint')
    .addColumn('created_at', ts, c => c.notNull())
    .execute()

  await db.schema.createTable('recovery_codes')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    // SHA-256 of the normalised code, hex.
    .addColumn('digest', 'text', c => c.notNull())
    .addColumn('used_at', ts)
    .addColumn('created_at', ts, c => c.notNull())
    .execute()
  await db.schema.createIndex('recovery_codes_user_digest_idx').on('recovery_codes').columns(['user_id', 'digest']).execute()

  await db.schema.createTable('passkeys')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    // base64url, as WebAuthn names the credential.
    .addColumn('credential_id', 'text', c => c.notNull())
    // The COSE public key, base64url.
    .addColumn('public_key', 'text', c => c.notNull())
    .addColumn('sign_count', 'bigint', c => c.notNull())
    .addColumn('transports', json, c => c.notNull())
    .addColumn('name', 'text', c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('last_used_at', ts)
    .execute()
  await db.schema.createIndex('passkeys_credential_id_unique').on('passkeys').column('credential_id').unique().execute()
  await db.schema.createIndex('passkeys_user_id_idx').on('passkeys').column('user_id').execute()

  await db.schema.createTable('mfa_challenges')
    .addColumn('id', uuid, c => c.primaryKey())
    // 'sign_in': the second step after a password; 'register': a passkey being added;
    // 'passkey': passwordless sign-in, which has no user until the assertion names one.
    .addColumn('purpose', 'text', c => c.notNull().check(sql`purpose in ('sign_in', 'register', 'passkey')`))
    // SHA-256 of the challenge token given to the client (sign_in only); the token itself is never stored.
    .addColumn('digest', 'text')
    .addColumn('user_id', uuid, c => c.references('users.id').onDelete('cascade'))
    // The WebAuthn challenge, base64url, once options were asked for.
    .addColumn('webauthn_challenge', 'text')
    // The user must enrol a factor before the sign-in completes (MFA_REQUIRED).
    .addColumn('enrol', bool, c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('expires_at', ts, c => c.notNull())
    .addColumn('used_at', ts)
    .execute()
  await db.schema.createIndex('mfa_challenges_digest_unique').on('mfa_challenges').column('digest').unique().execute()
  await db.schema.createIndex('mfa_challenges_webauthn_idx').on('mfa_challenges').column('webauthn_challenge').execute()
  await db.schema.createIndex('mfa_challenges_expires_idx').on('mfa_challenges').column('expires_at').execute()

  await db.schema.alterTable('sessions').addColumn('mfa', bool, c => c.notNull().defaultTo(pg ? sql`false` : 0)).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').dropColumn('mfa').execute()
  for (const table of ['mfa_challenges', 'passkeys', 'recovery_codes', 'totp_factors']) {
    await db.schema.dropTable(table).execute()
  }
}
