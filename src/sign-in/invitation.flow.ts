import { toBool } from '../db/database.ts'
import { recordEvent } from '../events/events.repository.ts'
import { NO_NOTICES } from '../mail/mail.outbox.ts'
import { checkPasswordPolicy, passwordPolicyOf } from '../lib/password-policy.ts'
import { openSignInChallenge, secondFactorNeeded } from '../mfa/mfa.service.ts'
import { openSession } from '../sessions/sessions.service.ts'
import type { SessionsDeps, SignInContext } from '../sessions/sessions.types.ts'
import { releaseCodeAttempt, reserveCodeAttempt, tokenInvalid } from '../tokens/code-throttle.ts'
import { findLiveToken, findTokenHolder, type TokenProof } from '../tokens/tokens.repository.ts'
import { checkTokenProof, useCheckedProof } from '../tokens/token-codes.ts'
import { changeUserRecorded } from '../users/users.lifecycle.ts'
import { findUserById } from '../users/users.repository.ts'
import type { SignInResult } from './password.flow.ts'

/*
 * Accepting an invitation (docs/email.md#invitations): a flow above the
 * tokens, the user lifecycle, second factors and sessions. The invited person
 * proves the invitation (its link, or their name and the mailed code), sets a
 * password under the usual policy, and is signed in: at once, or, where
 * MFA_REQUIRED applies to them, after enrolling a second factor, exactly as a
 * password sign-in that owes one.
 */

/** The user a proof names before it is used: the password policy needs their name, and the hash is made outside the transaction. */
async function invitedUserId (deps: SessionsDeps, proof: TokenProof): Promise<string | undefined> {
  if ('token' in proof) return (await findLiveToken(deps.db, proof.token, 'invitation'))?.user_id
  return await findTokenHolder(deps.db, proof.login, 'invitation')
}

export async function acceptInvitation (deps: SessionsDeps, ctx: SignInContext, proof: TokenProof, password: string): Promise<SignInResult> {
  const byCode = !('token' in proof)
  if (byCode) await reserveCodeAttempt(deps, ctx.clientIp)
  const userId = await invitedUserId(deps, proof)
  const before = userId !== undefined ? await findUserById(deps.db, userId) : undefined
  // A name without a pending invitation is one more wrong code: its unit stays taken.
  if (before === undefined || !toBool(before.invitation_pending) || toBool(before.disabled)) throw tokenInvalid()
  checkPasswordPolicy(password, { username: before.username, emails: [before.email] }, passwordPolicyOf(deps.config))
  const checked = await checkTokenProof(deps.db, deps.passwords, proof, 'invitation', before.id)
  const hash = await deps.passwords.hash(password)
  const userCtx = { ...ctx, actorType: 'user' as const, actorId: before.id }
  const accepted = await deps.db.transaction().execute(async trx => {
    const used = await useCheckedProof(trx, checked, 'invitation')
    // Not thrown here: a wrong code's count must commit.
    if (used === undefined || used.user_id !== before.id) return false
    const current = await findUserById(trx, before.id, { forUpdate: true })
    if (current === undefined || !toBool(current.invitation_pending) || toBool(current.disabled)) return false
    // A link mailed to the account's address proves the address, as a confirmation would.
    // The first password is the person's own doing: no "password changed" notice (NO_NOTICES).
    const proved = used.email !== null && current.email !== null && used.email.toLowerCase() === current.email.toLowerCase()
    await changeUserRecorded(trx, userCtx, before.id, { password_hash: hash, invitation_pending: false, ...(proved ? { email_verified: true } : {}) }, { lastAdmin: 'refuse', extra: { ...NO_NOTICES } })
    await recordEvent(trx, userCtx, 'user.invitation_accepted', { type: 'user', id: before.id }, { via: byCode ? 'code' : 'link' })
    return true
  })
  if (!accepted) throw tokenInvalid()
  if (byCode) await releaseCodeAttempt(deps, ctx.clientIp)
  const user = (await findUserById(deps.db, before.id))!
  const now = new Date()
  const opened = { method: 'password' as const }
  const secondFactor = await secondFactorNeeded(deps, user)
  if (secondFactor !== undefined) return { kind: 'mfa', ...await openSignInChallenge(deps, ctx, user, secondFactor, undefined, now, opened) }
  return { kind: 'session', ...await openSession(deps, ctx, user.id, { opened, locked: false, now }) }
}
