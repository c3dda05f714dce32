import { toBool } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { reserveAttempt, throttleBudgets } from '../sessions/throttle.ts'
import { findSessionProof, markSessionReauthenticated } from '../sessions/sessions.repository.ts'
import type { SessionsDeps } from '../sessions/sessions.types.ts'
import { findUserById } from '../users/users.repository.ts'
import { matchRecoveryCode, openTotpSecret, ProofRejected, rememberCeremony, secondFactorBudgets, totpStep, type MfaProof } from './factor-proofs.ts'
import { countUnusedRecoveryCodes, factorCounts, findTotp, spendRecoveryCode, takeWebauthnChallenge, acceptTotpStep } from './mfa.repository.ts'
import type { MfaMethod } from './mfa.schemas.ts'
import { authenticationOptions, challengeOf, checkAssertion, type RelyingParty } from './webauthn.ts'

type MfaDeps = SessionsDeps

// Recent authentication (sudo mode): changes to factors need a fresh proof.

export type ReauthMethod = 'password' | MfaMethod

/** What this user can re-authenticate with: the password (where password sign-in is allowed), and each second factor. */
export async function reauthMethods (deps: MfaDeps, userId: string): Promise<ReauthMethod[]> {
  const user = await findUserById(deps.db, userId)
  if (user === undefined) return []
  const methods: ReauthMethod[] = []
  if (user.password_hash !== null && deps.config.passwordSignIn && toBool(user.password_sign_in)) methods.push('password')
  const factors = await factorCounts(deps.db, userId)
  if (factors.totp) methods.push('totp')
  if (factors.passkeys > 0) methods.push('passkey')
  if (await countUnusedRecoveryCodes(deps.db, userId) > 0) methods.push('recovery_code')
  return methods
}

/**
 * Refuses a change to the user's factors unless the session proved its person
 * within REAUTH_WINDOW_SECONDS: the sign-in itself, or a re-authentication
 * since. A stolen or unattended session can then not swap the factors that
 * would let its owner back in. The time is read from the sessions table, not
 * the credential cache.
 */
export async function assertRecentAuthentication (deps: MfaDeps, session: { id: string, userId: string }, now = Date.now()): Promise<void> {
  const proof = await findSessionProof(deps.db, session.id)
  const provedAt = proof === undefined
    ? 0
    : Math.max(new Date(proof.signedInAt).getTime(), proof.reauthenticatedAt === null ? 0 : new Date(proof.reauthenticatedAt).getTime())
  if (now - provedAt <= deps.config.reauthWindowMs) return
  const methods = await reauthMethods(deps, session.userId)
  throw new AppError('reauthentication_required', 403,
    `This change needs a sign-in or re-authentication within the last ${windowText(deps.config.reauthWindowMs)}. ` +
    (methods.length > 0 ? 'Re-authenticate (POST /auth/api/me/reauthenticate), then try again.' : 'Sign in again, then try again.'),
    { extensions: { reauthenticate_with: methods } })
}

/** REAUTH_WINDOW_SECONDS as a person says it: "1 minute", "10 minutes", "90 seconds". */
function windowText (ms: number): string {
  const seconds = Math.round(ms / 1000)
  const [count, unit] = seconds % 60 === 0 ? [seconds / 60, 'minute'] : [seconds, 'second']
  return `${count} ${unit}${count === 1 ? '' : 's'}`
}

export interface ReauthProof extends MfaProof {
  password?: string | undefined
}

/** WebAuthn options for re-authenticating with one of the user's own passkeys; the challenge is remembered for CEREMONY_MS. */
export async function startReauthPasskey (deps: MfaDeps, userId: string, rp: RelyingParty): Promise<{ options: object, ceremony: 'get' }> {
  if ((await factorCounts(deps.db, userId)).passkeys === 0) throw new AppError('passkey_not_found', 404, 'You have no passkey to re-authenticate with.')
  const options = await authenticationOptions(deps.db, userId, rp)
  // A 'passkey' ceremony bound to its user: the passwordless sign-in takes only those without one.
  await rememberCeremony(deps.db, 'passkey', userId, options.challenge)
  return { options, ceremony: 'get' }
}

/**
 * Proves the session's person again: the current password, a TOTP code, a
 * recovery code (spent) or a passkey assertion. Throttled as at sign-in: a
 * password on the account's and the address's password budgets, a code or
 * passkey on the second-factor budget; the unit is taken before the check.
 * Success stamps the session (`reauthenticated_at`) with a
 * `user.reauthenticated` event; every failure is the same 401
 * `invalid_credentials` with a `user.reauthentication_failed` event.
 */
export async function reauthenticate (
  deps: MfaDeps, ctx: RequestContext, session: { id: string, userId: string }, proof: ReauthProof, rp: RelyingParty
): Promise<{ method: ReauthMethod, reauthenticatedAt: string, validUntil: string }> {
  const given = [proof.password, proof.totpCode, proof.recoveryCode, proof.passkey].filter(p => p !== undefined).length
  if (given !== 1) {
    throw new AppError('validation_failed', 422, 'Give exactly one of password, totp_code, recovery_code or passkey.', {
      errors: [{ in: 'body', pointer: '', detail: 'needs exactly one of password, totp_code, recovery_code, passkey' }]
    })
  }
  const method: ReauthMethod = proof.password !== undefined ? 'password' : proof.totpCode !== undefined ? 'totp' : proof.recoveryCode !== undefined ? 'recovery_code' : 'passkey'
  const userId = session.userId
  const ip = ctx.clientIp ?? 'unknown'
  const budgets = method === 'password' ? throttleBudgets(deps, `user:${userId}`, ip) : secondFactorBudgets(deps, userId, ip)
  await reserveAttempt(deps, budgets)
  const now = new Date()
  const at = now.toISOString()
  try {
    const user = await findUserById(deps.db, userId)
    // The session's user was deleted meanwhile (a session goes with its user).
    if (user === undefined) throw new AppError('user_not_found', 404, 'No user has this id.')
    if (method === 'password') {
      // The verification runs whatever the account, so a refusal costs what a wrong password does.
      const valid = await deps.passwords.verify(user.password_hash ?? deps.dummyHash, proof.password!)
      if (user.password_hash === null) throw new ProofRejected('no_password')
      if (!deps.config.passwordSignIn || !toBool(user.password_sign_in)) throw new ProofRejected('password_sign_in_disabled')
      if (!valid) throw new ProofRejected('wrong_password')
    }
    const recoveryCodeId = method === 'recovery_code' ? await matchRecoveryCode(deps, userId, proof.recoveryCode!) : undefined
    await deps.db.transaction().execute(async trx => {
      if (method === 'totp') {
        const totp = await findTotp(trx, userId)
        if (totp === undefined || totp.confirmed_at === null) throw new ProofRejected('no_totp')
        const secret = await openTotpSecret(deps, userId, totp.secret)
        const step = secret === undefined ? undefined : await totpStep(secret, proof.totpCode!, totp.last_time_step === null ? null : Number(totp.last_time_step))
        if (step === undefined || !await acceptTotpStep(trx, userId, step, at, false)) throw new ProofRejected('wrong_code')
      } else if (method === 'recovery_code') {
        if (recoveryCodeId === undefined || !await spendRecoveryCode(trx, userId, recoveryCodeId, at)) throw new ProofRejected('wrong_recovery_code')
        await recordEvent(trx, ctx, 'user.recovery_code_used', { type: 'user', id: userId }, { remaining: await countUnusedRecoveryCodes(trx, userId), during: 'reauthentication' })
      } else if (method === 'passkey') {
        const challenge = await challengeOf(proof.passkey)
        const ceremony = challenge === undefined ? undefined : await takeWebauthnChallenge(trx, 'passkey', challenge, userId, at)
        if (ceremony === undefined) throw new ProofRejected('unknown_challenge')
        if (await checkAssertion(trx, proof.passkey, ceremony.webauthn_challenge!, rp, userId, false, at) === undefined) throw new ProofRejected('passkey_rejected')
      }
      await markSessionReauthenticated(trx, session.id, at)
      await recordEvent(trx, ctx, 'user.reauthenticated', { type: 'user', id: userId }, { method, session_id: session.id })
    })
  } catch (error) {
    if (!(error instanceof ProofRejected)) {
      await deps.failures.release(budgets.map(b => b.key))
      throw error
    }
    await recordEvent(deps.db, ctx, 'user.reauthentication_failed', { type: 'user', id: userId }, { reason: error.reason, method, session_id: session.id })
    throw new AppError('invalid_credentials', 401, 'That did not prove it is you: the password, code or passkey was not accepted.')
  }
  await Promise.all([deps.failures.reset(budgets[0]!.key), deps.failures.release([budgets[1]!.key])])
  return { method, reauthenticatedAt: at, validUntil: new Date(now.getTime() + deps.config.reauthWindowMs).toISOString() }
}
