import { validate as isUuid } from 'uuid'
import type { Config } from '../config.ts'
import { toBool, toIso, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { isAdmin, type Principal, type RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { checkPasswordPolicy, passwordPolicyOf } from '../lib/password-policy.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'
import { deviceOf, USER_AGENT_MAX_LENGTH, userAgentData } from '../lib/user-agent.ts'
import { findPublicUserById, findUserById, toUser } from '../users/users.repository.ts'
import { changeOwnPasswordRecorded } from '../users/users.lifecycle.ts'
import { isDeviceOf, issueDeviceToken } from './device-trust.ts'
import {
  deleteSessionsEndedBefore, deleteSignInAddressesBefore, endSession, endSessionByDigest, endSessionOfUser, endSessionsRecorded, findSessionByDigest, hasSignedInFrom,
  listLiveSessionsOfUser, markSessionReauthenticated, recordSignInWithSession, touchSession
} from './sessions.repository.ts'
import { MAX_LISTED_SESSIONS, type SessionSummary } from './sessions.schemas.ts'
import { reserveAttempt, throttleBudgets } from './throttle.ts'
import type { SessionsDeps, SignIn, SignInContext, SignInOpening } from './sessions.types.ts'

/** Distinguishes a session token from an API key at a glance (and for the credential check). */
export const SESSION_TOKEN_PREFIX = 'gatehouse_session_'
/** How stale `last_seen_at` may get; the idle time-out is measured from it. */
const TOUCH_INTERVAL_MS = 60_000

/** The one answer to every failed sign-in: unknown user, wrong password, disabled or locked account alike. */
export function invalidCredentials (): AppError {
  return new AppError('invalid_credentials', 401, 'The username or password is not right, or this account cannot sign in.')
}

/**
 * Whether a sign-in comes from a new device, for the notice of that name
 * (docs/email.md#new-device): the browser holds no device token of this
 * account, the account was not signed in to from this address within
 * LOGIN_KNOWN_CLIENT_DAYS, and it has been signed in to before (the first
 * sign-in of an account is not news to its owner). Only asked while the
 * notice is on: without it the sign-in pays for none of these reads.
 */
async function isNewDevice (deps: SessionsDeps, ctx: SignInContext, userId: string, now: Date): Promise<boolean> {
  const { config } = deps
  if (config.smtpUrl === undefined || !config.mailNotices.includes('new_device_sign_in') || config.loginKnownClientDays === 0) return false
  const maxAgeMs = config.loginKnownClientDays * 86_400_000
  if (isDeviceOf(await deps.deviceKey(), ctx.deviceToken, userId, maxAgeMs, now)) return false
  if (ctx.clientIp !== null && await hasSignedInFrom(deps.db, userId, ctx.clientIp, new Date(now.getTime() - maxAgeMs).toISOString())) return false
  return (await findUserById(deps.db, userId))?.last_login_at != null
}

/**
 * Starts a session for a user whose credentials were just checked: the
 * password, and the second factor when one was asked for (`mfa` names it).
 * A lock is left in place for a known client that got in despite it.
 */
export async function openSession (
  deps: SessionsDeps, ctx: SignInContext, userId: string,
  options: {
    /** How the person got this far, for their list of sessions; null: not known (a second step begun before migration 0011). */
    opened: SignInOpening | null
    locked: boolean
    rehash?: string | undefined
    now: Date
    mfa?: 'totp' | 'recovery_code' | 'passkey'
    passwordless?: boolean
    /** Where the password was checked, when not here (the `via` of `user.login_succeeded`). */
    via?: string
    /** More for `user.login_succeeded` (a directory mapping's `role_kept`). */
    note?: Record<string, unknown>
    /** Runs first in the session's transaction (spending the second factor); throwing rolls the sign-in back. */
    within?: (trx: Db) => Promise<void>
  }
): Promise<SignIn> {
  const { locked, rehash, now } = options
  const newDevice = await isNewDevice(deps, ctx, userId, now)
  const token = randomSecret(SESSION_TOKEN_PREFIX)
  const sessionId = newId()
  const at = now.toISOString()
  const expiresAt = new Date(now.getTime() + deps.config.sessionAbsoluteTimeoutMs).toISOString()
  const signedIn = await deps.db.transaction().execute(async trx => {
    await options.within?.(trx)
    // A known client getting in does not lift a lock that strangers are still running into.
    const updated = await recordSignInWithSession(trx, {
      id: sessionId,
      user_id: userId,
      digest: digestOf(token),
      created_at: at,
      last_seen_at: at,
      expires_at: expiresAt,
      ended_at: null,
      client_ip: ctx.clientIp,
      user_agent: ctx.userAgent?.slice(0, USER_AGENT_MAX_LENGTH) ?? null,
      mfa: options.mfa !== undefined,
      sign_in_method: options.opened?.method ?? null,
      sign_in_provider: options.opened?.provider ?? null
    }, { liftLock: !locked, rehash, address: ctx.clientIp !== null && deps.config.loginKnownClientDays > 0 ? ctx.clientIp : null })
    await recordEvent(trx, { ...ctx, actorType: 'user', actorId: userId }, 'user.login_succeeded', { type: 'user', id: userId }, {
      session_id: sessionId,
      ...(rehash !== undefined ? { password_rehashed: true } : {}),
      ...(locked ? { while_locked: true } : {}),
      ...(options.mfa !== undefined ? { mfa: options.mfa } : {}),
      ...(options.passwordless === true ? { passwordless: true } : {}),
      ...(options.via !== undefined ? { via: options.via } : {}),
      ...(newDevice ? { new_device: true } : {}),
      ...userAgentData(ctx.userAgent),
      ...options.note
    })
    // The session this browser still held, whoever's it was, ends with the new one's start:
    // a cookie planted before the sign-in (session fixation) or left behind by someone else.
    if (ctx.previousSessionToken !== null) {
      const previous = await endSessionByDigest(trx, digestOf(ctx.previousSessionToken), at)
      if (previous !== undefined) {
        await recordEvent(trx, ctx, 'session.ended', { type: 'session', id: previous.id }, { reason: 'signed_in_again', user_id: previous.user_id })
      }
    }
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

/** Your own sessions are managed with a session: an API key (even one of yours) cannot list or end them. */
function ownSession (principal: Principal): { sessionId: string, userId: string } {
  if (principal.type !== 'session' || principal.userId === null) {
    throw new AppError('forbidden', 403, 'Your sessions are managed with a signed-in session, not an API key.')
  }
  return { sessionId: principal.id, userId: principal.userId }
}

function sessionNotFound (id: string): AppError {
  return new AppError('session_not_found', 404, `No live session has the id ${id.slice(0, 64)}.`)
}

async function liveSessions (deps: Pick<SessionsDeps, 'db' | 'config'>, userId: string, currentId: string | undefined): Promise<SessionSummary[]> {
  const now = Date.now()
  const rows = await listLiveSessionsOfUser(deps.db, userId, new Date(now).toISOString(),
    new Date(now - deps.config.sessionIdleTimeoutMs).toISOString(), MAX_LISTED_SESSIONS)
  return rows.map(row => ({
    id: row.id,
    created_at: toIso(row.created_at),
    last_seen_at: toIso(row.last_seen_at),
    expires_at: toIso(row.expires_at),
    client_ip: row.client_ip,
    user_agent: row.user_agent,
    device: deviceOf(row.user_agent),
    method: row.sign_in_method,
    provider: row.sign_in_provider,
    mfa: toBool(row.mfa),
    current: row.id === currentId
  }))
}

/** The signed-in user's sessions that still work, the one asking marked `current`. */
export async function listOwnSessions (deps: Pick<SessionsDeps, 'db' | 'config'>, principal: Principal): Promise<SessionSummary[]> {
  const { sessionId, userId } = ownSession(principal)
  return await liveSessions(deps, userId, sessionId)
}

/**
 * Ends one of the signed-in user's sessions (this one too, like signing
 * out); another user's session id is not found. Returns whether it was the
 * current one, whose cookie then goes.
 */
export async function endOwnSession (db: Db, ctx: RequestContext, principal: Principal, id: string): Promise<{ current: boolean }> {
  const { sessionId, userId } = ownSession(principal)
  // The pages pass the id from their address unchecked; PostgreSQL would refuse a non-UUID outright.
  if (!isUuid(id)) throw sessionNotFound(id)
  await db.transaction().execute(async trx => {
    if (!await endSessionOfUser(trx, userId, id, nowIso())) throw sessionNotFound(id)
    await recordEvent(trx, ctx, 'session.ended', { type: 'session', id }, { reason: 'ended_by_user', user_id: userId })
  })
  return { current: id === sessionId }
}

/** Ends every session of the signed-in user but the one asking ("sign out everywhere else"). */
export async function endOtherOwnSessions (db: Db, ctx: RequestContext, principal: Principal): Promise<number> {
  const { sessionId, userId } = ownSession(principal)
  return await db.transaction().execute(async trx => await endSessionsRecorded(trx, ctx, userId, 'ended_by_user', sessionId))
}

function assertAdmin (principal: Principal): void {
  if (!isAdmin(principal)) throw new AppError('forbidden', 403, 'Another user\'s sessions are for admins.')
}

async function assertUser (db: Db, userId: string): Promise<void> {
  if (await findPublicUserById(db, userId) === undefined) throw new AppError('user_not_found', 404, `No user has the id ${userId}.`)
}

/** For admins: a user's sessions that still work (`current` marks the admin's own, when it is the user's). */
export async function listUserSessions (deps: Pick<SessionsDeps, 'db' | 'config'>, principal: Principal, userId: string): Promise<SessionSummary[]> {
  assertAdmin(principal)
  await assertUser(deps.db, userId)
  return await liveSessions(deps, userId, principal.type === 'session' ? principal.id : undefined)
}

/** For admins: ends one session of a user (`session.ended`, reason `ended_by_admin`); API keys stay. */
export async function endUserSession (db: Db, ctx: RequestContext, principal: Principal, userId: string, id: string): Promise<{ current: boolean }> {
  assertAdmin(principal)
  if (!isUuid(id)) throw sessionNotFound(id)
  await db.transaction().execute(async trx => {
    if (!await endSessionOfUser(trx, userId, id, nowIso())) {
      await assertUser(trx, userId)
      throw sessionNotFound(id)
    }
    await recordEvent(trx, ctx, 'session.ended', { type: 'session', id }, { reason: 'ended_by_admin', user_id: userId })
  })
  return { current: principal.type === 'session' && principal.id === id }
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
  const user = await findUserById(deps.db, principal.userId)
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
  const checkedHash = user.password_hash
  await deps.failures.release(budgets.map(b => b.key))
  checkPasswordPolicy(newPassword, { username: user.username, emails: [user.email] }, passwordPolicyOf(deps.config), '/new_password')
  const hash = await deps.passwords.hash(newPassword)
  await deps.db.transaction().execute(async trx => {
    await changeOwnPasswordRecorded(trx, ctx, { id: user.id, checkedHash }, hash, principal.id)
    await markSessionReauthenticated(trx, principal.id, nowIso())
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
