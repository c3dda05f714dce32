import type { Config } from '../config.ts'
import { toBool, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import type { BackgroundTasks } from '../lib/background.ts'
import { checkPasswordPolicy, passwordPolicyOf } from '../lib/password-policy.ts'
import type { PasswordResetLink } from './password-resets.schemas.ts'
import type { PasswordHasher } from '../lib/passwords.ts'
import type { FailureCounter } from '../sessions/failure-counter.ts'
import { listIdentitiesOfUser } from '../sso/identities.repository.ts'
import { releaseCodeAttempt, reserveCodeAttempt, tokenInvalid } from '../tokens/code-throttle.ts'
import { issueAndMailToken, issueTokenMail } from '../tokens/token-mail.ts'
import { findLiveToken, findTokenHolder, type PreparedCode, type TokenProof } from '../tokens/tokens.repository.ts'
import { checkTokenProof, prepareCode, useCheckedProof } from '../tokens/token-codes.ts'
import { enqueueMailRequest, isMailSending, type MailRequest } from '../mail/mail.outbox.ts'
import { assertMayChangeAccount, changeUserRecorded } from '../users/users.lifecycle.ts'
import { clearSignInLock, findUserById, type UserRow } from '../users/users.repository.ts'

/*
 * Password reset (docs/email.md#password-reset). A request is answered at
 * once, the same 202 for every name, after the same work for every name:
 * looking the account up, deciding, and issuing and mailing the link happen
 * after the answer, so neither the answer nor its time tells whether an
 * account exists, is disabled, or signs in only through single sign-on. With
 * SMTP the request is first written to the mail outbox (a request row, sealed),
 * and the mail worker resolves it (resolvePasswordResetRequest), so a crash
 * after the answer loses nothing; without SMTP nothing can be mailed and the
 * look-up runs in-process (lib/background.ts) to record the outcome. What
 * became of each request is in the event log (`user.password_reset_requested`,
 * `outcome`).
 */

/** The kind of the outbox row a reset request is queued as (mail/mail.outbox.ts, enqueueMailRequest). */
export const PASSWORD_RESET_REQUEST = 'password_reset_request'

export interface PasswordResetsDeps {
  db: Db
  passwords: PasswordHasher
  failures: FailureCounter
  background: BackgroundTasks
  config: Pick<Config, 'passwordSignIn' | 'passwordResetLifetimeMs' | 'passwordResetMaxPerHour' | 'passwordMinLength' | 'passwordMaxLength' | 'passwordContextWords' |
  'loginMaxFailuresPerAddress' | 'loginFailureWindowMs' | 'ldap' | 'publicUrl' | 'host' | 'port' | 'basePath'>
}

const HOUR_MS = 3_600_000
/** The provider of directory identities (sso/ldap.service.ts's LDAP_PROVIDER; a service may not import another). */
const DIRECTORY_PROVIDER = 'ldap'

/** Why an account gets no reset link; `mailed` when it got one. */
type RequestOutcome = 'mailed' | 'no_account' | 'no_email' | 'disabled' | 'invitation_pending' | 'password_sign_in_off' | 'directory_user' | 'single_sign_on_only' | 'throttled' | 'mail_unavailable'

function notOffered (): AppError {
  return new AppError('password_sign_in_disabled', 403, 'Passwords are not used here (PASSWORD_SIGN_IN=off), so there is none to reset; sign in with single sign-on or a passkey.')
}

function throttled (resetMs: number, limit: number): AppError {
  const retryAfter = String(Math.max(1, Math.ceil(resetMs / 1000)))
  return new AppError('rate_limited', 429, 'Too many password-reset requests; wait before asking again.', {
    headers: { 'Retry-After': retryAfter, 'RateLimit-Limit': String(limit), 'RateLimit-Remaining': '0', 'RateLimit-Reset': retryAfter }
  })
}

/**
 * Takes the request and answers: throttled per name as typed and per client
 * address (neither depends on whether the name exists), then queued as a
 * request row in its own short transaction (with SMTP), or left to a
 * background task (without). PASSWORD_SIGN_IN=off answers 403 to everyone alike.
 */
export async function requestPasswordReset (deps: PasswordResetsDeps, ctx: RequestContext, identifier: string): Promise<void> {
  if (!deps.config.passwordSignIn) throw notOffered()
  const key = identifier.trim().toLowerCase()
  const limit = deps.config.passwordResetMaxPerHour
  const reservation = await deps.failures.reserve([
    { key: `reset:name:${key}`, limit },
    // A client address may ask for more accounts than one name gets, not without bound.
    { key: `reset:addr:${ctx.clientIp ?? 'unknown'}`, limit: limit * 4 }
  ], HOUR_MS)
  if (!reservation.allowed) throw throttled(reservation.resetMs, reservation.limit)
  if (isMailSending(deps.db)) {
    const request: QueuedRequest = { key, ctx }
    await deps.db.transaction().execute(async trx => { await enqueueMailRequest(trx, PASSWORD_RESET_REQUEST, { ...request }) })
    return
  }
  deps.background.run('password_reset_request', async () => { await recordUnmailableRequest(deps, ctx, key) })
}

/** What a queued reset request holds, sealed: the name as typed (trimmed, lower case) and the request's context for its event. */
interface QueuedRequest {
  key: string
  ctx: RequestContext
}

/** Whether this account may reset its password, and why not. */
async function eligibility (deps: Pick<PasswordResetsDeps, 'db' | 'config'>, user: UserRow): Promise<RequestOutcome | undefined> {
  if (user.email === null) return 'no_email'
  if (toBool(user.disabled)) return 'disabled'
  if (toBool(user.invitation_pending)) return 'invitation_pending'
  if (!toBool(user.password_sign_in)) return 'password_sign_in_off'
  const identities = await listIdentitiesOfUser(deps.db, user.id, 100)
  // The directory holds a directory user's password; a reset here would be a second one.
  if (deps.config.ldap !== undefined && identities.some(i => i.provider === DIRECTORY_PROVIDER)) return 'directory_user'
  if (user.password_hash === null && identities.length > 0) return 'single_sign_on_only'
  return undefined
}

/** The account a name typed for a reset names, and why it gets no link (undefined: it gets one). */
async function decide (deps: Pick<PasswordResetsDeps, 'failures' | 'config'>, db: Db, key: string): Promise<{ user: UserRow | undefined, outcome: RequestOutcome | undefined }> {
  const userId = await findTokenHolder(db, key, 'password_reset')
  const user = userId !== undefined ? await findUserById(db, userId) : undefined
  if (user === undefined) return { user, outcome: 'no_account' }
  const outcome = await eligibility({ db, config: deps.config }, user)
  if (outcome !== undefined) return { user, outcome }
  const reservation = await deps.failures.reserve([{ key: `reset:acct:${user.id}`, limit: deps.config.passwordResetMaxPerHour }], HOUR_MS)
  return { user, outcome: reservation.allowed ? undefined : 'throttled' }
}

/** Without SMTP: what would have become of the request, recorded; no link is made, since none could reach the owner (an admin issues one instead). */
async function recordUnmailableRequest (deps: PasswordResetsDeps, ctx: RequestContext, key: string): Promise<void> {
  const { user, outcome } = await decide(deps, deps.db, key)
  const target = user !== undefined ? { type: 'user', id: user.id } : null
  await recordEvent(deps.db, ctx, 'user.password_reset_requested', target, { identifier: key.slice(0, 254), outcome: outcome ?? 'mail_unavailable' })
}

/**
 * Resolves a queued reset request in the mail worker's transaction `trx`
 * (registered by sessions/sign-in.plugin.ts: MailWorker.resolveRequests): looks the account up,
 * applies the rules and the per-account throttle, and either issues the token
 * and returns its message, which the worker writes in place of the request,
 * or returns none; the event is recorded in `trx` either way, so the request
 * is resolved exactly once.
 */
export async function resolvePasswordResetRequest (deps: Pick<PasswordResetsDeps, 'failures' | 'config'>, trx: Db, data: Record<string, unknown>, code: PreparedCode): Promise<MailRequest | undefined> {
  const { key, ctx } = data as unknown as QueuedRequest
  const identifier = key.slice(0, 254)
  const { user, outcome } = await decide(deps, trx, key)
  if (user === undefined || outcome !== undefined) {
    await recordEvent(trx, ctx, 'user.password_reset_requested', user !== undefined ? { type: 'user', id: user.id } : null, { identifier, outcome: outcome ?? 'no_account' })
    return undefined
  }
  const issued = await issueTokenMail(trx, deps.config, { userId: user.id, username: user.username, purpose: 'password_reset', to: user.email!, lifetimeMs: deps.config.passwordResetLifetimeMs, code })
  await recordEvent(trx, ctx, 'user.password_reset_requested', { type: 'user', id: user.id }, { identifier, outcome: 'mailed', expires_at: issued.expiresAt })
  return issued.mail
}

/** Why an administrator cannot issue a reset link for an account. */
const INELIGIBLE: Partial<Record<RequestOutcome, string>> = {
  disabled: 'This user is disabled; enable them first.',
  invitation_pending: 'This user has not accepted their invitation yet; resend the invitation instead.',
  password_sign_in_off: 'This user does not sign in with a password (password_sign_in is false).',
  directory_user: 'This user\'s password is the directory\'s (LDAP); reset it there.',
  single_sign_on_only: 'This user signs in only through single sign-on and has no password here.'
}

/**
 * An administrator's reset link for a user (the way back in when no mail is
 * sent, or the owner asked for help): mailed to the user when mail is on and
 * they have an address, else returned to hand over, once. Refused (409) for
 * an account a reset is not offered to. The earlier reset link ends.
 */
export async function issuePasswordReset (deps: Pick<PasswordResetsDeps, 'db' | 'config' | 'passwords'>, ctx: RequestContext, userId: string): Promise<PasswordResetLink> {
  if (!deps.config.passwordSignIn) throw notOffered()
  const user = await findUserById(deps.db, userId)
  if (user === undefined) throw new AppError('user_not_found', 404, `No user has the id ${userId}.`)
  assertMayChangeAccount(ctx, user)
  const outcome = await eligibility(deps, user)
  if (outcome !== undefined && outcome !== 'no_email') throw new AppError('conflict', 409, INELIGIBLE[outcome] ?? 'A password reset is not offered to this user.')
  const code = await prepareCode(deps.passwords)
  return await deps.db.transaction().execute(async trx => {
    const issued = await issueAndMailToken(trx, deps.config, { userId: user.id, username: user.username, purpose: 'password_reset', to: user.email, lifetimeMs: deps.config.passwordResetLifetimeMs, code })
    await recordEvent(trx, ctx, 'user.password_reset_requested', { type: 'user', id: user.id }, { by: 'admin', outcome: issued.mailed ? 'mailed' : 'link_issued', expires_at: issued.expiresAt })
    return { delivery: issued.mailed ? 'queued' as const : 'not_sent' as const, mailed: issued.mailed, expires_at: issued.expiresAt, ...(issued.mailed ? {} : { url: issued.url, code: issued.code }) }
  })
}

/** The account a proof names, before it is used. */
async function holderOf (deps: PasswordResetsDeps, proof: TokenProof): Promise<string | undefined> {
  if ('token' in proof) return (await findLiveToken(deps.db, proof.token, 'password_reset'))?.user_id
  return await findTokenHolder(deps.db, proof.login, 'password_reset')
}

/**
 * Sets the new password: the token is used in the transaction that sets it,
 * through the user lifecycle, which ends every session and API key of the
 * account (`user.updated` with the password; the owner is notified of a new
 * password as for any other). The account lock, if any, ends too: the owner
 * has just proved themselves.
 */
export async function completePasswordReset (deps: PasswordResetsDeps, ctx: RequestContext, proof: TokenProof, newPassword: string): Promise<void> {
  if (!deps.config.passwordSignIn) throw notOffered()
  const byCode = !('token' in proof)
  if (byCode) await reserveCodeAttempt(deps, ctx.clientIp)
  const userId = await holderOf(deps, proof)
  const before = userId !== undefined ? await findUserById(deps.db, userId) : undefined
  if (before === undefined || await eligibility(deps, before) !== undefined) throw tokenInvalid()
  checkPasswordPolicy(newPassword, { username: before.username, emails: [before.email] }, passwordPolicyOf(deps.config), '/new_password')
  const checked = await checkTokenProof(deps.db, deps.passwords, proof, 'password_reset', before.id)
  const hash = await deps.passwords.hash(newPassword)
  const userCtx: RequestContext = { ...ctx, actorType: 'user', actorId: before.id }
  const done = await deps.db.transaction().execute(async trx => {
    const used = await useCheckedProof(trx, checked, 'password_reset')
    // Not thrown here: a wrong code's count must commit.
    if (used === undefined || used.user_id !== before.id) return false
    await changeUserRecorded(trx, userCtx, before.id, { password_hash: hash }, { lastAdmin: 'refuse', extra: { via: 'password_reset' } })
    await clearSignInLock(trx, before.id)
    await recordEvent(trx, userCtx, 'user.password_reset', { type: 'user', id: before.id }, { via: byCode ? 'code' : 'link' })
    return true
  })
  if (!done) throw tokenInvalid()
  if (byCode) await releaseCodeAttempt(deps, ctx.clientIp)
}
