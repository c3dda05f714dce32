import { AppError } from '../errors.ts'
import { recordEvent } from '../events/events.repository.ts'
import {
  beginSecondStep, passkeyOwner, prepareSecondFactor, secondStepFailed, secondStepPassed, secondStepUser, spendPasskeyAssertion, spendSecondFactor
} from '../mfa/mfa.service.ts'
import { ProofRejected, type MfaProof } from '../mfa/factor-proofs.ts'
import type { MfaMethod, PasskeyCredential } from '../mfa/mfa.schemas.ts'
import type { RelyingParty } from '../mfa/webauthn.ts'
import type { Budget } from '../sessions/failure-counter.ts'
import { openSession } from '../sessions/sessions.service.ts'
import { reserveAttempt } from '../sessions/throttle.ts'
import { findUserById } from '../users/users.repository.ts'
import { userAgentData } from '../lib/user-agent.ts'
import type { SessionsDeps, SignIn, SignInContext } from '../sessions/sessions.types.ts'

/*
 * Sign-ins that end with a factor other than the password: the second step
 * after a password (or a provider), and a passkey alone. A flow above the
 * factors and the sessions (docs/architecture.md): the factors service checks
 * and spends the factor, the sessions service opens the session, and both
 * happen in one transaction, so a factor spent is a session opened.
 */

/**
 * The second step: the challenge token with one second factor, or, when the
 * user must enrol, the first code of a new TOTP set-up or a new passkey
 * (then with new recovery codes).
 */
export async function completeSignIn (
  deps: SessionsDeps, ctx: SignInContext, challengeToken: string, proof: MfaProof, rp: RelyingParty
): Promise<{ signIn: SignIn, recoveryCodes?: string[], method: MfaMethod }> {
  const step = await beginSecondStep(deps, ctx, challengeToken, proof)
  let recoveryCodes: string[] | undefined
  let signedIn: SignIn
  try {
    const { locked } = await secondStepUser(deps, step)
    const prepared = await prepareSecondFactor(deps, step, proof)
    signedIn = await openSession(deps, ctx, step.userId, {
      opened: step.opened,
      locked,
      now: step.now,
      mfa: step.method,
      within: async (trx) => {
        // The user's row before the challenge's, in the order a change of password takes them
        // (it closes open challenges, sessions.repository.ts): the other order could deadlock.
        await findUserById(trx, step.userId, { forUpdate: true })
        recoveryCodes = await spendSecondFactor(trx, deps, ctx, step, proof, rp, prepared)
      }
    })
  } catch (error) {
    return await secondStepFailed(deps, ctx, step, error)
  }
  await secondStepPassed(deps, step)
  return { signIn: signedIn, method: step.method, ...(recoveryCodes !== undefined ? { recoveryCodes } : {}) }
}

/**
 * Sign-in with a passkey alone. The authenticator must have verified its
 * user (PIN or biometrics), which makes the passkey two factors in one: the
 * session counts as MFA. Every failure is the same 401 invalid_credentials
 * and costs the address one unit of its sign-in budget.
 */
export async function passkeySignIn (deps: SessionsDeps, ctx: SignInContext, credential: PasskeyCredential, rp: RelyingParty): Promise<SignIn> {
  const addr: Budget[] = [{ key: `addr:${ctx.clientIp ?? 'unknown'}`, limit: deps.config.loginMaxFailuresPerAddress }]
  await reserveAttempt(deps, addr)
  const now = new Date()
  let userId: string | undefined
  try {
    const owner = await passkeyOwner(deps, credential, now)
    userId = owner.userId
    const signedIn = await openSession(deps, ctx, owner.userId, {
      opened: { method: 'passkey' },
      locked: owner.locked,
      now,
      mfa: 'passkey',
      passwordless: true,
      within: async (trx) => { await spendPasskeyAssertion(trx, credential, rp, owner.userId, now) }
    })
    await deps.failures.release(addr.map(b => b.key))
    return signedIn
  } catch (error) {
    if (!(error instanceof ProofRejected)) {
      await deps.failures.release(addr.map(b => b.key))
      throw error
    }
    userId ??= error.userId
    await recordEvent(deps.db, ctx, 'user.login_failed', userId !== undefined ? { type: 'user', id: userId } : null, { reason: error.reason, method: 'passkey', ...userAgentData(ctx.userAgent) })
    throw new AppError('invalid_credentials', 401, 'The passkey was not accepted.')
  }
}
