import type { Config } from '../config.ts'
import { toBool, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { Principal, RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import type { FailureCounter } from '../sessions/failure-counter.ts'
import type { PasswordHasher } from '../lib/passwords.ts'
import { isMailSending } from '../mail/mail.outbox.ts'
import { releaseCodeAttempt, reserveCodeAttempt, tokenInvalid } from '../tokens/code-throttle.ts'
import { issueAndMailToken } from '../tokens/token-mail.ts'
import { type TokenProof } from '../tokens/tokens.repository.ts'
import { checkTokenProof, prepareCode, useCheckedProof } from '../tokens/token-codes.ts'
import { changeUserRecorded } from '../users/users.lifecycle.ts'
import { findTakenKeys, findUserById } from '../users/users.repository.ts'
import type { User } from '../users/users.schemas.ts'

/*
 * E-mail verification and change (docs/email.md#e-mail-verification-and-change).
 * A person confirms an address by the link or code mailed to it. Confirming
 * the account's own address sets `email_verified`; confirming a new one is a
 * self-service change, which takes effect only then, through the user
 * lifecycle: the `user.updated` it records tells the old address (the
 * `email_changed` notice).
 */

export interface EmailVerificationDeps {
  db: Db
  passwords: PasswordHasher
  failures: FailureCounter
  config: Pick<Config, 'emailVerificationLifetimeMs' | 'loginMaxFailuresPerAddress' | 'loginFailureWindowMs' | 'publicUrl' | 'host' | 'port' | 'basePath'>
}

export interface VerificationSent { email: string, expires_at: string }

function mailUnavailable (): AppError {
  return new AppError('mail_unavailable', 409, 'This deployment sends no mail (no SMTP_URL), so an address cannot be confirmed; an administrator can set it for you.')
}

function ownUserId (principal: Principal): string {
  if (principal.userId === null || principal.type !== 'session') throw new AppError('forbidden', 403, 'Changing or confirming your address needs a signed-in session, not an API key.')
  return principal.userId
}

/**
 * Mails a confirmation to `email`: the account's own address (`email`
 * omitted or the same) or a new one, which the account takes only when it is
 * confirmed. The earlier confirmation link stops working.
 */
export async function sendEmailVerification (deps: EmailVerificationDeps, principal: Principal, ctx: RequestContext, email: string | undefined): Promise<VerificationSent> {
  const userId = ownUserId(principal)
  if (!isMailSending(deps.db)) throw mailUnavailable()
  const code = await prepareCode(deps.passwords)
  return await deps.db.transaction().execute(async trx => {
    const user = await findUserById(trx, userId)
    if (user === undefined || toBool(user.disabled)) throw new AppError('forbidden', 403, 'This account cannot change its address.')
    const to = email ?? user.email
    if (to === null) throw new AppError('email_required', 422, 'Your account has no address to confirm; give the new one as `email`.', { errors: [{ in: 'body', pointer: '/email', detail: 'required: the account has no address' }] })
    const changing = to.toLowerCase() !== user.email?.toLowerCase()
    if (!changing && toBool(user.email_verified)) throw new AppError('conflict', 409, 'This address is already confirmed.')
    if (changing && (await findTakenKeys(trx, [], [to.toLowerCase()])).emails.size > 0) {
      throw new AppError('email_taken', 409, 'Another account has this address (addresses are unique ignoring case).')
    }
    const issued = await issueAndMailToken(trx, deps.config, { userId, username: user.username, purpose: 'email_verification', to, lifetimeMs: deps.config.emailVerificationLifetimeMs, code })
    await recordEvent(trx, ctx, 'user.email_verification_sent', { type: 'user', id: userId }, { email: to, change: changing, expires_at: issued.expiresAt })
    return { email: to, expires_at: issued.expiresAt }
  })
}

/**
 * Confirms an address by its link's token, or by the address and the mailed
 * code. Needs no session: the link is often opened on another device. The
 * account's address becomes the confirmed one (unless someone else took it
 * meanwhile: 409), verified.
 */
export async function confirmEmail (deps: EmailVerificationDeps, ctx: RequestContext, proof: TokenProof): Promise<{ user: User, version: number }> {
  const byCode = !('token' in proof)
  if (byCode) await reserveCodeAttempt(deps, ctx.clientIp)
  const checked = await checkTokenProof(deps.db, deps.passwords, proof, 'email_verification')
  const outcome = await deps.db.transaction().execute(async trx => {
    const used = await useCheckedProof(trx, checked, 'email_verification')
    // Not thrown here: a wrong code's count must commit.
    if (used === undefined || used.email === null) return undefined
    const user = await findUserById(trx, used.user_id, { forUpdate: true })
    if (user === undefined || toBool(user.disabled)) return undefined
    const userCtx: RequestContext = { ...ctx, actorType: 'user', actorId: user.id }
    const changing = used.email.toLowerCase() !== user.email?.toLowerCase()
    const changed = await changeUserRecorded(trx, userCtx, user.id, { ...(changing ? { email: used.email } : {}), email_verified: true }, { lastAdmin: 'refuse', extra: { via: 'email_verification' } })
    await recordEvent(trx, userCtx, 'user.email_verified', { type: 'user', id: user.id }, { email: used.email, ...(changing ? { changed_from: user.email } : {}), via: byCode ? 'code' : 'link' })
    return { user: changed.user, version: changed.version }
  })
  if (outcome === undefined) throw tokenInvalid()
  if (byCode) await releaseCodeAttempt(deps, ctx.clientIp)
  return outcome
}
