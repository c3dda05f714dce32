import type { Config } from '../config.ts'
import { toBool, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { Principal, RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { checkPasswordPolicy, passwordPolicyOf } from '../lib/password-policy.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'
import { toUser } from '../users/users.repository.ts'
import { changeOwnPasswordRecorded } from '../users/users.lifecycle.ts'
import { issueDeviceToken } from './device-trust.ts'
import {
  deleteSessionsEndedBefore, deleteSignInAddressesBefore, endSession, findSessionByDigest, insertSession, markSessionReauthenticated, recordSignInAddress, touchSession
} from './sessions.repository.ts'
import { reserveAttempt, throttleBudgets } from './throttle.ts'
import type { SessionsDeps, SignIn, SignInContext, SignInOpening } from './sessions.types.ts'

/** Distinguishes a session token from an API key at a glance (and for the credential check). */
export const SESSION_TOKEN_PREFIX = 'gatehouse_session_'
/** How stale `last_seen_at` may get; the idle time-out is measured from it. */
const TOUCH_INTERVAL_MS = 60_000

/** The one answer to every failed sign-in: unknown user, wrong password, disabled or locked account alike. */
function invalidCredentials (): AppError {
  return new AppError('invalid_credentials', 401, 'The username or password is not right, or this account cannot sign in.')
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
      mfa: options.mfa !== undefined,
      sign_in_method: options.opened?.method ?? null,
      sign_in_provider: options.opened?.provider ?? null
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
  await deps.db.transaction().execute(async trx => {
    await changeOwnPasswordRecorded(trx, ctx, user, hash, principal.id)
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
