import { createHash } from 'node:crypto'
import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import type SQLite from 'better-sqlite3'
import {
  Kysely,
  PostgresAdapter,
  PostgresDialect,
  SqliteAdapter,
  SqliteDialect,
  SqliteDriver,
  sql,
  type ColumnType,
  type RawBuilder,
  type PostgresPool,
  type PostgresPoolClient,
  type DatabaseConnection,
  type SqliteDatabase
} from 'kysely'
import type pg from 'pg'
import type { Config } from '../config.ts'
import { Sqlite } from './sqlite-binding.ts'
import { checkpointInBackground } from './sqlite-checkpoint.ts'
import { loadPg } from './pg-driver.ts'
import { DatabaseConnectionError } from './connection-failure.ts'
import { statementLog } from '../lib/tracing.ts'

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

export function dialectOf (db: Kysely<any>): DialectName {
  return db.getExecutor().adapter instanceof PostgresAdapter ? 'postgres' : 'sqlite'
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

/** Without `sqliteMmapMib`, SQLite reads the file without a memory map (SQLite's own default). */
export function createDb (config: Pick<Config, 'databaseUrl' | 'databaseSchema' | 'databasePoolSize' | 'databaseStatementTimeoutMs' | 'databaseQueryTimeoutMs' | 'databaseAcquireTimeoutMs'> & Partial<Pick<Config, 'sqliteMmapMib' | 'sqliteWalLimitMib' | 'databaseReadPipelines'>>): Db {
  if (config.databaseUrl.startsWith('sqlite:')) {
    const walLimitBytes = config.sqliteWalLimitMib !== undefined ? config.sqliteWalLimitMib * 1024 * 1024 : WAL_SIZE_LIMIT_BYTES
    return new Kysely<Database>({
      dialect: new DirectSqliteDialect(openSqlite(config.databaseUrl.slice('sqlite:'.length), config.databaseStatementTimeoutMs, config.sqliteMmapMib ?? 0, walLimitBytes)),
      ...statementLog('sqlite')
    })
  }
  // Kysely calls this on the first query: pg is loaded then, so a SQLite deployment never loads it.
  const openPool = async (): Promise<PostgresPool> => {
    const { Client, Pool, types } = loadPg()
    const connection = {
      // timestamptz as the API's own text: no Date object made and formatted again for every value read.
      types: { getTypeParser: ((oid: number, format?: string) => oid === TIMESTAMPTZ_OID && format !== 'binary' ? isoFromTimestamptz : types.getTypeParser(oid, format as 'text')) as typeof types.getTypeParser },
      connectionString: config.databaseUrl,
      // Both the wait for a free connection and opening a new one: a server that
      // accepts the connection but never answers would otherwise hold it for ever.
      connectionTimeoutMillis: config.databaseAcquireTimeoutMs,
      statement_timeout: config.databaseStatementTimeoutMs,
      // DATABASE_QUERY_TIMEOUT_MS, the client-side deadline for a server that has gone dark and never sends the
      // statement_timeout error, is kept by our seams (answeredWithin), not by pg's query_timeout: pg's says so
      // only in its error's text.
      // UTC, so every timestamptz arrives as `…+00` (isoFromTimestamptz).
      options: `-c TimeZone=UTC${config.databaseSchema !== undefined ? ` -c search_path=${config.databaseSchema}` : ''}`
    }
    // The pipelines are taken out of DATABASE_POOL_SIZE, which stays the instance's number of connections; one at least stays pooled.
    const pipelineCount = Math.max(0, Math.min(config.databaseReadPipelines ?? 0, config.databasePoolSize - 1))
    const pool = new Pool({ ...connection, max: config.databasePoolSize - pipelineCount, idleTimeoutMillis: IDLE_CONNECTION_MS })
    // An idle client losing its server must not crash the process; the next query reports it.
    pool.on('error', () => {})
    const pipelines = pipelineCount > 0
      ? new ReadPipelines(() => new Client({ ...connection, pipeline: true }), pipelineCount, config.databaseQueryTimeoutMs)
      : undefined
    reads.pipelines = pipelines
    return discardingStalled(pool, pipelines, config.databaseQueryTimeoutMs)
  }
  const reads: DirectReads = { pool: undefined, pipelines: undefined }
  const pool = async (): Promise<PostgresPool> => (reads.pool = await openPool())
  return new Kysely<Database>({ dialect: new DirectReadsDialect({ pool }, reads), ...statementLog('postgresql') })
}

/** How long an unused connection is kept open, in the pool and among the read pipelines. */
const IDLE_CONNECTION_MS = 30_000

/** The pool Kysely opened for this database, once it has (Kysely ends it when the database is destroyed), and the read pipelines opened with it. */
interface DirectReads { pool: PostgresPool | undefined, pipelines: ReadPipelines | undefined }
const directReads = new WeakMap<object, DirectReads>()

/** Registers each database's pool under its adapter, which every handle made from it (withPlugin, transactions) shares. */
class DirectReadsDialect extends PostgresDialect {
  readonly #reads: DirectReads
  constructor (config: ConstructorParameters<typeof PostgresDialect>[0], reads: DirectReads) {
    super(config)
    this.#reads = reads
  }

  override createAdapter (): PostgresAdapter {
    const adapter = super.createAdapter() as PostgresAdapter
    directReads.set(adapter, this.#reads)
    return adapter
  }
}

/** SQLite: the one connection Kysely's driver runs every statement on, registered under the adapter as DirectReadsDialect does. */
const directSqlite = new WeakMap<object, OpenSqlite>()

class DirectSqliteDialect extends SqliteDialect {
  readonly #database: OpenSqlite
  constructor (database: OpenSqlite) {
    super({ database })
    this.#database = database
  }

  override createAdapter (): SqliteAdapter {
    const adapter = super.createAdapter() as SqliteAdapter
    directSqlite.set(adapter, this.#database)
    return adapter
  }

  override createDriver (): SqliteDriver {
    return new WalResettingSqliteDriver(this.#database)
  }
}

/**
 * Kysely's driver, which holds the one connection for a statement or a whole
 * transaction; before it hands the connection out, it lets the checkpointer
 * empty a WAL that has passed its limit (sqlite-checkpoint.ts). That is the
 * one moment no transaction is open and nothing else can use the connection.
 */
class WalResettingSqliteDriver extends SqliteDriver {
  readonly #database: OpenSqlite
  constructor (database: OpenSqlite) {
    super({ database })
    this.#database = database
  }

  override async acquireConnection (): Promise<DatabaseConnection> {
    const connection = await super.acquireConnection()
    const reset = this.#database.beforeUse()
    if (reset !== undefined) await reset
    return connection
  }
}

/**
 * Runs a statement of db/prepared.ts without Kysely's executor: on a pooled
 * PostgreSQL connection, or on SQLite's connection when no transaction is
 * open on it; undefined when that cannot be done (a handle inside a
 * transaction, whose statements must use its connection, another request's
 * transaction open on SQLite's one connection, or a pool Kysely has not
 * opened yet). Kysely's plugins are not run, which is
 * why prepared.ts takes only reads, inserts and updates of bookkeeping
 * columns: nothing the credential cache's writes plugin must see (the mail
 * policy plugin changes no query; it is only read from the handle).
 *
 * Kysely's path (a query id, the runtime driver, the connection provider, a
 * connection wrapper and each plugin's result hook, each an await) cost
 * the server 9–43 µs of CPU per uncached page of 50 (361, 260, 282 µs
 * through it against 318, 251, 254 without, three interleaved rounds;
 * bench/README.md, "Issue 20: the uncached page on PostgreSQL"). On SQLite
 * it cost 3 to 7% of the server's CPU per uncached page and up to 14% per
 * cached one (100,000 users, eight interleaved rounds with the builds in
 * both places; bench/README.md, "Issue 20: 8 KiB pages and SQLite's reads").
 */
export async function queryDirect (db: Kysely<any>, text: string, parameters: readonly unknown[], options: { pipelined: boolean }): Promise<unknown[] | undefined> {
  if (db.isTransaction) return undefined
  const adapter = db.getExecutor().adapter
  const sqlite = directSqlite.get(adapter)
  if (sqlite !== undefined) {
    // Kysely's driver holds the connection for a transaction across its awaits: a statement run now would run inside
    // it. (A stream would hold it too, and better-sqlite3 refuses other statements while one iterates; gatehouse streams
    // nothing from SQLite: streamUsersJson reads pages.)
    if (sqlite.inTransaction()) return undefined
    const statement = sqlite.prepare(text)
    if (statement.reader) return statement.all(parameters)
    // While the WAL is being emptied the write lock is taken: a write goes through Kysely's driver, which waits for it.
    if (sqlite.resettingWal()) return undefined
    statement.run(parameters)
    return []
  }
  const reads = directReads.get(adapter)
  if (reads?.pool === undefined) return undefined
  if (options.pipelined && reads.pipelines !== undefined) return await reads.pipelines.query(text, parameters)
  const connection = await reads.pool.connect()
  try {
    const result = await connection.query(text, parameters)
    return result.rows
  } finally {
    connection.release()
  }
}

interface ReadPipeline {
  client: pg.Client
  /** Its connection failed or ended (pg's 'error' or 'end'): what fails on it now fails for that reason. */
  lost: boolean
  /** Settles once the connection is open; rejects (and the pipeline is dropped) if it cannot be. */
  ready: Promise<void>
  open: boolean
  /** Statements sent and not yet answered. */
  inFlight: number
  lastUsedAt: number
  /** Writes are held until the end of this turn of the event loop (#gather). */
  gathering: boolean
}

/**
 * PostgreSQL: a few connections in pg's pipeline mode, for the short reads of
 * db/prepared.ts outside transactions (the credential check, the users page,
 * the change stamp): each statement is written behind those still being
 * answered instead of waiting for a connection of its own. Under load a
 * backend then reads several statements per wake-up and answers them back to
 * back, and the server takes several answers per read, without the pool's
 * check-out, release and idle timer.
 *
 * Measured on this 2-core VM (bench/README.md, "Issue 20: pipelined reads";
 * the same build with DATABASE_READ_PIPELINES=0 and 4, six interleaved
 * rounds): the uncached page of 50 cost 551–884 µs of CPU per page, server
 * and backends together, through the pool of 10; 354–492 µs with 4 of the 10
 * pipelined (0.55 to 0.83 of it, median about 0.6).
 *
 * A statement waits behind the ones written before it on its connection, so
 * only reads that neither lock nor write come here (prepared.ts decides), and
 * never the searches planned for their values, which may take milliseconds:
 * a row lock or a slow plan would hold up every read behind it. A new
 * statement goes to an idle connection if there is one, else to a new one
 * while fewer than `size` are open, else to the one with the fewest
 * statements in flight. A connection that fails or times out (pg closes a
 * pipelined connection whose statement outlives query_timeout, failing the
 * statements behind it) is dropped, and the next statement opens another;
 * one unused for IDLE_CONNECTION_MS is closed.
 */
class ReadPipelines {
  readonly #slots: Array<ReadPipeline | undefined>
  readonly #connect: () => pg.Client
  readonly #queryTimeoutMs: number
  readonly #idleCheck: NodeJS.Timeout
  #ended = false

  constructor (connect: () => pg.Client, size: number, queryTimeoutMs: number) {
    this.#connect = connect
    this.#queryTimeoutMs = queryTimeoutMs
    this.#slots = new Array<ReadPipeline | undefined>(size).fill(undefined)
    this.#idleCheck = setInterval(() => { this.#closeIdle(Date.now()) }, IDLE_CONNECTION_MS / 3).unref()
  }

  async query (text: string, parameters: readonly unknown[]): Promise<unknown[]> {
    if (this.#ended) throw new DatabaseConnectionError('connect', new Error('the read pipelines are closed'))
    const pipeline = this.#pick()
    pipeline.inFlight++
    pipeline.lastUsedAt = Date.now()
    try {
      if (!pipeline.open) await pipeline.ready
      this.#gather(pipeline)
      // A statement that outlives the deadline holds up every one written behind it: the connection goes, failing them too.
      const result = await answeredWithin(pipeline.client.query({ name: statementName(text), text, values: parameters as unknown[] }), this.#queryTimeoutMs, () => {
        pipeline.lost = true
        pipeline.client.connection.stream.destroy()
      })
      return result.rows
    } catch (error) {
      throw failureOn(error, pipeline.lost)
    } finally {
      pipeline.inFlight--
    }
  }

  async end (): Promise<void> {
    this.#ended = true
    clearInterval(this.#idleCheck)
    // pg ends a pipelined connection once the statements written on it are answered.
    await Promise.all(this.#slots.map(async (pipeline, i) => {
      this.#slots[i] = undefined
      await pipeline?.client.end().catch(() => {})
    }))
  }

  #pick (): ReadPipeline {
    let least: ReadPipeline | undefined
    let empty = -1
    for (let i = 0; i < this.#slots.length; i++) {
      const pipeline = this.#slots[i]
      if (pipeline === undefined) {
        if (empty === -1) empty = i
      } else if (pipeline.inFlight === 0) {
        return pipeline
      } else if (least === undefined || pipeline.inFlight < least.inFlight) {
        least = pipeline
      }
    }
    if (empty !== -1) return this.#open(empty)
    return least!
  }

  #open (slot: number): ReadPipeline {
    const client = this.#connect()
    const pipeline: ReadPipeline = { client, lost: false, ready: Promise.resolve(), open: false, inFlight: 0, lastUsedAt: Date.now(), gathering: false }
    const drop = (): void => {
      pipeline.lost = true
      if (this.#slots[slot] === pipeline) this.#slots[slot] = undefined
    }
    // pg fails the statements in flight itself; the connection is only taken out of use.
    client.on('error', drop)
    client.on('end', drop)
    pipeline.ready = client.connect().then(() => { pipeline.open = true }, (error: unknown) => {
      drop()
      throw connectFailure(error)
    })
    // Awaited by the statements that wait for it; this keeps a failed open from being an unhandled rejection meanwhile.
    pipeline.ready.catch(() => {})
    this.#slots[slot] = pipeline
    return pipeline
  }

  /**
   * Holds this connection's writes until the event loop has handled every
   * socket that was ready (setImmediate runs after that phase), so that the
   * statements of all the requests read in one turn go out in one write.
   */
  #gather (pipeline: ReadPipeline): void {
    if (pipeline.gathering) return
    const stream = pipeline.client.connection.stream
    pipeline.gathering = true
    stream.cork()
    setImmediate(() => {
      pipeline.gathering = false
      stream.uncork()
    })
  }

  #closeIdle (now: number): void {
    for (let i = 0; i < this.#slots.length; i++) {
      const pipeline = this.#slots[i]
      if (pipeline === undefined || pipeline.inFlight > 0 || now - pipeline.lastUsedAt < IDLE_CONNECTION_MS) continue
      this.#slots[i] = undefined
      pipeline.client.end().catch(() => {})
    }
  }
}

/**
 * Marks a statement (db/prepared.ts) to be prepared once per connection under
 * a name made from its text. Only for statements whose text is built once and
 * that name their columns: a prepared `select *` fails once a migration
 * changes the table under it.
 */
export const PREPARE_MARK = '/* prepared */ '
const statementNames = new Map<string, string>()
function statementName (text: string): string {
  let name = statementNames.get(text)
  if (name === undefined) {
    name = `gh_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`
    statementNames.set(text, name)
  }
  return name
}

const TIMESTAMPTZ_OID = 1184
const UTC_TIMESTAMP = /^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,6}))?\+00$/

/**
 * PostgreSQL's text for a timestamptz in a UTC session, `2024-01-01
 * 00:00:00.123456+00`, as the `toISOString()` form SQLite stores and the API
 * writes (milliseconds, `Z`). Anything else (another offset, a year past
 * 9999, BC, infinity) goes through Date, as pg would have parsed it.
 */
export function isoFromTimestamptz (text: string): string {
  const match = UTC_TIMESTAMP.exec(text)
  if (match === null) {
    const date = new Date(text.replace(' ', 'T').replace(/([+-]\d{2})$/, '$1:00'))
    return Number.isNaN(date.getTime()) ? text : date.toISOString()
  }
  return `${match[1]}T${match[2]}.${(match[3] ?? '').padEnd(3, '0').slice(0, 3)}Z`
}

/**
 * `running`, unless it is not settled within `timeoutMs`: then a
 * DatabaseConnectionError('query_timeout'), handed first to `giveUp` (which
 * takes the connection out of use). What `running` comes to after that is dropped.
 */
async function answeredWithin<T> (running: Promise<T>, timeoutMs: number, giveUp: (error: DatabaseConnectionError) => void): Promise<T> {
  return await new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const error = new DatabaseConnectionError('query_timeout')
      giveUp(error)
      reject(error)
    }, timeoutMs)
    running.then(value => { clearTimeout(timer); resolve(value) }, (error: unknown) => { clearTimeout(timer); reject(error) })
  })
}

/**
 * Why opening a connection failed, as DatabaseConnectionError('connect'):
 * anything pg or pg-pool rejects with (its own timeouts, a refused or reset
 * socket, a closed pool) but the server's own refusal (pg's DatabaseError: a
 * wrong password, a database that does not exist, too many connections),
 * which keeps its SQLSTATE code for errors.ts and the callers that read it.
 */
function connectFailure (error: unknown): unknown {
  return error instanceof loadPg().DatabaseError ? error : new DatabaseConnectionError('connect', error)
}

/**
 * Why a statement failed: the server's refusal as it is; anything else,
 * on a connection that pg reported failed or ended, as connection_lost.
 * Any other failure (a value pg cannot send, a row it cannot read) is ours.
 */
function failureOn (error: unknown, connectionLost: boolean): unknown {
  if (error instanceof DatabaseConnectionError || error instanceof loadPg().DatabaseError || !connectionLost) return error
  return new DatabaseConnectionError('connection_lost', error)
}

/**
 * Pooled connections that are given up once a query on them outlives
 * DATABASE_QUERY_TIMEOUT_MS. Such a connection still owes that answer, which
 * may never come: kept, it would make the next query on it wait behind the
 * lost one. Later queries on it (a transaction's ROLLBACK) fail at once with
 * the same error instead of waiting out another timeout, and releasing it
 * closes it. Failures are classified here (connectFailure, failureOn).
 */
function discardingStalled (pool: pg.Pool, pipelines: ReadPipelines | undefined, queryTimeoutMs: number): PostgresPool {
  // Clients whose connection pg reported failed or ended. pg-pool listens for
  // errors only on idle clients; this listener also keeps one in use from
  // crashing the process (the query in flight is failed anyway, and the
  // client dropped on release).
  const lost = new WeakSet<pg.Client>()
  pool.on('connect', (client) => {
    client.on('error', () => { lost.add(client) })
    client.on('end', () => { lost.add(client) })
  })
  return {
    connect: async () => {
      let client: pg.PoolClient
      try {
        client = await pool.connect()
      } catch (error) {
        throw connectFailure(error)
      }
      let stalled: Error | undefined
      const query = async (text: string, parameters: ReadonlyArray<unknown>): Promise<pg.QueryResult> => {
        if (stalled !== undefined) throw stalled
        try {
          const running = text.startsWith(PREPARE_MARK)
            ? client.query({ name: statementName(text), text, values: parameters as unknown[] })
            : client.query(text, parameters as unknown[])
          // Released with this error, the client is closed: pg destroys the socket of a client with a statement in flight.
          return await answeredWithin(running, queryTimeoutMs, (error) => { stalled = error })
        } catch (error) {
          throw failureOn(error, lost.has(client))
        }
      }
      // Kysely's overloads include cursors, which nothing here uses.
      return { query: query as unknown as PostgresPoolClient['query'], release: () => { client.release(stalled) } }
    },
    end: async () => { await Promise.all([pipelines?.end(), pool.end()]) }
  }
}

/**
 * The WAL's limit unless SQLITE_WAL_LIMIT_MIB says otherwise: the size SQLite cuts the WAL file back to once it has
 * been checkpointed (Rails's and Hanami's default too), and the size past which it is emptied (sqlite-checkpoint.ts).
 */
export const WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024

/** The connection as Kysely's driver takes it, whether a transaction is open on it, and its WAL's keeper. */
interface OpenSqlite extends SqliteDatabase {
  inTransaction: () => boolean
  /** Checkpointer.beforeUse: to be awaited, when it answers a promise, before the connection is used. */
  beforeUse: () => Promise<void> | undefined
  /** True while the WAL is being emptied: nothing may write on the connection. */
  resettingWal: () => boolean
}

function openSqlite (path: string, busyTimeoutMs: number, mmapMib: number, walLimitBytes: number): OpenSqlite {
  const file = path === ':memory:' || path === '' ? ':memory:' : path
  if (file !== ':memory:') mkdirSync(dirname(file), { recursive: true })
  const raw = new Sqlite(file, { timeout: busyTimeoutMs })
  // A new file gets pages of 8 KiB rather than SQLite's 4: the index that carries the users' stored texts (migration
  // 0024) then holds twice as many users a page, and an uncached page of 50 visits half as many b-tree pages. At
  // 100,000 users the server's CPU per uncached page was 0.88 to 0.95 of what it was with 4 KiB (eight interleaved
  // rounds, the builds in both places; the statement alone 24.3 to 25.0 µs against 31.0 to 33.8, and 25.4 to 25.9
  // with 16 KiB). An event's insert costs 3 to 5 µs more, a user's lookup or update the same (bench/README.md,
  // "Issue 20: 8 KiB pages and SQLite's reads"). The size is fixed when the first table is made: an existing file
  // keeps its own (docs/configuration.md says how to convert one).
  raw.pragma('page_size = 8192')
  raw.pragma('journal_mode = WAL')
  raw.pragma('synchronous = NORMAL')
  raw.pragma('foreign_keys = ON')
  // Pages are read where the kernel already holds them instead of copied into
  // SQLite's page cache by a read(2) each: an uncached users page (51 users,
  // about ten pages of an index) cost the server 0.916 of its CPU per response
  // with 256 MiB mapped (median of eight interleaved rounds at 100,000 users,
  // a 190 MiB file; bench/README.md, "Issue 20: the access line and the memory
  // map"). Writes still go through write(2): SQLite never writes through the map.
  if (file !== ':memory:' && mmapMib > 0) raw.pragma(`mmap_size = ${mmapMib * 1024 * 1024}`)
  // SQLite never shrinks the WAL file of its own accord: after a write of more than this (an import, an upgrade's
  // migrations: 1.6 GiB for 0021 to 0024 at 1,000,000 users) the file kept that size for as long as the server ran.
  // With a limit, the first commit after a checkpoint has copied the whole WAL back cuts the file down to it. A
  // server's WAL is checkpointed at 4 MiB (sqlite-checkpoint.ts), so in steady use it never reaches 64 MiB and this
  // costs nothing. Under writes that never pause, the checkpointer empties the WAL once it passes the limit.
  raw.pragma(`journal_size_limit = ${walLimitBytes}`)
  // Checkpoints off the event loop: see sqlite-checkpoint.ts. An in-memory database has no WAL.
  const checkpointer = file === ':memory:' ? undefined : checkpointInBackground(raw, file, busyTimeoutMs, { limitBytes: walLimitBytes })
  // Kysely prepares every statement anew; preparing is a large share of a short query's cost.
  const statements = new Map<string, SqliteStatement>()
  return {
    close: () => {
      checkpointer?.stop()
      raw.close()
    },
    prepare: (text: string) => {
      let statement = statements.get(text)
      if (statement === undefined) {
        if (statements.size >= 1000) statements.clear()
        statement = withIntegerBooleans(raw.prepare(text))
        statements.set(text, statement)
      }
      return statement
    },
    inTransaction: () => raw.inTransaction,
    beforeUse: () => checkpointer?.beforeUse(),
    resettingWal: () => checkpointer?.resetting === true
  }
}

type SqliteStatement = ReturnType<SqliteDatabase['prepare']>

/**
 * better-sqlite3 refuses to bind booleans, and SQLite stores them as 0/1
 * anyway: convert at the binding, which costs one pass over the parameters
 * (a Kysely plugin would rewrite every query's syntax tree instead).
 */
function withIntegerBooleans (statement: SQLite.Statement): SqliteStatement {
  const bind = (parameters: ReadonlyArray<unknown>): unknown[] =>
    parameters.map(p => typeof p === 'boolean' ? (p ? 1 : 0) : p)
  return {
    reader: statement.reader,
    all: (parameters) => statement.all(bind(parameters)),
    run: (parameters) => statement.run(bind(parameters)),
    iterate: (parameters) => statement.iterate(bind(parameters))
  }
}

/** PostgreSQL's deadlock_detected and serialization_failure: the transaction was chosen to be rolled back, and may simply be run again. */
export type RetryReason = 'deadlock' | 'serialization_failure'
const RETRYABLE = new Map<string, RetryReason>([['40P01', 'deadlock'], ['40001', 'serialization_failure']])

/** Per database: transactionRetried's transactions PostgreSQL rolled back, by why (for /metrics; a deadlock counted here is a lock order to fix). */
const retriesOf = new WeakMap<Db, Record<RetryReason, number>>()

export function transactionRetryCounts (db: Db): Record<RetryReason, number> {
  return { ...(retriesOf.get(db) ?? { deadlock: 0, serialization_failure: 0 }) }
}

/**
 * Runs `work` in a transaction, and runs it again (at most `attempts` times in
 * all) when PostgreSQL rolled it back to break a deadlock. Changes of users
 * and groups lock them in one order (users first, each kind in id order), so
 * a deadlock should not happen; should one still (a lock order missed), it is
 * retried here rather than answered with 409 `conflict`, and counted.
 * `work` must do nothing outside the transaction that cannot be done twice.
 */
export async function transactionRetried<T> (db: Db, work: (trx: Db) => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await db.transaction().execute(work)
    } catch (error) {
      const code = (error as { code?: unknown } | null)?.code
      const reason = typeof code === 'string' ? RETRYABLE.get(code) : undefined
      if (reason === undefined) throw error
      const counts = retriesOf.get(db) ?? { deadlock: 0, serialization_failure: 0 }
      retriesOf.set(db, counts)
      counts[reason]++
      if (attempt >= attempts) throw error
    }
  }
}

/**
 * Runs `attempt` inside a savepoint of the open transaction `trx`. When it
 * returns undefined, all it did is rolled back to the savepoint, and with it
 * (on PostgreSQL) the row locks it took; otherwise the savepoint is released
 * and its result returned. A throw leaves the savepoint to the transaction,
 * which rolls back as a whole.
 */
export async function keptOrRolledBack<T> (trx: Db, attempt: () => Promise<T | undefined>): Promise<T | undefined> {
  await sql`savepoint gatehouse_attempt`.execute(trx)
  const result = await attempt()
  await (result === undefined ? sql`rollback to savepoint gatehouse_attempt` : sql`release savepoint gatehouse_attempt`).execute(trx)
  return result
}

/** Cheap round trip used by /readyz. */
export async function pingDb (db: Db): Promise<void> {
  await sql`select 1`.execute(db)
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
