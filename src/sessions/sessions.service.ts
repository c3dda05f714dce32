import type { Config } from '../config.ts'
import { toBool, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { Principal, RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.service.ts'
import { revokeKeysRecorded } from '../api-keys/api-keys.service.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { checkPasswordPolicy, passwordPolicyOf } from '../lib/password-policy.ts'
import type { PasswordHasher } from '../lib/passwords.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'
import { toUser } from '../users/users.service.ts'
import type { User } from '../users/users.schemas.ts'
import type { FailureCounter } from './failure-counter.ts'
import { endSession, endSessionsOfUser, findSessionByDigest, insertSession, touchSession } from './sessions.repository.ts'

/** Distinguishes a session token from an API key at a glance (and for the credential check). */
export const SESSION_TOKEN_PREFIX = 'gatehouse_session_'
/** How stale `last_seen_at` may get; the idle time-out is measured from it. */
const TOUCH_INTERVAL_MS = 60_000

export interface SessionsDeps {
  db: Db
  passwords: PasswordHasher
  failures: FailureCounter
  config: Pick<Config, 'sessionIdleTimeoutMs' | 'sessionAbsoluteTimeoutMs' | 'loginMaxFailuresPerAccount' | 'loginMaxFailuresPerAddress' |
  'loginFailureWindowMs' | 'accountLockThreshold' | 'accountLockMs' | 'passwordMinLength' | 'passwordMaxLength'>
  /** A hash with current parameters to verify against when there is no real one, so every failure costs the same. */
  dummyHash: string
}

export interface SignIn { token: string, sessionId: string, expiresAt: string, user: User }

/** The one answer to every failed sign-in: unknown user, wrong password, disabled or locked account alike. */
function invalidCredentials (): AppError {
  return new AppError('invalid_credentials', 401, 'The username or password is not right, or this account cannot sign in.')
}

export type FailureReason = 'unknown_user' | 'wrong_password' | 'no_password' | 'disabled' | 'locked'

/** Throttling keys: one account from one address, and one address across accounts. */
function throttleKeys (identifier: string, ip: string): { account: string, address: string } {
  return { account: `acct:${identifier.toLowerCase()}:${ip}`, address: `addr:${ip}` }
}

/** Answers 429 before any password work when this account+address or this address has failed too often. */
async function assertNotThrottled (deps: SessionsDeps, identifier: string, ip: string): Promise<void> {
  const keys = throttleKeys(identifier, ip)
  const [account, address] = await Promise.all([deps.failures.get(keys.account), deps.failures.get(keys.address)])
  const over = [
    account.count >= deps.config.loginMaxFailuresPerAccount ? { ...account, limit: deps.config.loginMaxFailuresPerAccount } : undefined,
    address.count >= deps.config.loginMaxFailuresPerAddress ? { ...address, limit: deps.config.loginMaxFailuresPerAddress } : undefined
  ].filter(c => c !== undefined)
  if (over.length > 0) {
    // The budget that keeps the caller out longest is the one to report.
    const binding = over.reduce((a, b) => b.resetMs > a.resetMs ? b : a)
    const retryAfter = Math.max(1, Math.ceil(binding.resetMs / 1000))
    throw new AppError('rate_limited', 429, 'Too many failed sign-ins; wait before trying again.', {
      headers: {
        'Retry-After': String(retryAfter),
        'RateLimit-Limit': String(binding.limit),
        'RateLimit-Remaining': '0',
        'RateLimit-Reset': String(retryAfter)
      }
    })
  }
}

/**
 * Signs a user in by username or email. Every failure, whatever its reason,
 * runs one argon2 verification (against a dummy hash when there is no real
 * one) and answers the same 401, so neither the answer nor its timing tells
 * whether an account exists, is disabled or is locked. The reason is kept in
 * the `user.login_failed` event for administrators.
 */
export async function signIn (deps: SessionsDeps, ctx: RequestContext & { userAgent: string | null }, identifier: string, password: string): Promise<SignIn> {
  const ip = ctx.clientIp ?? 'unknown'
  await assertNotThrottled(deps, identifier, ip)
  const key = identifier.toLowerCase()
  const candidates = await deps.db.selectFrom('users').selectAll()
    .where(eb => eb.or([eb('username_key', '=', key), eb('email_key', '=', key)]))
    .execute()
  // A username match wins over someone else's email that happens to read the same.
  const user = candidates.find(u => u.username_key === key) ?? candidates[0]
  const valid = await deps.passwords.verify(user?.password_hash ?? deps.dummyHash, password)
  const now = new Date()

  let reason: FailureReason | undefined
  if (user === undefined) reason = 'unknown_user'
  else if (user.password_hash === null) reason = 'no_password'
  else if (toBool(user.disabled)) reason = 'disabled'
  else if (user.locked_until !== null && new Date(user.locked_until) > now) reason = 'locked'
  else if (!valid) reason = 'wrong_password'

  if (reason !== undefined) {
    const keys = throttleKeys(identifier, ip)
    await Promise.all([
      deps.failures.increment(keys.account, deps.config.loginFailureWindowMs),
      deps.failures.increment(keys.address, deps.config.loginFailureWindowMs)
    ])
    await deps.db.transaction().execute(async trx => {
      if (user !== undefined && reason === 'wrong_password') {
        // A lock that has run out starts the count afresh; otherwise one more mistake would re-lock at once.
        const lockOver = user.locked_until !== null && new Date(user.locked_until) <= now
        const failed = (lockOver ? 0 : user.failed_logins) + 1
        const locks = failed >= deps.config.accountLockThreshold
        await trx.updateTable('users').set({
          failed_logins: failed,
          ...(locks ? { locked_until: new Date(now.getTime() + deps.config.accountLockMs).toISOString() } : {})
        }).where('id', '=', user.id).execute()
        if (locks) {
          await recordEvent(trx, ctx, 'user.locked', { type: 'user', id: user.id }, { failed_logins: failed, locked_for_s: deps.config.accountLockMs / 1000 })
        }
      }
      await recordEvent(trx, ctx, 'user.login_failed', user !== undefined ? { type: 'user', id: user.id } : null, {
        reason, identifier: identifier.slice(0, 254)
      })
    })
    throw invalidCredentials()
  }

  // Hashes made with weaker parameters than today's are replaced now, while the password is at hand.
  const rehash = deps.passwords.needsRehash(user!.password_hash!) ? await deps.passwords.hash(password) : undefined
  const token = randomSecret(SESSION_TOKEN_PREFIX)
  const sessionId = newId()
  const at = now.toISOString()
  const expiresAt = new Date(now.getTime() + deps.config.sessionAbsoluteTimeoutMs).toISOString()
  const signedIn = await deps.db.transaction().execute(async trx => {
    const updated = await trx.updateTable('users')
      .set({ last_login_at: at, failed_logins: 0, locked_until: null, ...(rehash !== undefined ? { password_hash: rehash } : {}) })
      .where('id', '=', user!.id)
      .returning(['id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'])
      .executeTakeFirstOrThrow()
    await insertSession(trx, {
      id: sessionId,
      user_id: user!.id,
      digest: digestOf(token),
      created_at: at,
      last_seen_at: at,
      expires_at: expiresAt,
      ended_at: null,
      client_ip: ctx.clientIp,
      user_agent: ctx.userAgent?.slice(0, 512) ?? null
    })
    await recordEvent(trx, { ...ctx, actorType: 'user', actorId: user!.id }, 'user.login_succeeded', { type: 'user', id: user!.id }, {
      session_id: sessionId, ...(rehash !== undefined ? { password_rehashed: true } : {})
    })
    return updated
  })
  await deps.failures.reset(throttleKeys(identifier, ip).account)
  return { token, sessionId, expiresAt, user: toUser(signedIn) }
}

/**
 * The principal a session token stands for, or undefined when it is unknown,
 * ended, past its idle or absolute time-out, or its user is disabled.
 */
export async function authenticateSession (deps: Pick<SessionsDeps, 'db' | 'config'>, token: string): Promise<Principal | undefined> {
  const row = await findSessionByDigest(deps.db, digestOf(token))
  if (row === undefined || row.ended_at !== null || toBool(row.disabled)) return undefined
  const now = Date.now()
  const lastSeen = new Date(row.last_seen_at).getTime()
  if (new Date(row.expires_at).getTime() <= now || lastSeen + deps.config.sessionIdleTimeoutMs <= now) return undefined
  if (now - lastSeen > TOUCH_INTERVAL_MS) await touchSession(deps.db, row.id, new Date(now).toISOString())
  return {
    type: 'session',
    id: row.id,
    userId: row.user_id,
    user: { id: row.user_id, username: row.username, role: row.role, groups: toStringArray(row.groups) },
    scopes: new Set(row.role === 'admin' ? ['admin'] : [])
  }
}

export async function signOut (db: Db, ctx: RequestContext, principal: Principal): Promise<void> {
  if (principal.type !== 'session') {
    throw new AppError('forbidden', 403, 'Sign-out ends a session; this request was made with an API key (revoke the key instead).')
  }
  await db.transaction().execute(async trx => {
    if (await endSession(trx, principal.id, nowIso())) {
      await recordEvent(trx, ctx, 'session.ended', { type: 'session', id: principal.id }, { reason: 'logout', user_id: principal.userId })
    }
  })
}

/**
 * Ends a user's sessions (all, or all but the current one) with an event
 * each; used when the user is disabled or deleted and when the password changes.
 */
export async function endSessionsRecorded (trx: Db, ctx: RequestContext, userId: string, reason: string, exceptId?: string): Promise<void> {
  for (const id of await endSessionsOfUser(trx, userId, nowIso(), exceptId)) {
    await recordEvent(trx, ctx, 'session.ended', { type: 'session', id }, { reason, user_id: userId })
  }
}

/**
 * A signed-in user's own password change. Needs the current password;
 * ends the user's other sessions and revokes their API keys, since whoever
 * knew the old password may hold those.
 */
export async function changeOwnPassword (deps: SessionsDeps, principal: Principal, ctx: RequestContext, currentPassword: string, newPassword: string): Promise<void> {
  if (principal.type !== 'session' || principal.userId === null) {
    throw new AppError('forbidden', 403, 'Changing your own password needs a signed-in session.')
  }
  const user = await deps.db.selectFrom('users').selectAll().where('id', '=', principal.userId).executeTakeFirst()
  if (user === undefined) throw invalidCredentials()
  // Guessing the current password through a stolen session is throttled like guessing it at sign-in.
  const ip = ctx.clientIp ?? 'unknown'
  await assertNotThrottled(deps, user.username, ip)
  const valid = await deps.passwords.verify(user.password_hash ?? deps.dummyHash, currentPassword)
  if (!valid || user.password_hash === null) {
    const keys = throttleKeys(user.username, ip)
    await Promise.all([
      deps.failures.increment(keys.account, deps.config.loginFailureWindowMs),
      deps.failures.increment(keys.address, deps.config.loginFailureWindowMs)
    ])
    await recordEvent(deps.db, ctx, 'user.login_failed', { type: 'user', id: user.id }, { reason: 'wrong_password', during: 'password_change' })
    throw new AppError('invalid_credentials', 401, 'The current password is not right.', {
      errors: [{ in: 'body', pointer: '/current_password', detail: 'does not match' }]
    })
  }
  checkPasswordPolicy(newPassword, user.username, passwordPolicyOf(deps.config), '/new_password')
  const hash = await deps.passwords.hash(newPassword)
  const at = nowIso()
  await deps.db.transaction().execute(async trx => {
    await trx.updateTable('users')
      .set({ password_hash: hash, password_changed_at: at, updated_at: at, version: user.version + 1 })
      .where('id', '=', user.id).execute()
    await recordEvent(trx, ctx, 'user.password_changed', { type: 'user', id: user.id }, { by: 'self', password: '[redacted]' })
    await endSessionsRecorded(trx, ctx, user.id, 'password_changed', principal.id)
    await revokeKeysRecorded(trx, ctx, user.id, 'password_changed')
  })
}
