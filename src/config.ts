import { readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import { USERNAME_PATTERN } from './users/users.schemas.ts'
import { trustFunction } from './lib/forwarded.ts'
import { completeKeyRing, parseKeyRing } from './lib/key-ring.ts'
import { readLdapConfig, type LdapConfig } from './sso/ldap.config.ts'
import { parseOidcProviders, type OidcProviderSettings } from './sso/oidc.settings.ts'

/**
 * Every knob the service has. Read once from the environment at start-up
 * (`loadConfig`), or built directly by tests through `buildApp({ config })`.
 * Documented for administrators in docs/configuration.md.
 */
export interface Config {
  host: string
  port: number
  /** Where the whole API is mounted; the docs live at `${basePath}/docs`. */
  basePath: string
  /** `sqlite:<file>`, `sqlite::memory:` or `postgres://…`. */
  databaseUrl: string
  /** PostgreSQL schema to use (search_path); lets one database hold several deployments or test runs. */
  databaseSchema: string | undefined
  databasePoolSize: number
  /** SQLite: how much of the database file, in MiB, is read through a memory map (0: none). */
  sqliteMmapMib: number
  /** SQLite: the WAL size, in MiB, past which it is emptied between transactions, and cut back to once checkpointed. */
  sqliteWalLimitMib: number
  /** Upper bound for one SQL statement (PostgreSQL statement_timeout, SQLite busy timeout). */
  databaseStatementTimeoutMs: number
  /**
   * PostgreSQL: how long to wait for a query's answer before giving up on it and
   * its connection. statement_timeout is enforced by the server, so it cannot
   * help when the server (or the network to it) stops answering altogether.
   */
  databaseQueryTimeoutMs: number
  /** PostgreSQL: how long to wait for a pooled connection, including opening a new one. */
  databaseAcquireTimeoutMs: number
  logLevel: string
  /** Accept `?API_KEY=` as the main API does. Off means header credentials only. */
  allowQueryApiKey: boolean
  /** How many live (unrevoked, unexpired) API keys one owner may hold; a create beyond is 409 too_many_api_keys. */
  apiKeysPerOwner: number
  bodyLimitBytes: number
  requestTimeoutMs: number
  /** argon2id parameters for new hashes; see docs/security.md. */
  argon2MemoryKib: number
  argon2TimeCost: number
  argon2Parallelism: number
  /** Hashes computed at once; the rest queue, and past `hashQueueLimit` requests get 503. */
  hashConcurrency: number
  hashQueueLimit: number
  /** 0: hashes on libuv's pool at the event loop's priority; 1 to 19 (19 on Linux by default): on worker threads at that nice value (lib/hash-workers.ts). */
  hashNice: number
  passwordMinLength: number
  passwordMaxLength: number
  /** Words tied to the service that no password may contain (ASVS 6.1.2: documented in docs/security.md). */
  passwordContextWords: string[]
  /** Trust X-Forwarded-* from this proxy setting (Fastify `trustProxy`); false means the socket address. */
  trustProxy: boolean | string
  /** The Strict-Transport-Security value sent with every answer to an HTTPS request; undefined: none (HSTS=off). */
  hsts: string | undefined
  docsEnabled: boolean
  metricsEnabled: boolean
  /** Retirement date announced for the 3.6.1 paths in the `Sunset` header. */
  legacySunset: Date
  bootstrapAdminApiKey: string | undefined
  bootstrapAdminUsername: string | undefined
  bootstrapAdminPassword: string | undefined
  /** A session ends after this long without a request… */
  sessionIdleTimeoutMs: number
  /** How recent a session's sign-in or re-authentication must be for changes to factors (docs/mfa.md#recent-authentication). */
  reauthWindowMs: number
  /** …and in any case this long after sign-in. */
  sessionAbsoluteTimeoutMs: number
  /** How long a checked API key or session is trusted without reading the database again (0: never); see auth/credential-cache.ts. */
  credentialCacheTtlMs: number
  /** Failed sign-ins for one account from one address before 429 (per window). */
  loginMaxFailuresPerAccount: number
  /** Failed sign-ins from one address, across accounts, before 429 (per window). */
  loginMaxFailuresPerAddress: number
  loginFailureWindowMs: number
  /** Consecutive failures, from anywhere, that lock an account; a locked account cannot sign in. */
  accountLockThreshold: number
  accountLockMs: number
  /**
   * Days a browser that signed in (device cookie) or an address a user signed in from stays
   * known to that user's account; known clients are not shut out by its lock. 0: no client is known.
   */
  loginKnownClientDays: number
  /** Shares sign-in throttling across instances; in memory when unset. */
  redisUrl: string | undefined
  /** How long to wait for Redis to answer one command (or to connect) before the request gets 503. */
  redisCommandTimeoutMs: number
  /** Origins besides the service's own from which cookie-authenticated writes are accepted (CSRF). */
  trustedOrigins: string[]
  /**
   * The web UI's page to send a browser to after sign-in when the sign-in link
   * named no `next`; unset, gatehouse shows its own signed-in page.
   */
  loginDefaultNext: string | undefined
  /** Requests a minute per credential (API key or session); 0 switches the general limit off. */
  rateLimitPerCredential: number
  /** Requests a minute per client address for requests without a credential. */
  rateLimitPerAddress: number
  /** Deliver webhooks to loopback, private, link-local and other internal addresses (SSRF guard off). */
  webhookAllowPrivate: boolean
  /** One webhook request's deadline: connecting, sending and reading the answer. */
  webhookTimeoutMs: number
  /** How often each instance looks for due webhook deliveries. */
  webhookPollIntervalMs: number
  /** How long a delivery is retried before it is given up; also how long an endpoint may fail before it is disabled. */
  webhookRetryHorizonMs: number
  /** The first retry's delay; each later one doubles, up to webhookRetryMaxDelayMs, with jitter. */
  webhookRetryBaseMs: number
  webhookRetryMaxDelayMs: number
  /** How long a rotated-out signing secret keeps signing deliveries alongside the new one. */
  webhookSecretOverlapMs: number
  /** Webhook requests one instance has in flight at once. */
  webhookConcurrency: number
  /** Run the delivery worker here; off, the instance only queues deliveries (others deliver them). */
  webhookDelivery: boolean
  /** MIGRATE_ON_START: `serve` runs pending migrations before it serves; false refuses a database that is behind. */
  migrateOnStart: boolean
  /** How long finished webhook deliveries and attempts are kept for inspection. */
  webhookRetentionMs: number
  /** Who must have a second factor: nobody, admins, or everyone (docs/mfa.md). */
  mfaRequired: 'off' | 'admins' | 'all'
  /** AES-256 key for TOTP secrets at rest; without it TOTP cannot be enrolled (passkeys still can). */
  mfaEncryptionKey: Buffer | undefined
  /** Every MFA_ENCRYPTION_KEY listed, mfaEncryptionKey first: each opens what it sealed (lib/key-ring.ts). */
  mfaKeyRing: Buffer[]
  /** Wrong second-factor codes per account, from anywhere, before 429 (per LOGIN_FAILURE_WINDOW_S). */
  mfaMaxFailures: number
  /** WebAuthn relying party id (a domain); the request's host name when unset. */
  webauthnRpId: string | undefined
  /** Origins passkey ceremonies may come from; the request's own origin when unset. */
  webauthnOrigins: string[]
  /** Sign-in with a local password at all (PASSWORD_SIGN_IN); off leaves LDAP, OIDC, passkeys and API keys. */
  passwordSignIn: boolean
  /** LDAP / Active Directory sign-in (LDAP_*); undefined when LDAP_URL is unset. */
  ldap: LdapConfig | undefined
  /** OpenID Connect providers from OIDC_PROVIDERS (docs/sso.md); more can be added through the API. */
  oidcProviders: OidcProviderSettings[]
  /** The origin browsers reach gatehouse at, for OIDC redirect URIs; the request's own origin when unset. */
  oidcRedirectOrigin: string | undefined
  /** How long an invitation link and code work (INVITATION_LIFETIME_HOURS, default 72). */
  invitationLifetimeMs: number
  /** How long a password-reset link and code work (PASSWORD_RESET_LIFETIME_MINUTES, default 60). */
  passwordResetLifetimeMs: number
  /** How long an e-mail confirmation link and code work (EMAIL_VERIFICATION_LIFETIME_HOURS, default 24). */
  emailVerificationLifetimeMs: number
  /** Password-reset requests per address typed, per account and per client address, in an hour (PASSWORD_RESET_MAX_PER_HOUR). */
  passwordResetMaxPerHour: number
  /** The product's name in mail (and wherever gatehouse names the product to people). */
  productName: string
  /**
   * The address at which people reach the base path (`https://pipelines.example.com/auth`),
   * for links in mail; never guessed from a request's Host. Required with SMTP_URL.
   */
  publicUrl: string | undefined
  /** `smtp://user:pass@host:587` or `smtps://…:465`; unset, no mail is sent (docs/email.md). */
  smtpUrl: string | undefined
  /** smtp://: refuse to send unless the server offers STARTTLS. Off only for a relay on a trusted network. */
  smtpRequireTls: boolean
  /** The From of every message: `gatehouse@example.com` or `"Pipelines" <gatehouse@example.com>`. */
  mailFrom: string | undefined
  /** DKIM signing, when all three are set. */
  mailDkim: { domain: string, selector: string, privateKey: string } | undefined
  /** A folder whose files override the built-in templates of the same name. */
  mailTemplatesDir: string | undefined
  /** Which security notices are mailed to users (docs/email.md#security-notices). */
  mailNotices: NoticeKind[]
  /** How often each instance looks for due mail. */
  mailPollIntervalMs: number
  /** One SMTP conversation's deadline: connecting, greeting, sending. */
  mailTimeoutMs: number
  /** The first retry's delay; each later one doubles, up to mailRetryMaxDelayMs, with jitter. */
  mailRetryBaseMs: number
  mailRetryMaxDelayMs: number
  /** How long a message is retried before it is given up (`mail.failed`). */
  mailRetryHorizonMs: number
  /** Run the mail worker here; off, the instance only queues mail (others send it). */
  mailDelivery: boolean
  /**
   * Tests only, never read from the environment: certificates the SMTP client
   * trusts besides Node's store, for an in-process server under test (a
   * deployment uses NODE_EXTRA_CA_CERTS, docs/email.md#tls).
   */
  smtpTrustForTests: string[] | undefined
}

/** The security notices, as MAIL_NOTICES names them. */
export const NOTICE_KINDS = ['password_changed', 'factor_added', 'factor_removed', 'email_changed', 'username_changed', 'new_device_sign_in'] as const
export type NoticeKind = typeof NOTICE_KINDS[number]

export class ConfigError extends Error {}

const SQLITE_MMAP_MAX_MIB = 2047
const SQLITE_WAL_LIMIT_MAX_MIB = 4096

const DEFAULTS: Config = {
  host: '127.0.0.1',
  port: 8080,
  basePath: '/auth',
  databaseUrl: 'sqlite:./data/gatehouse.db',
  databaseSchema: undefined,
  databasePoolSize: 10,
  sqliteMmapMib: 256,
  sqliteWalLimitMib: 64,
  databaseStatementTimeoutMs: 5000,
  // Unless set, a second beyond the statement timeout, so that a merely slow
  // statement is cancelled by the server first and its connection kept.
  databaseQueryTimeoutMs: 6000,
  databaseAcquireTimeoutMs: 5000,
  logLevel: 'info',
  allowQueryApiKey: true,
  apiKeysPerOwner: 100,
  bodyLimitBytes: 64 * 1024,
  requestTimeoutMs: 30_000,
  argon2MemoryKib: 19_456,
  argon2TimeCost: 2,
  argon2Parallelism: 1,
  // One core is left to the event loop, which answers every other request while hashes run (bench/README.md, issue 8).
  hashConcurrency: Math.max(1, availableParallelism() - 1),
  hashQueueLimit: 64,
  // Linux: hashing below the event loop, so that a flood of sign-ins (a storm, or password spraying) cannot
  // take the CPU the gate and every other request need (docs/security.md; measured in bench/README.md,
  // "Issue 20: the storm, fourth pass"). Elsewhere a thread's priority cannot be set, so the pool it is.
  hashNice: process.platform === 'linux' ? 19 : 0,
  passwordMinLength: 8,
  passwordMaxLength: 256,
  passwordContextWords: ['gatehouse', 'pipeline', 'workflow'],
  trustProxy: false,
  hsts: 'max-age=31536000; includeSubDomains',
  docsEnabled: true,
  metricsEnabled: true,
  legacySunset: new Date('2027-12-31T00:00:00Z'),
  bootstrapAdminApiKey: undefined,
  bootstrapAdminUsername: undefined,
  bootstrapAdminPassword: undefined,
  sessionIdleTimeoutMs: 30 * 60_000,
  reauthWindowMs: 10 * 60_000,
  sessionAbsoluteTimeoutMs: 12 * 3_600_000,
  credentialCacheTtlMs: 5000,
  loginMaxFailuresPerAccount: 10,
  loginMaxFailuresPerAddress: 100,
  loginFailureWindowMs: 15 * 60_000,
  accountLockThreshold: 50,
  accountLockMs: 15 * 60_000,
  loginKnownClientDays: 30,
  redisUrl: undefined,
  redisCommandTimeoutMs: 2000,
  trustedOrigins: [],
  loginDefaultNext: undefined,
  rateLimitPerCredential: 60_000,
  // Every request from an address counts, so one NAT or an untrusted proxy in front carries a whole office's UI traffic.
  rateLimitPerAddress: 60_000,
  webhookAllowPrivate: false,
  webhookTimeoutMs: 10_000,
  webhookPollIntervalMs: 1000,
  webhookRetryHorizonMs: 3 * 86_400_000,
  webhookRetryBaseMs: 5000,
  webhookRetryMaxDelayMs: 3_600_000,
  webhookSecretOverlapMs: 86_400_000,
  webhookConcurrency: 10,
  webhookDelivery: true,
  migrateOnStart: true,
  webhookRetentionMs: 30 * 86_400_000,
  mfaRequired: 'off',
  mfaEncryptionKey: undefined,
  mfaKeyRing: [],
  mfaMaxFailures: 5,
  webauthnRpId: undefined,
  webauthnOrigins: [],
  passwordSignIn: true,
  ldap: undefined,
  oidcProviders: [],
  oidcRedirectOrigin: undefined,
  invitationLifetimeMs: 72 * 3_600_000,
  passwordResetLifetimeMs: 3_600_000,
  emailVerificationLifetimeMs: 24 * 3_600_000,
  passwordResetMaxPerHour: 5,
  productName: 'gatehouse',
  publicUrl: undefined,
  smtpUrl: undefined,
  smtpRequireTls: true,
  mailFrom: undefined,
  mailDkim: undefined,
  mailTemplatesDir: undefined,
  mailNotices: [...NOTICE_KINDS],
  mailPollIntervalMs: 1000,
  mailTimeoutMs: 30_000,
  mailRetryBaseMs: 10_000,
  mailRetryMaxDelayMs: 3_600_000,
  mailRetryHorizonMs: 2 * 86_400_000,
  mailDelivery: true,
  smtpTrustForTests: undefined
}

/** The minimums that OWASP ASVS 5.0 Appendix C allows for argon2id at t=2. */
export const ARGON2_MIN_MEMORY_KIB = 19_456
export const ARGON2_MIN_TIME_COST = 2

export function defaultConfig (overrides: Partial<Config> = {}): Config {
  const databaseQueryTimeoutMs = (overrides.databaseStatementTimeoutMs ?? DEFAULTS.databaseStatementTimeoutMs) + 1000
  return validate({ ...DEFAULTS, databaseQueryTimeoutMs, ...overrides })
}

export function loadConfig (env: NodeJS.ProcessEnv = process.env): Config {
  const c: Config = { ...DEFAULTS }
  const str = (name: string): string | undefined => {
    const v = env[name]
    return v === undefined || v === '' ? undefined : v
  }
  const int = (name: string, fallback: number): number => {
    const v = str(name)
    if (v === undefined) return fallback
    if (!/^\d+$/.test(v)) throw new ConfigError(`${name} must be a whole number, got "${v}"`)
    return Number(v)
  }
  const bool = (name: string, fallback: boolean): boolean => {
    const v = str(name)
    if (v === undefined) return fallback
    if (/^(1|true|yes|on)$/i.test(v)) return true
    if (/^(0|false|no|off)$/i.test(v)) return false
    throw new ConfigError(`${name} must be true or false, got "${v}"`)
  }

  c.host = str('HOST') ?? c.host
  c.port = int('PORT', c.port)
  c.basePath = str('BASE_PATH') ?? c.basePath
  c.databaseUrl = str('DATABASE_URL') ?? c.databaseUrl
  c.databaseSchema = str('DATABASE_SCHEMA')
  c.databasePoolSize = int('DATABASE_POOL_SIZE', c.databasePoolSize)
  c.sqliteMmapMib = int('SQLITE_MMAP_MIB', c.sqliteMmapMib)
  c.sqliteWalLimitMib = int('SQLITE_WAL_LIMIT_MIB', c.sqliteWalLimitMib)
  c.databaseStatementTimeoutMs = int('DATABASE_STATEMENT_TIMEOUT_MS', c.databaseStatementTimeoutMs)
  c.databaseQueryTimeoutMs = int('DATABASE_QUERY_TIMEOUT_MS', c.databaseStatementTimeoutMs + 1000)
  c.databaseAcquireTimeoutMs = int('DATABASE_ACQUIRE_TIMEOUT_MS', c.databaseAcquireTimeoutMs)
  c.logLevel = str('LOG_LEVEL') ?? c.logLevel
  c.allowQueryApiKey = bool('ALLOW_QUERY_API_KEY', c.allowQueryApiKey)
  c.apiKeysPerOwner = int('API_KEYS_PER_OWNER', c.apiKeysPerOwner)
  c.bodyLimitBytes = int('BODY_LIMIT_BYTES', c.bodyLimitBytes)
  c.requestTimeoutMs = int('REQUEST_TIMEOUT_MS', c.requestTimeoutMs)
  c.argon2MemoryKib = int('ARGON2_MEMORY_KIB', c.argon2MemoryKib)
  c.argon2TimeCost = int('ARGON2_TIME_COST', c.argon2TimeCost)
  c.argon2Parallelism = int('ARGON2_PARALLELISM', c.argon2Parallelism)
  c.hashConcurrency = int('HASH_CONCURRENCY', c.hashConcurrency)
  c.hashQueueLimit = int('HASH_QUEUE_LIMIT', c.hashQueueLimit)
  c.hashNice = int('HASH_NICE', c.hashNice)
  c.passwordMinLength = int('PASSWORD_MIN_LENGTH', c.passwordMinLength)
  const contextWords = str('PASSWORD_CONTEXT_WORDS')
  if (contextWords !== undefined) {
    c.passwordContextWords = contextWords.trim().toLowerCase() === 'none' ? [] : contextWords.split(',').map(w => w.trim()).filter(w => w !== '')
  }
  const trustProxy = str('TRUST_PROXY')
  if (trustProxy !== undefined) {
    // Fastify (5.12) no longer honours a hop count: it trusts whoever connects, so a client reaching gatehouse directly could name its own address.
    if (/^\d+$/.test(trustProxy.trim())) {
      throw new ConfigError(`TRUST_PROXY=${trustProxy.trim()}: a hop count is not accepted, as it would trust any peer, a client that reaches gatehouse directly too. Name the proxy: TRUST_PROXY=127.0.0.1 for one on this machine, or its addresses or CIDR ranges, comma-separated (docs/nginx.md#trust_proxy)`)
    }
    c.trustProxy = /^(true|false)$/i.test(trustProxy) ? trustProxy.toLowerCase() === 'true' : trustProxy
    if (typeof c.trustProxy === 'string') {
      try {
        trustFunction(c.trustProxy)
      } catch (error) {
        throw new ConfigError(`TRUST_PROXY must be true, false, or proxy addresses or CIDR ranges, comma-separated (${(error as Error).message})`)
      }
    }
  }
  const hsts = str('HSTS')
  if (hsts !== undefined) c.hsts = hsts.toLowerCase() === 'off' ? undefined : hsts
  c.docsEnabled = bool('DOCS_ENABLED', c.docsEnabled)
  c.metricsEnabled = bool('METRICS_ENABLED', c.metricsEnabled)
  const sunset = str('LEGACY_SUNSET')
  if (sunset !== undefined) c.legacySunset = new Date(sunset)
  c.bootstrapAdminApiKey = str('GATEHOUSE_ADMIN_API_KEY')
  c.bootstrapAdminUsername = str('GATEHOUSE_ADMIN_USERNAME')
  c.bootstrapAdminPassword = str('GATEHOUSE_ADMIN_PASSWORD')
  c.sessionIdleTimeoutMs = int('SESSION_IDLE_TIMEOUT_S', c.sessionIdleTimeoutMs / 1000) * 1000
  c.reauthWindowMs = int('REAUTH_WINDOW_SECONDS', c.reauthWindowMs / 1000) * 1000
  c.sessionAbsoluteTimeoutMs = int('SESSION_ABSOLUTE_TIMEOUT_S', c.sessionAbsoluteTimeoutMs / 1000) * 1000
  c.credentialCacheTtlMs = int('CREDENTIAL_CACHE_TTL_MS', c.credentialCacheTtlMs)
  c.loginMaxFailuresPerAccount = int('LOGIN_MAX_FAILURES_PER_ACCOUNT', c.loginMaxFailuresPerAccount)
  c.loginMaxFailuresPerAddress = int('LOGIN_MAX_FAILURES_PER_ADDRESS', c.loginMaxFailuresPerAddress)
  c.loginFailureWindowMs = int('LOGIN_FAILURE_WINDOW_S', c.loginFailureWindowMs / 1000) * 1000
  c.accountLockThreshold = int('ACCOUNT_LOCK_THRESHOLD', c.accountLockThreshold)
  c.accountLockMs = int('ACCOUNT_LOCK_S', c.accountLockMs / 1000) * 1000
  c.loginKnownClientDays = int('LOGIN_KNOWN_CLIENT_DAYS', c.loginKnownClientDays)
  c.redisUrl = str('REDIS_URL')
  c.redisCommandTimeoutMs = int('REDIS_COMMAND_TIMEOUT_MS', c.redisCommandTimeoutMs)
  c.rateLimitPerCredential = int('RATE_LIMIT_PER_CREDENTIAL', c.rateLimitPerCredential)
  c.rateLimitPerAddress = int('RATE_LIMIT_PER_ADDRESS', c.rateLimitPerAddress)
  c.webhookAllowPrivate = bool('WEBHOOK_ALLOW_PRIVATE', c.webhookAllowPrivate)
  c.webhookTimeoutMs = int('WEBHOOK_TIMEOUT_MS', c.webhookTimeoutMs)
  c.webhookPollIntervalMs = int('WEBHOOK_POLL_INTERVAL_MS', c.webhookPollIntervalMs)
  c.webhookRetryHorizonMs = int('WEBHOOK_RETRY_HORIZON_S', c.webhookRetryHorizonMs / 1000) * 1000
  c.webhookRetryBaseMs = int('WEBHOOK_RETRY_BASE_MS', c.webhookRetryBaseMs)
  c.webhookRetryMaxDelayMs = int('WEBHOOK_RETRY_MAX_DELAY_S', c.webhookRetryMaxDelayMs / 1000) * 1000
  c.webhookSecretOverlapMs = int('WEBHOOK_SECRET_OVERLAP_S', c.webhookSecretOverlapMs / 1000) * 1000
  c.webhookConcurrency = int('WEBHOOK_CONCURRENCY', c.webhookConcurrency)
  c.webhookRetentionMs = int('WEBHOOK_RETENTION_DAYS', c.webhookRetentionMs / 86_400_000) * 86_400_000
  c.webhookDelivery = bool('WEBHOOK_DELIVERY', c.webhookDelivery)
  c.migrateOnStart = bool('MIGRATE_ON_START', c.migrateOnStart)
  c.trustedOrigins = (str('TRUSTED_ORIGINS') ?? '').split(',').map(o => o.trim()).filter(o => o !== '')
  c.loginDefaultNext = str('LOGIN_DEFAULT_NEXT')
  const mfaRequired = str('MFA_REQUIRED') ?? c.mfaRequired
  if (mfaRequired !== 'off' && mfaRequired !== 'admins' && mfaRequired !== 'all') {
    throw new ConfigError(`MFA_REQUIRED must be off, admins or all, got "${mfaRequired}"`)
  }
  c.mfaRequired = mfaRequired
  const mfaKeys = str('MFA_ENCRYPTION_KEY')
  if (mfaKeys !== undefined) c.mfaKeyRing = parseKeyRing(mfaKeys, message => new ConfigError(message))
  c.mfaMaxFailures = int('MFA_MAX_FAILURES', c.mfaMaxFailures)
  c.webauthnRpId = str('WEBAUTHN_RP_ID')
  c.webauthnOrigins = (str('WEBAUTHN_ORIGINS') ?? '').split(',').map(o => o.trim()).filter(o => o !== '')
  c.passwordSignIn = bool('PASSWORD_SIGN_IN', c.passwordSignIn)
  c.invitationLifetimeMs = int('INVITATION_LIFETIME_HOURS', c.invitationLifetimeMs / 3_600_000) * 3_600_000
  c.passwordResetLifetimeMs = int('PASSWORD_RESET_LIFETIME_MINUTES', c.passwordResetLifetimeMs / 60_000) * 60_000
  c.emailVerificationLifetimeMs = int('EMAIL_VERIFICATION_LIFETIME_HOURS', c.emailVerificationLifetimeMs / 3_600_000) * 3_600_000
  c.passwordResetMaxPerHour = int('PASSWORD_RESET_MAX_PER_HOUR', c.passwordResetMaxPerHour)
  const oidcProviders = str('OIDC_PROVIDERS')
  if (oidcProviders !== undefined) {
    try {
      c.oidcProviders = parseOidcProviders(oidcProviders)
    } catch (error) {
      throw new ConfigError((error as Error).message)
    }
  }
  c.oidcRedirectOrigin = str('OIDC_REDIRECT_ORIGIN')
  c.productName = str('PRODUCT_NAME') ?? c.productName
  c.publicUrl = str('PUBLIC_URL')
  c.smtpUrl = str('SMTP_URL')
  c.smtpRequireTls = bool('SMTP_REQUIRE_TLS', c.smtpRequireTls)
  c.mailFrom = str('MAIL_FROM')
  const dkimKeyFile = str('MAIL_DKIM_PRIVATE_KEY_FILE')
  let dkimKey = str('MAIL_DKIM_PRIVATE_KEY')
  if (dkimKeyFile !== undefined) {
    if (dkimKey !== undefined) throw new ConfigError('set MAIL_DKIM_PRIVATE_KEY or MAIL_DKIM_PRIVATE_KEY_FILE, not both')
    try {
      dkimKey = readFileSync(dkimKeyFile, 'utf8')
    } catch (error) {
      throw new ConfigError(`MAIL_DKIM_PRIVATE_KEY_FILE cannot be read: ${(error as Error).message}`)
    }
  }
  const dkimDomain = str('MAIL_DKIM_DOMAIN')
  const dkimSelector = str('MAIL_DKIM_SELECTOR')
  if (dkimDomain !== undefined || dkimSelector !== undefined || dkimKey !== undefined) {
    if (dkimDomain === undefined || dkimSelector === undefined || dkimKey === undefined) {
      throw new ConfigError('MAIL_DKIM_DOMAIN, MAIL_DKIM_SELECTOR and MAIL_DKIM_PRIVATE_KEY (or _FILE) go together')
    }
    c.mailDkim = { domain: dkimDomain, selector: dkimSelector, privateKey: dkimKey }
  }
  c.mailTemplatesDir = str('MAIL_TEMPLATES_DIR')
  const notices = env.MAIL_NOTICES
  if (notices !== undefined) {
    const listed = notices.split(',').map(n => n.trim()).filter(n => n !== '' && n !== 'none')
    for (const name of listed) {
      if (!(NOTICE_KINDS as readonly string[]).includes(name)) throw new ConfigError(`MAIL_NOTICES names ${NOTICE_KINDS.join(', ')} (or none), got "${name}"`)
    }
    c.mailNotices = [...new Set(listed as NoticeKind[])]
  }
  c.mailPollIntervalMs = int('MAIL_POLL_INTERVAL_MS', c.mailPollIntervalMs)
  c.mailTimeoutMs = int('MAIL_TIMEOUT_MS', c.mailTimeoutMs)
  c.mailRetryBaseMs = int('MAIL_RETRY_BASE_MS', c.mailRetryBaseMs)
  c.mailRetryMaxDelayMs = int('MAIL_RETRY_MAX_DELAY_S', c.mailRetryMaxDelayMs / 1000) * 1000
  c.mailRetryHorizonMs = int('MAIL_RETRY_HORIZON_S', c.mailRetryHorizonMs / 1000) * 1000
  c.mailDelivery = bool('MAIL_DELIVERY', c.mailDelivery)
  c.ldap = readLdapConfig({ str, bool, int, fail: (message) => { throw new ConfigError(message) } })
  return validate(c)
}

function validate (c: Config): Config {
  for (const [name, ms] of [['INVITATION_LIFETIME_HOURS', c.invitationLifetimeMs], ['PASSWORD_RESET_LIFETIME_MINUTES', c.passwordResetLifetimeMs], ['EMAIL_VERIFICATION_LIFETIME_HOURS', c.emailVerificationLifetimeMs]] as const) {
    if (ms <= 0) throw new ConfigError(`${name} must be at least 1`)
  }
  if (c.passwordResetMaxPerHour < 1) throw new ConfigError('PASSWORD_RESET_MAX_PER_HOUR must be at least 1')
  if (!/^(\/[A-Za-z0-9._~-]+)*$/.test(c.basePath)) {
    throw new ConfigError(`BASE_PATH must look like /auth (no trailing slash), got "${c.basePath}"`)
  }
  if (!/^(sqlite:|postgres(ql)?:\/\/)/.test(c.databaseUrl)) {
    throw new ConfigError('DATABASE_URL must start with sqlite: or postgres://')
  }
  if (c.databaseSchema !== undefined && !/^[a-z_][a-z0-9_]{0,62}$/.test(c.databaseSchema)) {
    throw new ConfigError('DATABASE_SCHEMA must be a lower-case SQL identifier')
  }
  if (c.passwordMinLength < 8 || c.passwordMinLength > c.passwordMaxLength) {
    throw new ConfigError(`PASSWORD_MIN_LENGTH must be between 8 and ${c.passwordMaxLength}`)
  }
  const shortWord = c.passwordContextWords.find(w => [...w].length < 3 || [...w].length > 64)
  if (shortWord !== undefined) {
    throw new ConfigError(`PASSWORD_CONTEXT_WORDS: "${shortWord}" must have 3 to 64 characters (a shorter word would refuse too many unrelated passwords)`)
  }
  if (c.argon2MemoryKib < ARGON2_MIN_MEMORY_KIB || c.argon2TimeCost < ARGON2_MIN_TIME_COST || c.argon2Parallelism < 1) {
    throw new ConfigError(`argon2id parameters below m=${ARGON2_MIN_MEMORY_KIB} KiB, t=${ARGON2_MIN_TIME_COST} are not allowed`)
  }
  // SQLite maps at most 2 GiB less 64 KiB (SQLITE_MAX_MMAP_SIZE) and quietly maps less than asked beyond it.
  if (c.sqliteMmapMib > SQLITE_MMAP_MAX_MIB) throw new ConfigError(`SQLITE_MMAP_MIB must be at most ${SQLITE_MMAP_MAX_MIB}`)
  if (c.sqliteWalLimitMib < 1 || c.sqliteWalLimitMib > SQLITE_WAL_LIMIT_MAX_MIB) throw new ConfigError(`SQLITE_WAL_LIMIT_MIB must be between 1 and ${SQLITE_WAL_LIMIT_MAX_MIB}`)
  // Longer, and a revoked credential kept working that long wherever a change notice went missing.
  if (c.credentialCacheTtlMs > 60_000) throw new ConfigError('CREDENTIAL_CACHE_TTL_MS must be at most 60000')
  // Zero would make every change to factors ask again at once; an hour keeps a stolen session's window small enough.
  if (c.reauthWindowMs < 60_000 || c.reauthWindowMs > 3_600_000) throw new ConfigError('REAUTH_WINDOW_SECONDS must be between 60 and 3600')
  if (c.sessionIdleTimeoutMs < 60_000 || c.sessionAbsoluteTimeoutMs < c.sessionIdleTimeoutMs) {
    throw new ConfigError('SESSION_IDLE_TIMEOUT_S must be at least 60 and SESSION_ABSOLUTE_TIMEOUT_S at least the idle time-out')
  }
  if (c.loginMaxFailuresPerAccount < 1 || c.loginMaxFailuresPerAddress < 1 || c.accountLockThreshold < 1 ||
      c.loginFailureWindowMs < 1000 || c.accountLockMs < 1000) {
    throw new ConfigError('sign-in failure limits, LOGIN_FAILURE_WINDOW_S and ACCOUNT_LOCK_S must be at least 1')
  }
  for (const origin of c.trustedOrigins) {
    if (!/^https?:\/\/[^/]+$/.test(origin)) throw new ConfigError(`TRUSTED_ORIGINS entries look like https://ui.example.com, got "${origin}"`)
  }
  // 0 would mean "wait for ever" to the drivers: exactly the stall these bounds exist to prevent.
  if (c.databaseQueryTimeoutMs < 1 || c.databaseAcquireTimeoutMs < 1 || c.redisCommandTimeoutMs < 1) {
    throw new ConfigError('DATABASE_QUERY_TIMEOUT_MS, DATABASE_ACQUIRE_TIMEOUT_MS and REDIS_COMMAND_TIMEOUT_MS must be at least 1')
  }
  if (c.loginDefaultNext !== undefined && !isSameOriginPath(c.loginDefaultNext)) {
    throw new ConfigError(`LOGIN_DEFAULT_NEXT must be a path on this origin such as / or /pipelines, got "${c.loginDefaultNext}"`)
  }
  if (c.databasePoolSize < 1) throw new ConfigError('DATABASE_POOL_SIZE must be at least 1')
  if (c.hashQueueLimit < 0) throw new ConfigError('HASH_QUEUE_LIMIT must be 0 or more')
  if (c.hashConcurrency < 1) throw new ConfigError('HASH_CONCURRENCY must be at least 1')
  if (c.hashNice < 0 || c.hashNice > 19) throw new ConfigError('HASH_NICE must be 0 (off) to 19')
  if (c.apiKeysPerOwner < 1) throw new ConfigError('API_KEYS_PER_OWNER must be at least 1')
  if (c.webhookTimeoutMs < 1 || c.webhookPollIntervalMs < 1 || c.webhookRetryBaseMs < 1 || c.webhookConcurrency < 1) {
    throw new ConfigError('WEBHOOK_TIMEOUT_MS, WEBHOOK_POLL_INTERVAL_MS, WEBHOOK_RETRY_BASE_MS and WEBHOOK_CONCURRENCY must be at least 1')
  }
  if (c.webhookRetryHorizonMs < 1 || c.webhookRetryMaxDelayMs < 1) {
    throw new ConfigError('WEBHOOK_RETRY_HORIZON_S and WEBHOOK_RETRY_MAX_DELAY_S must be at least 1')
  }
  if (c.webhookRetentionMs < 86_400_000) throw new ConfigError('WEBHOOK_RETENTION_DAYS must be at least 1')
  if (Number.isNaN(c.legacySunset.getTime())) throw new ConfigError('LEGACY_SUNSET must be a date')
  // RFC 6797's directives; a typo would otherwise be sent to every browser, which ignores the whole header.
  if (c.hsts !== undefined && !/^max-age=\d+(; ?includeSubDomains)?(; ?preload)?$/i.test(c.hsts)) {
    throw new ConfigError('HSTS must be off or a Strict-Transport-Security value such as "max-age=31536000; includeSubDomains"')
  }
  if ((c.bootstrapAdminUsername === undefined) !== (c.bootstrapAdminPassword === undefined)) {
    throw new ConfigError('GATEHOUSE_ADMIN_USERNAME and GATEHOUSE_ADMIN_PASSWORD go together')
  }
  // The API's username rule, which the bootstrap path does not pass through otherwise.
  if (c.bootstrapAdminUsername !== undefined && !new RegExp(USERNAME_PATTERN).test(c.bootstrapAdminUsername)) {
    throw new ConfigError('GATEHOUSE_ADMIN_USERNAME must be 1 to 64 characters from A-Z a-z 0-9 . _ @ -')
  }
  c.mfaKeyRing = completeKeyRing(c.mfaEncryptionKey, c.mfaKeyRing, message => new ConfigError(message))
  c.mfaEncryptionKey = c.mfaKeyRing[0]
  if (c.mfaMaxFailures < 1) throw new ConfigError('MFA_MAX_FAILURES must be at least 1')
  if (c.oidcRedirectOrigin !== undefined && !/^https?:\/\/[^/]+$/.test(c.oidcRedirectOrigin)) {
    throw new ConfigError(`OIDC_REDIRECT_ORIGIN looks like https://ui.example.com, got "${c.oidcRedirectOrigin}"`)
  }
  for (const origin of c.webauthnOrigins) {
    if (!/^https?:\/\/[^/]+$/.test(origin)) throw new ConfigError(`WEBAUTHN_ORIGINS entries look like https://ui.example.com, got "${origin}"`)
  }
  validateMail(c)
  return Object.freeze(c)
}

function validateMail (c: Config): void {
  if (c.publicUrl !== undefined) {
    let url: URL | undefined
    try {
      url = new URL(c.publicUrl)
    } catch {}
    if (url === undefined || !/^https?:$/.test(url.protocol) || url.search !== '' || url.hash !== '' || url.username !== '' || c.publicUrl.endsWith('/')) {
      throw new ConfigError(`PUBLIC_URL looks like https://pipelines.example.com/auth (no trailing slash, query or fragment), got "${c.publicUrl}"`)
    }
  }
  if (c.productName.length > 100 || /[\p{Cc}]/u.test(c.productName)) throw new ConfigError('PRODUCT_NAME must be at most 100 characters, without control characters')
  if (c.mailTimeoutMs < 1 || c.mailPollIntervalMs < 1 || c.mailRetryBaseMs < 1 || c.mailRetryMaxDelayMs < 1 || c.mailRetryHorizonMs < 1) {
    throw new ConfigError('MAIL_TIMEOUT_MS, MAIL_POLL_INTERVAL_MS, MAIL_RETRY_BASE_MS, MAIL_RETRY_MAX_DELAY_S and MAIL_RETRY_HORIZON_S must be at least 1')
  }
  if (c.smtpUrl === undefined) return
  let smtp: URL | undefined
  try {
    smtp = new URL(c.smtpUrl)
  } catch {}
  if (smtp === undefined || !/^smtps?:$/.test(smtp.protocol) || smtp.hostname === '') {
    throw new ConfigError('SMTP_URL looks like smtp://user:password@mail.example.com:587 or smtps://…:465')
  }
  // Links in mail must lead people to where they reach the service, which the service cannot know by itself.
  if (c.publicUrl === undefined) throw new ConfigError('PUBLIC_URL is required with SMTP_URL: links in mail are built from it')
  if (c.mailFrom === undefined) throw new ConfigError('MAIL_FROM is required with SMTP_URL')
  if (/[\r\n]/.test(c.mailFrom)) throw new ConfigError('MAIL_FROM must be one line')
}

/**
 * A path on this origin and nothing else: one leading `/` (not `//` or `/\`,
 * which browsers read as another host), no backslash or control character,
 * at most 2048 characters. What the sign-in page accepts as `next`.
 */
export function isSameOriginPath (value: string): boolean {
  return value.length <= 2048 && /^\/(?![/\\])/.test(value) && !/[\p{Cc}\\]/u.test(value)
}

/**
 * Settings an earlier release read and this one does not, each with what
 * took its place. Set, one is ignored, and the start says so (server.ts):
 * an environment written for the earlier release still starts.
 */
export const RETIRED_SETTINGS: Readonly<Record<string, string>> = {
  DATABASE_READ_PIPELINES: 'no longer needed: every query takes a connection of the pool, whose size is DATABASE_POOL_SIZE'
}

/** One warning for each retired setting this environment sets. */
export function retiredSettingWarnings (env: NodeJS.ProcessEnv): string[] {
  return Object.entries(RETIRED_SETTINGS)
    .filter(([name]) => env[name] !== undefined)
    .map(([name, instead]) => `${name} is set but no longer read, and is ignored: ${instead}`)
}

declare module 'fastify' {
  interface FastifyInstance {
    config: Config
  }
}
