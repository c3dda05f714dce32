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
import type { Budget, FailureCounter } from './failure-counter.ts'
import { isDeviceOf, issueDeviceToken } from './device-trust.ts'
import { openSignInChallenge, secondFactorNeeded, type MfaPending } from '../mfa/mfa.service.ts'
import { normaliseDn, type LdapConfig } from '../sso/ldap.config.ts'
import { applyDirectoryAccess, checkWithDirectory, LDAP_PROVIDER, userForDirectoryEntry, type DirectoryUser, type ProvisionRefusal } from '../sso/ldap.service.ts'
import { findIdentity, findIdentityOfUser } from '../sso/identities.repository.ts'
import {
  countFailedSignIn, deleteSessionsEndedBefore, deleteSignInAddressesBefore, endSession, endSessionsOfUser, findSessionByDigest, findUsersBySignInKey, hasSignedInFrom, insertSession, lockAccount, markSessionReauthenticated, recordSignInAddress, touchSession
} from './sessions.repository.ts'

/** Distinguishes a session token from an API key at a glance (and for the credential check). */
export const SESSION_TOKEN_PREFIX = 'gatehouse_session_'
/** How stale `last_seen_at` may get; the idle time-out is measured from it. */
const TOUCH_INTERVAL_MS = 60_000

export interface SessionsDeps {
  db: Db
  passwords: PasswordHasher
  failures: FailureCounter
  config: Pick<Config, 'sessionIdleTimeoutMs' | 'sessionAbsoluteTimeoutMs' | 'loginMaxFailuresPerAccount' | 'loginMaxFailuresPerAddress' |
  'loginFailureWindowMs' | 'accountLockThreshold' | 'accountLockMs' | 'loginKnownClientDays' | 'passwordMinLength' | 'passwordMaxLength' |
  'mfaRequired' | 'mfaEncryptionKey' | 'mfaMaxFailures' | 'webauthnRpId' | 'webauthnOrigins' | 'passwordSignIn' | 'ldap' | 'reauthWindowMs'>
  /** A hash with current parameters to verify against when there is no real one, so every failure costs the same. */
  dummyHash: string
  /** Signs device tokens (see device-trust.ts); the same for every instance. */
  deviceKey: () => Promise<Buffer>
}

export interface SignInContext extends RequestContext {
  userAgent: string | null
  /** The device token the browser sent, if any. */
  deviceToken: string | null
}

export interface SignIn {
  token: string
  sessionId: string
  expiresAt: string
  user: User
  /** A fresh device token for this account, for the browser to keep. */
  deviceToken: string
}

/** A password sign-in ends in a session, or, for a user with (or owing) a second factor, in a challenge for it. */
export type SignInResult = ({ kind: 'session' } & SignIn) | ({ kind: 'mfa' } & MfaPending)

/** The one answer to every failed sign-in: unknown user, wrong password, disabled or locked account alike. */
function invalidCredentials (): AppError {
  return new AppError('invalid_credentials', 401, 'The username or password is not right, or this account cannot sign in.')
}

function passwordSignInDisabled (everyone: boolean): AppError {
  return new AppError('password_sign_in_disabled', 403, everyone
    ? 'Sign-in with a password is turned off here; use single sign-on or a passkey.'
    : 'Sign-in with a password is turned off for this account; use single sign-on or a passkey.')
}

export type FailureReason = 'unknown_user' | 'wrong_password' | 'no_password' | 'disabled' | 'locked' |
  'password_sign_in_disabled' | 'directory_no_entry' | 'directory_ambiguous' | 'identity_conflict' | ProvisionRefusal

type UserRow = Awaited<ReturnType<typeof findUsersBySignInKey>>[number]

/** What checking the credentials found, before the account's own state (disabled, locked) is looked at. */
interface CredentialCheck {
  user: UserRow | undefined
  valid: boolean
  /** A failure the check itself decided (no directory entry, no JIT, …). */
  reason?: FailureReason
  /** The directory's entry, when the directory accepted the password. */
  entry?: DirectoryUser
}

/**
 * The identifier as names are compared: a directory ignores case, surrounding
 * spaces and runs of inner spaces (LDAP's caseIgnoreMatch), so " Bob " signs
 * in as bob there. Looking the user up and keying the failure budget by this
 * form gives every spelling of one name the same budget. No local username or
 * email has spaces, so locally it only forgives stray ones.
 */
export function signInKey (identifier: string): string {
  return identifier.trim().replace(/\s+/g, ' ').toLowerCase()
}

/**
 * Throttling budgets: one account from one address, and one address across
 * accounts. The account is the user the identifier names, so a username and
 * an email of the same person share one budget; an identifier that names
 * nobody is counted as typed.
 */
export function throttleBudgets (deps: Pick<SessionsDeps, 'config'>, account: string, ip: string): Budget[] {
  return [
    { key: `acct:${account}:${ip}`, limit: deps.config.loginMaxFailuresPerAccount },
    { key: `addr:${ip}`, limit: deps.config.loginMaxFailuresPerAddress }
  ]
}

/**
 * Takes this attempt's unit from its budgets before any password work, or
 * answers 429 when one of them is spent. Atomic, so a burst of concurrent
 * guesses gets exactly as many verifications as the budget allows.
 */
export async function reserveAttempt (deps: Pick<SessionsDeps, 'failures' | 'config'>, budgets: Budget[]): Promise<void> {
  const reservation = await deps.failures.reserve(budgets, deps.config.loginFailureWindowMs)
  if (reservation.allowed) return
  const retryAfter = Math.max(1, Math.ceil(reservation.resetMs / 1000))
  throw new AppError('rate_limited', 429, 'Too many failed sign-ins; wait before trying again.', {
    headers: {
      'Retry-After': String(retryAfter),
      'RateLimit-Limit': String(reservation.limit),
      'RateLimit-Remaining': '0',
      'RateLimit-Reset': String(retryAfter)
    }
  })
}

/**
 * A known client of this account: a browser holding its device token, or an
 * address it signed in from before, within LOGIN_KNOWN_CLIENT_DAYS. Known
 * clients are not shut out by the account lock, so strangers guessing cannot
 * lock the owner out; their failures are still throttled.
 */
async function isKnownClient (deps: SessionsDeps, ctx: SignInContext, userId: string, now: Date): Promise<boolean> {
  const days = deps.config.loginKnownClientDays
  if (days === 0) return false
  const maxAgeMs = days * 86_400_000
  if (isDeviceOf(await deps.deviceKey(), ctx.deviceToken, userId, maxAgeMs, now)) return true
  return ctx.clientIp !== null && await hasSignedInFrom(deps.db, userId, ctx.clientIp, new Date(now.getTime() - maxAgeMs).toISOString())
}

/**
 * Signs a user in by username or email, with a local password or, when LDAP
 * is configured, against the directory (docs/sso.md): a user linked to a
 * directory entry, and a name no local user has, are checked there; every
 * other local user with the local hash. Every failure, whatever its reason
 * and wherever the password was checked, runs one argon2 verification
 * (against a dummy hash when there is no real one) and answers the same 401,
 * so neither the answer nor its timing tells whether an account exists, is
 * disabled or is locked. The reason is kept in the `user.login_failed` event
 * for administrators. Local password sign-in turned off (PASSWORD_SIGN_IN,
 * or the user's `password_sign_in`) is said only once the password was right.
 */
export async function signIn (deps: SessionsDeps, ctx: SignInContext, identifier: string, password: string): Promise<SignInResult> {
  const ip = ctx.clientIp ?? 'unknown'
  const key = signInKey(identifier)
  const ldap = deps.config.ldap
  // Nothing a password could open here: the same answer for every name, before any lookup.
  if (!deps.config.passwordSignIn && ldap === undefined) throw passwordSignInDisabled(true)
  const candidates = await findUsersBySignInKey(deps.db, key)
  // A username match wins over someone else's email that happens to read the same.
  const local = candidates.find(u => u.username_key === key) ?? candidates[0]
  const viaDirectory = ldap !== undefined && (local === undefined || await findIdentityOfUser(deps.db, local.id, LDAP_PROVIDER) !== undefined)
  const budgets = throttleBudgets(deps, local !== undefined ? `user:${local.id}` : `name:${key}`, ip)
  await reserveAttempt(deps, budgets)
  let check: CredentialCheck
  try {
    check = viaDirectory ? await checkDirectory(deps, ldap!, ctx, local, identifier, password) : await checkLocal(deps, local, password)
  } catch (error) {
    // Not a failed guess (the hash queue was full, the directory is down): the unit goes back.
    await deps.failures.release(budgets.map(b => b.key))
    throw error
  }
  const { user, valid } = check
  const now = new Date()
  const locked = user?.locked_until != null && new Date(user.locked_until) > now
  // Only a lock or a failure to count needs to know; a plain success does not ask.
  const known = user !== undefined && (locked || !valid) && await isKnownClient(deps, ctx, user.id, now)
  const via = viaDirectory ? { via: LDAP_PROVIDER } : {}

  // A reason the check itself decided (no directory entry, no JIT, …) stands.
  let reason: FailureReason | undefined = check.reason
  if (reason === undefined) {
    if (user === undefined) reason = 'unknown_user'
    else if (!viaDirectory && user.password_hash === null) reason = 'no_password'
    else if (toBool(user.disabled)) reason = 'disabled'
    else if (locked && !known) reason = 'locked'
    else if (!valid) reason = 'wrong_password'
  }

  if (reason !== undefined) {
    await deps.db.transaction().execute(async trx => {
      // A known client's mistakes are throttled but do not count toward the lock it is exempt from.
      if (user !== undefined && reason === 'wrong_password' && !known) {
        const failed = await countFailedSignIn(trx, user.id, now.toISOString())
        if (failed === undefined) {
          // Locked by a concurrent attempt since this one read the account.
          reason = 'locked'
        } else if (failed >= deps.config.accountLockThreshold) {
          await lockAccount(trx, user.id, new Date(now.getTime() + deps.config.accountLockMs).toISOString())
          await recordEvent(trx, ctx, 'user.locked', { type: 'user', id: user.id }, { failed_logins: failed, locked_for_s: deps.config.accountLockMs / 1000 })
        }
      }
      await recordEvent(trx, ctx, 'user.login_failed', user !== undefined ? { type: 'user', id: user.id } : null, {
        reason, identifier: identifier.slice(0, 254), ...via, ...(known ? { known_client: true } : {})
      })
    })
    throw invalidCredentials()
  }

  // Not a failure: this attempt's unit goes back to the address, and the account starts afresh here.
  // A second factor still owed has a budget of its own (mfa.service.ts).
  const settle = async (): Promise<void> => {
    await Promise.all([deps.failures.reset(budgets[0]!.key), deps.failures.release([budgets[1]!.key])])
  }
  if (!viaDirectory && (!deps.config.passwordSignIn || !toBool(user!.password_sign_in))) {
    // The password was right, so saying why it cannot be used tells its owner, and only them, what to do.
    await recordEvent(deps.db, ctx, 'user.login_failed', { type: 'user', id: user!.id }, {
      reason: 'password_sign_in_disabled', identifier: identifier.slice(0, 254), ...(deps.config.passwordSignIn ? {} : { everyone: true })
    })
    await settle()
    throw passwordSignInDisabled(!deps.config.passwordSignIn)
  }

  let signingIn = user!
  if (viaDirectory) {
    // The directory's groups decide the role before anything depends on it (MFA_REQUIRED=admins).
    await applyDirectoryAccess(deps.db, ctx, ldap!, signingIn.id, check.entry!)
    signingIn = await findUserRow(deps.db, signingIn.id) ?? signingIn
  }
  // Hashes made with weaker parameters than today's are replaced now, while the password is at hand.
  const rehash = !viaDirectory && deps.passwords.needsRehash(signingIn.password_hash!) ? await deps.passwords.hash(password) : undefined
  const secondFactor = await secondFactorNeeded(deps, signingIn)
  if (secondFactor !== undefined) {
    const pending = await openSignInChallenge(deps, ctx, signingIn, secondFactor, rehash, now)
    await settle()
    return { kind: 'mfa', ...pending }
  }
  const signedIn = await openSession(deps, ctx, signingIn.id, { locked, rehash, now, ...(viaDirectory ? { via: LDAP_PROVIDER } : {}) })
  await settle()
  return { kind: 'session', ...signedIn }
}

async function checkLocal (deps: SessionsDeps, user: UserRow | undefined, password: string): Promise<CredentialCheck> {
  return { user, valid: await deps.passwords.verify(user?.password_hash ?? deps.dummyHash, password) }
}

/**
 * The directory's word on the password, and the gatehouse user it signs in
 * as. The dummy argon2 verification runs alongside, so a directory sign-in
 * costs what a local one does and timing does not tell local users apart.
 */
async function checkDirectory (
  deps: SessionsDeps, ldap: LdapConfig, ctx: SignInContext, local: UserRow | undefined, identifier: string, password: string
): Promise<CredentialCheck> {
  const [result] = await Promise.all([checkWithDirectory(ldap, identifier, password), deps.passwords.verify(deps.dummyHash, password)])
  if (result.kind === 'no_entry' || result.kind === 'ambiguous') {
    // A linked user the directory no longer lists (or no longer lets through the filter) is not a password guess.
    return { user: local, valid: false, reason: result.kind === 'ambiguous' ? 'directory_ambiguous' : local !== undefined ? 'directory_no_entry' : 'unknown_user' }
  }
  if (result.kind === 'wrong_password') {
    const linked = await findIdentity(deps.db, LDAP_PROVIDER, normaliseDn(result.dn))
    const user = linked !== undefined ? await findUserRow(deps.db, linked.user_id) : local
    return { user, valid: false }
  }
  const resolved = await userForDirectoryEntry(deps.db, ctx, ldap, result.user)
  if ('refused' in resolved) return { user: undefined, valid: false, reason: resolved.refused }
  // The typed name is a local user linked to another entry than the one the directory found for it.
  if (local !== undefined && resolved.userId !== local.id) return { user: local, valid: false, reason: 'identity_conflict' }
  return { user: local ?? await findUserRow(deps.db, resolved.userId), valid: true, entry: result.user }
}

async function findUserRow (db: Db, id: string): Promise<UserRow | undefined> {
  return await db.selectFrom('users').selectAll().where('id', '=', id).executeTakeFirst()
}

/**
 * Starts a session for a user whose credentials were just checked: the
 * password, and the second factor when one was asked for (`mfa` names it).
 * A lock is left in place for a known client that got in despite it.
 */
export async function openSession (
  deps: SessionsDeps, ctx: SignInContext, userId: string,
  options: {
    locked: boolean
    rehash?: string | undefined
    now: Date
    mfa?: 'totp' | 'recovery_code' | 'passkey'
    passwordless?: boolean
    /** Where the password was checked, when not here (the `via` of `user.login_succeeded`). */
    via?: string
    /** Runs first in the session's transaction (spending the second factor); throwing rolls the sign-in back. */
    within?: (trx: Db) => Promise<void>
  }
): Promise<SignIn> {
  const { locked, rehash, now } = options
  const token = randomSecret(SESSION_TOKEN_PREFIX)
  const sessionId = newId()
  const at = now.toISOString()
  const expiresAt = new Date(now.getTime() + deps.config.sessionAbsoluteTimeoutMs).toISOString()
  const signedIn = await deps.db.transaction().execute(async trx => {
    await options.within?.(trx)
    const updated = await trx.updateTable('users')
      // A known client getting in does not lift a lock that strangers are still running into.
      .set({ last_login_at: at, ...(locked ? {} : { failed_logins: 0, locked_until: null }), ...(rehash !== undefined ? { password_hash: rehash } : {}) })
      .where('id', '=', userId)
      .returning(['id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'password_sign_in', 'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'])
      .executeTakeFirstOrThrow()
    await insertSession(trx, {
      id: sessionId,
      user_id: userId,
      digest: digestOf(token),
      created_at: at,
      last_seen_at: at,
      expires_at: expiresAt,
      ended_at: null,
      client_ip: ctx.clientIp,
      user_agent: ctx.userAgent?.slice(0, 512) ?? null,
      mfa: options.mfa !== undefined
    })
    if (ctx.clientIp !== null && deps.config.loginKnownClientDays > 0) await recordSignInAddress(trx, userId, ctx.clientIp, at)
    await recordEvent(trx, { ...ctx, actorType: 'user', actorId: userId }, 'user.login_succeeded', { type: 'user', id: userId }, {
      session_id: sessionId,
      ...(rehash !== undefined ? { password_rehashed: true } : {}),
      ...(locked ? { while_locked: true } : {}),
      ...(options.mfa !== undefined ? { mfa: options.mfa } : {}),
      ...(options.passwordless === true ? { passwordless: true } : {}),
      ...(options.via !== undefined ? { via: options.via } : {})
    })
    return updated
  })
  return { token, sessionId, expiresAt, user: toUser(signedIn), deviceToken: issueDeviceToken(await deps.deviceKey(), userId, now) }
}

/**
 * The principal a session token stands for, or undefined when it is unknown,
 * ended, past its idle or absolute time-out, or its user is disabled.
 *
 * Under MFA_REQUIRED (admins or all), a session whose sign-in did not include
 * a second factor never acts as an admin, whenever and however its user
 * became one (OIDC admin_groups or LDAP_GROUP_MAP at a sign-in that stopped
 * at the second step, the API, the console, or a session from before the
 * policy): it acts, and /verify reports it, with the `user` role until its
 * owner signs in again with the factor (docs/mfa.md).
 */
export async function authenticateSession (deps: Pick<SessionsDeps, 'db' | 'config'>, token: string): Promise<Principal | undefined> {
  const row = await findSessionByDigest(deps.db, digestOf(token))
  if (row === undefined || row.ended_at !== null || toBool(row.disabled)) return undefined
  const now = Date.now()
  const lastSeen = new Date(row.last_seen_at).getTime()
  if (new Date(row.expires_at).getTime() <= now || lastSeen + deps.config.sessionIdleTimeoutMs <= now) return undefined
  const touched = now - lastSeen > TOUCH_INTERVAL_MS
  if (touched) await touchSession(deps.db, row.id, new Date(now).toISOString())
  const mfa = toBool(row.mfa)
  const role = row.role === 'admin' && (mfa || deps.config.mfaRequired === 'off') ? 'admin' : 'user'
  return {
    type: 'session',
    id: row.id,
    userId: row.user_id,
    user: { id: row.user_id, username: row.username, role, groups: toStringArray(row.groups) },
    scopes: new Set(role === 'admin' ? ['admin'] : []),
    mfa,
    validUntil: Math.min(new Date(row.expires_at).getTime(), (touched ? now : lastSeen) + deps.config.sessionIdleTimeoutMs)
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
 * A signed-in user's own password change. Needs the current password, which
 * is also the recent proof other changes to credentials ask for (so it
 * counts as a re-authentication of this session); ends the user's other
 * sessions and revokes their API keys, since whoever knew the old password
 * may hold those.
 */
export async function changeOwnPassword (deps: SessionsDeps, principal: Principal, ctx: RequestContext, currentPassword: string, newPassword: string): Promise<void> {
  if (principal.type !== 'session' || principal.userId === null) {
    throw new AppError('forbidden', 403, 'Changing your own password needs a signed-in session.')
  }
  const user = await deps.db.selectFrom('users').selectAll().where('id', '=', principal.userId).executeTakeFirst()
  if (user === undefined) throw invalidCredentials()
  // Guessing the current password through a stolen session is throttled like guessing it at sign-in.
  const budgets = throttleBudgets(deps, `user:${user.id}`, ctx.clientIp ?? 'unknown')
  await reserveAttempt(deps, budgets)
  const valid = await deps.passwords.verify(user.password_hash ?? deps.dummyHash, currentPassword)
  if (!valid || user.password_hash === null) {
    await recordEvent(deps.db, ctx, 'user.login_failed', { type: 'user', id: user.id }, { reason: 'wrong_password', during: 'password_change' })
    throw new AppError('invalid_credentials', 401, 'The current password is not right.', {
      errors: [{ in: 'body', pointer: '/current_password', detail: 'does not match' }]
    })
  }
  await deps.failures.release(budgets.map(b => b.key))
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
    await markSessionReauthenticated(trx, principal.id, at)
  })
}

/**
 * Housekeeping, hourly: sessions that ended more than a day ago are only
 * history, which the event log keeps; addresses not signed in from within
 * LOGIN_KNOWN_CLIENT_DAYS are no longer known.
 */
export async function purgeSignInHistory (db: Db, config: Pick<Config, 'loginKnownClientDays'>): Promise<{ sessions: number, addresses: number }> {
  const now = Date.now()
  const sessions = await deleteSessionsEndedBefore(db, new Date(now - 86_400_000).toISOString())
  const addresses = await deleteSignInAddressesBefore(db, new Date(now - config.loginKnownClientDays * 86_400_000).toISOString())
  return { sessions, addresses }
}
