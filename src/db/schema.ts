import { sql, type ColumnType, type Kysely, type RawBuilder } from 'kysely'

/** Timestamps are written as RFC 3339 strings; PostgreSQL hands back Date, SQLite the string. */
type Timestamp = ColumnType<Date | string, string, string>
type NullableTimestamp = ColumnType<Date | string | null, string | null, string | null>
/** JSON arrays: jsonb on PostgreSQL (parsed by the driver), text on SQLite. Always written as a JSON string. */
type JsonArray = ColumnType<string[] | string, string, string>
/** boolean on PostgreSQL, 0/1 on SQLite (converted at binding, see withIntegerBooleans). */
type Bool = ColumnType<boolean | number, boolean, boolean>

export interface UsersTable {
  id: string
  username: string
  /** Case-folded username; the unique index that makes "unique ignoring case" a database rule. */
  username_key: string
  email: string | null
  email_key: string | null
  first_name: string | null
  last_name: string | null
  role: 'admin' | 'user'
  groups: JsonArray
  disabled: Bool
  password_hash: string | null
  version: number
  created_at: Timestamp
  updated_at: Timestamp
  last_login_at: NullableTimestamp
  password_changed_at: NullableTimestamp
  /** Consecutive failed sign-ins; reset by a successful one. */
  failed_logins: ColumnType<number, number | undefined, number>
  locked_until: NullableTimestamp
  /** False: this user signs in only through an identity provider (or a passkey). */
  password_sign_in: ColumnType<boolean | number, boolean | undefined, boolean>
  /** The address in `email` was confirmed by a link or code mailed to it (migration 0015). */
  email_verified: ColumnType<boolean | number, boolean | undefined, boolean>
  /** Invited and not yet accepted: no password signs in until the invitation sets one. */
  invitation_pending: ColumnType<boolean | number, boolean | undefined, boolean>
  /** SCIM (migration 0013): the provisioning client's id for the user, displayName, name.formatted, emails and the time of its last change. */
  external_id: ColumnType<string | null, string | null | undefined, string | null>
  display_name: ColumnType<string | null, string | null | undefined, string | null>
  formatted_name: ColumnType<string | null, string | null | undefined, string | null>
  scim_emails: ColumnType<ScimEmail[] | string | null, string | null | undefined, string | null>
  provisioned_at: ColumnType<Date | string | null, string | null | undefined, string | null>
  /** SCIM's enterprise extension (migration 0017); `manager_id` is the manager when they are one of our users. */
  employee_number: ColumnType<string | null, string | null | undefined, string | null>
  cost_center: ColumnType<string | null, string | null | undefined, string | null>
  organization: ColumnType<string | null, string | null | undefined, string | null>
  division: ColumnType<string | null, string | null | undefined, string | null>
  department: ColumnType<string | null, string | null | undefined, string | null>
  manager_id: ColumnType<string | null, string | null | undefined, string | null>
}

/** One entry of a user's SCIM `emails`, as stored. */
export interface ScimEmail { value: string, type?: string, primary?: boolean }

export interface SessionsTable {
  id: string
  user_id: string
  digest: string
  created_at: Timestamp
  last_seen_at: Timestamp
  expires_at: Timestamp
  ended_at: NullableTimestamp
  client_ip: string | null
  user_agent: string | null
  /** A second factor (or a user-verified passkey) was shown at this sign-in; `X-Auth-MFA`. */
  mfa: ColumnType<boolean | number, boolean | undefined, boolean>
  /** The last re-authentication (docs/mfa.md#recent-authentication); null: none since the sign-in. */
  reauthenticated_at: ColumnType<Date | string | null, string | null | undefined, string | null>
  /** How the session was opened (migration 0011); null for sessions from before it. */
  sign_in_method: ColumnType<SignInMethod | null, SignInMethod | null | undefined, SignInMethod | null>
  /** The OIDC provider's id when `sign_in_method` is `oidc`. */
  sign_in_provider: ColumnType<string | null, string | null | undefined, string | null>
}

/** How a session was opened: the first step of its sign-in (a second factor is `mfa`, beside it). */
export type SignInMethod = 'password' | 'ldap' | 'oidc' | 'passkey'

export interface ApiKeysTable {
  id: string
  name: string
  /** The visible start of the secret, for recognising a key in lists and logs. */
  prefix: string
  /** SHA-256 of the whole secret, hex. The secret itself is never stored. */
  digest: string
  scopes: JsonArray
  /** The user the key acts for; null for keys that belong to the deployment (bootstrap, CLI). */
  user_id: string | null
  created_by_type: string
  created_by_id: string | null
  created_at: Timestamp
  expires_at: NullableTimestamp
  last_used_at: NullableTimestamp
  revoked_at: NullableTimestamp
}

export interface EventsTable {
  id: string
  type: string
  occurred_at: Timestamp
  actor_type: string
  actor_id: string | null
  target_type: string | null
  target_id: string | null
  request_id: string | null
  client_ip: string | null
  data: ColumnType<Record<string, unknown> | string, string, never>
  /** The trace it was recorded in (migration 0027): null without tracing. */
  trace_id: string | null
  span_id: string | null
}

export interface SignInAddressesTable {
  user_id: string
  client_ip: string
  last_sign_in_at: Timestamp
}

export interface TotpFactorsTable {
  user_id: string
  /** Encrypted (lib/secret-box.ts). */
  secret: string
  confirmed_at: NullableTimestamp
  /** bigint: pg hands it back as a string. */
  last_time_step: ColumnType<string | number | null, number | null, number | null>
  created_at: Timestamp
  /** Wrong codes while the set-up is pending; past a limit the pending secret is dropped. */
  confirm_failures: ColumnType<number, number | undefined, number>
}

export interface RecoveryCodesTable {
  id: string
  user_id: string
  digest: string
  used_at: NullableTimestamp
  created_at: Timestamp
}

export interface PasskeysTable {
  id: string
  user_id: string
  credential_id: string
  public_key: string
  sign_count: ColumnType<string | number, number, number>
  transports: JsonArray
  name: string
  created_at: Timestamp
  last_used_at: NullableTimestamp
}

export interface MfaChallengesTable {
  id: string
  purpose: 'sign_in' | 'register' | 'passkey'
  digest: string | null
  user_id: string | null
  webauthn_challenge: string | null
  enrol: Bool
  created_at: Timestamp
  expires_at: Timestamp
  used_at: NullableTimestamp
  /** A sign-in challenge: how its first step went, for the session it opens (migration 0011). */
  sign_in_method: ColumnType<SignInMethod | null, SignInMethod | null | undefined, SignInMethod | null>
  sign_in_provider: ColumnType<string | null, string | null | undefined, string | null>
}

export interface WebhookEndpointsTable {
  id: string
  url: string
  description: string | null
  /** The filter as given: exact event types and `prefix.*` wildcards, or `*`. */
  event_types: JsonArray
  /** The same filter as LIKE patterns (backslash escapes `_`), which the outbox insert matches in SQL. */
  event_patterns: JsonArray
  enabled: Bool
  /** Why it was disabled: `manual`, `gone` (the receiver answered 410) or `failing`. */
  disabled_reason: string | null
  /** Signing secret, `whsec_…`. Stored as is: HMAC signing needs the key itself, not a digest. */
  secret: string
  /** The secret before the last rotation, still signing alongside until previous_secret_expires_at. */
  previous_secret: string | null
  previous_secret_expires_at: NullableTimestamp
  /** Queue time of the oldest delivery that failed since the last success; null while deliveries succeed. */
  failing_since: NullableTimestamp
  created_at: Timestamp
  updated_at: Timestamp
}

/** The outbox: one row per (endpoint, event), written in the event's transaction. */
export interface WebhookDeliveriesTable {
  endpoint_id: string
  event_id: string
  status: 'pending' | 'delivered' | 'failed'
  attempts: number
  next_attempt_at: Timestamp
  /**
   * Past this instant a failed attempt gives the delivery up (status `failed`).
   * Null: created_at plus the configured horizon (the event's transaction does not know the setting).
   */
  give_up_at: NullableTimestamp
  /** A worker's claim: nobody else takes the row before this instant; a crashed worker's claim simply runs out. */
  locked_until: NullableTimestamp
  /** Which claim holds the row; a worker whose claim ran out cannot record a result over a newer one. */
  lock_token: string | null
  last_attempt_at: NullableTimestamp
  last_status_code: number | null
  last_error: string | null
  created_at: Timestamp
  delivered_at: NullableTimestamp
}

export interface WebhookAttemptsTable {
  id: string
  endpoint_id: string
  event_id: string
  attempted_at: Timestamp
  succeeded: Bool
  status_code: number | null
  latency_ms: number
  error: string | null
  /** When the delivery was scheduled next after this attempt; null when it was delivered or given up. */
  next_attempt_at: NullableTimestamp
}

export interface UserIdentitiesTable {
  id: string
  user_id: string
  /** 'oidc:<provider id>' or 'ldap'. */
  provider: string
  /** The provider's stable name for the account: an ID token's `sub`, an LDAP DN. */
  subject: string
  email: string | null
  created_at: Timestamp
  last_sign_in_at: NullableTimestamp
}

export interface OidcProvidersTable {
  id: string
  display_name: string
  issuer: string
  client_id: string
  /** Sealed (lib/secret-box.ts) under MFA_ENCRYPTION_KEY; null for a public client. */
  client_secret: string | null
  scopes: JsonArray
  enabled: Bool
  jit: Bool
  link_by_email: Bool
  groups_claim: string | null
  /** JSON object: provider group → gatehouse groups. */
  group_map: ColumnType<Record<string, string[]> | string, string, string>
  admin_groups: JsonArray
  created_at: Timestamp
  updated_at: Timestamp
}

export interface OidcLoginsTable {
  id: string
  state_digest: string
  provider_id: string
  code_verifier: string
  nonce: string
  next: string | null
  created_at: Timestamp
  expires_at: Timestamp
  used_at: NullableTimestamp
}

/** A key sent with a write (Idempotency-Key) and, once the write is answered, that answer. */
/** Migration 0026: the sign-in throttle windows that have recorded their `user.login_throttled`. */
export interface LoginThrottleWindowsTable {
  key: string
  ends_at: Timestamp
}

export interface IdempotencyKeysTable {
  /** Whose key it is: `api_key:<key id>` or `user:<user id>` (any of the user's sessions). */
  scope: string
  method: string
  /** The request's path, without the query string. */
  path: string
  key: string
  /** SHA-256 (hex) of the method, path, media type and body of the first request. */
  fingerprint: string
  state: 'in_progress' | 'done'
  lock_token: string | null
  locked_until: NullableTimestamp
  status_code: number | null
  /** JSON object of the answer's headers that are replayed (Content-Type, Location, ETag). */
  response_headers: string | null
  response_body: Buffer | null
  created_at: Timestamp
}

export type AccountTokenPurpose = 'invitation' | 'password_reset' | 'email_verification'

/** A one-time token of an invitation, password reset or e-mail verification (migration 0015); only digests. */
export interface AccountTokensTable {
  id: string
  user_id: string
  purpose: AccountTokenPurpose
  digest: string
  code_digest: string
  code_failures: ColumnType<number, number | undefined, number>
  email: string | null
  created_at: Timestamp
  expires_at: Timestamp
  used_at: NullableTimestamp
  ended_reason: string | null
}

/** The mail outbox (migration 0014): one row per message. */
export interface MailOutboxTable {
  id: string
  user_id: string | null
  /** The template's name (docs/email.md#templates). */
  template: string
  /** Sealed JSON of the recipient and the template's values; null once sent or given up. */
  payload: string | null
  status: 'pending' | 'sent' | 'failed'
  attempts: number
  next_attempt_at: Timestamp
  /** A worker's claim, as in webhook_deliveries: a crashed worker's claim simply runs out. */
  locked_until: NullableTimestamp
  lock_token: string | null
  /** The last attempt's error (the SMTP reply or the connection's failure); never the message. */
  last_error: string | null
  created_at: Timestamp
  /** When it was sent or given up. */
  finished_at: NullableTimestamp
}

/** A group (migration 0012); its name is what a member's `users.groups` array holds. */
export interface GroupsTable {
  id: string
  display_name: string
  /** The name lower-cased (groups.repository.ts groupNameKey): names are unique ignoring case (migration 0025). */
  name_key: string
  /** A provisioning client's own id for the group (SCIM `externalId`); stored, never interpreted. */
  external_id: string | null
  version: number
  created_at: Timestamp
  updated_at: Timestamp
}

/** Who is in a group: kept in step with `users.groups` by the user lifecycle, in the same transaction. */
export interface GroupMembersTable {
  group_id: string
  user_id: string
  /** The member's sort keys (migration 0018), written by triggers from the user's row: never by an insert. */
  created_at: ColumnType<Date | string, never, never>
  updated_at: ColumnType<Date | string, never, never>
  username_key: ColumnType<string, never, never>
}

export interface MetaTable {
  key: string
  value: string
}

export interface Database {
  users: UsersTable
  api_keys: ApiKeysTable
  events: EventsTable
  sessions: SessionsTable
  sign_in_addresses: SignInAddressesTable
  gatehouse_meta: MetaTable
  webhook_endpoints: WebhookEndpointsTable
  webhook_deliveries: WebhookDeliveriesTable
  webhook_attempts: WebhookAttemptsTable
  totp_factors: TotpFactorsTable
  recovery_codes: RecoveryCodesTable
  passkeys: PasskeysTable
  mfa_challenges: MfaChallengesTable
  user_identities: UserIdentitiesTable
  oidc_providers: OidcProvidersTable
  oidc_logins: OidcLoginsTable
  idempotency_keys: IdempotencyKeysTable
  login_throttle_windows: LoginThrottleWindowsTable
  account_tokens: AccountTokensTable
  mail_outbox: MailOutboxTable
  groups: GroupsTable
  group_members: GroupMembersTable
}

export type Db = Kysely<Database>
export type DialectName = 'sqlite' | 'postgres'

/**
 * Which database a handle (or a transaction's) talks to, by the dialect's
 * own placeholder in Kysely's public compile: PostgreSQL numbers its
 * parameters (`$1`), SQLite does not (`?`).
 */
export function dialectOf (db: Kysely<any>): DialectName {
  return sql`${0}`.compile(db).sql === '$1' ? 'postgres' : 'sqlite'
}

export function isPostgres (db: Kysely<any>): boolean {
  return dialectOf(db) === 'postgres'
}

/**
 * The column types the migrations write: the native type on PostgreSQL, and
 * on SQLite, which has no uuid, timestamptz, jsonb or boolean, text and integer.
 */
export function columnTypes (db: Kysely<any>): { uuid: RawBuilder<unknown>, ts: RawBuilder<unknown>, json: RawBuilder<unknown>, bool: RawBuilder<unknown> } {
  const pg = isPostgres(db)
  return {
    uuid: sql.raw(pg ? 'uuid' : 'text'),
    ts: sql.raw(pg ? 'timestamptz' : 'text'),
    json: sql.raw(pg ? 'jsonb' : 'text'),
    bool: sql.raw(pg ? 'boolean' : 'integer')
  }
}

export function toIso (value: Date | string): string
export function toIso (value: Date | string | null): string | null
export function toIso (value: Date | string | null): string | null {
  if (value === null) return null
  return value instanceof Date ? value.toISOString() : value
}

export function toBool (value: boolean | number): boolean {
  return value === true || value === 1
}

export function toStringArray (value: string[] | string): string[] {
  return typeof value === 'string' ? JSON.parse(value) as string[] : value
}

declare module 'fastify' {
  interface FastifyInstance {
    db: Db
  }
}
