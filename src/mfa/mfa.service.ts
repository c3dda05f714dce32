import { toBool, toIso, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'
import type { Budget } from '../sessions/failure-counter.ts'
import type { SessionsDeps, SignInContext, SignInOpening } from '../sessions/sessions.types.ts'
import { reserveAttempt } from '../sessions/throttle.ts'
import {
  acceptTotpStep, closeChallenge, countTotpConfirmFailure, countUnusedRecoveryCodes, deleteAllFactors, deletePasskey, deletePendingTotp, deleteTotp,
  factorCounts, findOpenSignInChallenge, findTotp, insertChallenge, listPasskeys, putPendingTotp, renamePasskey,
  setWebauthnChallenge, spendRecoveryCode, takeWebauthnChallenge, deleteRecoveryCodes, findPasskeyOf, findPasskeyOwner
} from './mfa.repository.ts'
import { findUserById } from '../users/users.repository.ts'
import { storeRehashedPassword } from '../users/users.lifecycle.ts'
import type { MfaMethod, MfaStatus, Passkey, PasskeyCredential, TotpSetup } from './mfa.schemas.ts'
import { addPasskey, authenticationOptions, challengeOf, checkAssertion, registrationOptions, toPasskey, type RelyingParty } from './webauthn.ts'
import { seal } from '../lib/secret-box.ts'
import { issueRecoveryCodes, matchRecoveryCode, openTotpSecret, prepareRecoveryCodes, ProofRejected, rememberCeremony, secondFactorBudgets, totpStep, type MfaProof, type PreparedRecoveryCodes } from './factor-proofs.ts'

/** Distinguishes a sign-in challenge token from session tokens and API keys. */
export const MFA_TOKEN_PREFIX = 'gatehouse_mfa_'
/** Time from the right password to the second factor; long enough to fetch a phone. */
const CHALLENGE_MS = 5 * 60_000
const ISSUER = 'gatehouse'
/**
 * Wrong codes a pending TOTP set-up survives. A typo must not throw away the
 * entry the person just scanned, but a set-up left open must not take
 * guesses for ever either (each also spends the second-factor budget).
 */
export const PENDING_TOTP_MAX_FAILURES = 10

type MfaDeps = SessionsDeps
type UserRow = { id: string, username: string, role: 'admin' | 'user' }

export interface MfaPending {
  challengeToken: string
  expiresAt: string
  methods: MfaMethod[]
  enrol: boolean
}

/** Whether MFA_REQUIRED applies to a user of this role. */
export function mfaRequiredFor (config: Pick<SessionsDeps['config'], 'mfaRequired'>, role: string): boolean {
  return config.mfaRequired === 'all' || (config.mfaRequired === 'admins' && role === 'admin')
}

/** What the user could enrol: passkeys always, TOTP when a key to keep its secret is configured. */
function enrollable (deps: MfaDeps): MfaMethod[] {
  return deps.config.mfaEncryptionKey !== undefined ? ['totp', 'passkey'] : ['passkey']
}

/**
 * After a right password: the second factor the sign-in still needs, or
 * undefined when the password is enough (no factor enrolled, none required).
 */
export async function secondFactorNeeded (deps: MfaDeps, user: UserRow): Promise<{ methods: MfaMethod[], enrol: boolean } | undefined> {
  const factors = await factorCounts(deps.db, user.id)
  const methods: MfaMethod[] = []
  if (factors.totp) methods.push('totp')
  if (factors.passkeys > 0) methods.push('passkey')
  if (methods.length > 0) {
    if (await countUnusedRecoveryCodes(deps.db, user.id) > 0) methods.push('recovery_code')
    return { methods, enrol: false }
  }
  return mfaRequiredFor(deps.config, user.role) ? { methods: enrollable(deps), enrol: true } : undefined
}

/**
 * Instead of a session: a short-lived, single-use challenge token, stored as
 * its digest like a session's. A password hash due for an upgrade is
 * replaced here, while the password is at hand. `within` runs first in the
 * transaction (the password flow's check that the password is still theirs);
 * throwing there opens nothing.
 */
export async function openSignInChallenge (
  deps: MfaDeps, ctx: SignInContext, user: UserRow, need: { methods: MfaMethod[], enrol: boolean }, rehash: string | undefined, now: Date,
  opened: SignInOpening, within?: (trx: Db) => Promise<void>
): Promise<MfaPending> {
  const token = randomSecret(MFA_TOKEN_PREFIX)
  const id = newId()
  const expiresAt = new Date(now.getTime() + CHALLENGE_MS).toISOString()
  await deps.db.transaction().execute(async trx => {
    await within?.(trx)
    if (rehash !== undefined) await storeRehashedPassword(trx, user.id, rehash)
    await insertChallenge(trx, {
      id, purpose: 'sign_in', digest: digestOf(token), user_id: user.id, webauthn_challenge: null, enrol: need.enrol, created_at: now.toISOString(), expires_at: expiresAt, sign_in_method: opened.method, sign_in_provider: opened.provider ?? null
    })
    await recordEvent(trx, ctx, 'user.mfa_challenged', { type: 'user', id: user.id }, {
      challenge_id: id, methods: need.methods, ...(need.enrol ? { enrolment_required: true } : {}), ...(rehash !== undefined ? { password_rehashed: true } : {})
    })
  })
  return { challengeToken: token, expiresAt, methods: need.methods, enrol: need.enrol }
}

/** One answer to every failed second step: unknown, used or expired token, wrong code, rejected passkey. */
function mfaFailed (): AppError {
  return new AppError('mfa_failed', 401, 'The second factor was not accepted, or the sign-in challenge has expired or was used; sign in again if it has.')
}

/** A second step under way: its challenge, the factor it is answered with, and the budgets it was charged to. */
export interface SecondStep {
  challengeId: string
  userId: string
  method: MfaMethod
  enrol: boolean
  webauthnChallenge: string | null
  budgets: Budget[]
  now: Date
  /** How the first step went, for the session; null for a challenge from before migration 0011 (unknown). */
  opened: SignInOpening | null
}

/**
 * The second step begins: the challenge token with one second factor (or,
 * when the user must enrol, the first code of a new TOTP set-up or a new
 * passkey). Throttled like passwords, with a budget per account for code
 * guesses: the unit is taken here, before the code is checked, and given back
 * by secondStepPassed.
 */
export async function beginSecondStep (deps: MfaDeps, ctx: SignInContext, challengeToken: string, proof: MfaProof): Promise<SecondStep> {
  const given = [proof.totpCode, proof.recoveryCode, proof.passkey].filter(p => p !== undefined).length
  if (given !== 1) {
    throw new AppError('validation_failed', 422, 'Give exactly one of totp_code, recovery_code or passkey.', {
      errors: [{ in: 'body', pointer: '', detail: 'needs exactly one of totp_code, recovery_code, passkey' }]
    })
  }
  const method: MfaMethod = proof.totpCode !== undefined ? 'totp' : proof.recoveryCode !== undefined ? 'recovery_code' : 'passkey'
  const ip = ctx.clientIp ?? 'unknown'
  const now = new Date()
  const challenge = await findOpenSignInChallenge(deps.db, digestOf(challengeToken), now.toISOString())
  if (challenge === undefined || challenge.user_id === null) {
    // No account to charge; the address pays, as for an unknown username.
    await reserveAttempt(deps, [{ key: `addr:${ip}`, limit: deps.config.loginMaxFailuresPerAddress }])
    await recordEvent(deps.db, ctx, 'user.mfa_failed', null, { reason: 'unknown_challenge', method })
    throw mfaFailed()
  }
  const budgets = secondFactorBudgets(deps, challenge.user_id, ip)
  await reserveAttempt(deps, budgets)
  const opened = challenge.sign_in_method === null ? null : { method: challenge.sign_in_method, provider: challenge.sign_in_provider ?? undefined }
  return { challengeId: challenge.id, userId: challenge.user_id, method, enrol: toBool(challenge.enrol), webauthnChallenge: challenge.webauthn_challenge, budgets, now, opened }
}

/** Whether the user of a second step may still sign in, and whether a lock stands (left in place for them). */
export async function secondStepUser (deps: MfaDeps, step: SecondStep): Promise<{ locked: boolean }> {
  const user = await findUserById(deps.db, step.userId)
  if (user === undefined || toBool(user.disabled)) throw new ProofRejected('disabled')
  return { locked: user.locked_until !== null && new Date(user.locked_until) > step.now }
}

/**
 * Closes the challenge and spends the factor (TOTP time step, recovery code,
 * passkey counter; a new TOTP or passkey when enrolling) with their events,
 * in the transaction that opens the session, so a code or a challenge works
 * once even under concurrent use. Returns the new recovery codes of an
 * enrolment; throws ProofRejected when the factor is not accepted.
 */
/** What spending a second factor needs done before its transaction: a recovery code checked, or an enrolment's new codes hashed. */
export interface PreparedSecondFactor { recoveryCodeId?: string | undefined, recoveryCodes?: PreparedRecoveryCodes }

export async function prepareSecondFactor (deps: MfaDeps, step: SecondStep, proof: MfaProof): Promise<PreparedSecondFactor> {
  if (step.enrol) return { recoveryCodes: await prepareRecoveryCodes(deps) }
  if (step.method === 'recovery_code') return { recoveryCodeId: await matchRecoveryCode(deps, step.userId, proof.recoveryCode!) }
  return {}
}

export async function spendSecondFactor (trx: Db, deps: MfaDeps, ctx: RequestContext, step: SecondStep, proof: MfaProof, rp: RelyingParty, prepared: PreparedSecondFactor): Promise<string[] | undefined> {
  const { userId, method, enrol } = step
  const at = step.now.toISOString()
  if (!await closeChallenge(trx, step.challengeId, at)) throw new ProofRejected('challenge_closed')
  if (method === 'totp') {
    const totp = await findTotp(trx, userId)
    const pending = totp !== undefined && totp.confirmed_at === null
    if (totp === undefined || pending !== enrol) throw new ProofRejected(enrol ? 'totp_not_pending' : 'no_totp')
    const secret = await openTotpSecret(deps, userId, totp.secret)
    const timeStep = secret === undefined ? undefined : await totpStep(secret, proof.totpCode!, totp.last_time_step === null ? null : Number(totp.last_time_step))
    if (timeStep === undefined || !await acceptTotpStep(trx, userId, timeStep, at, enrol)) throw new ProofRejected('wrong_code')
    if (enrol) await recordEvent(trx, ctx, 'user.totp_enrolled', { type: 'user', id: userId }, { during: 'sign_in' })
  } else if (method === 'recovery_code') {
    if (enrol || prepared.recoveryCodeId === undefined || !await spendRecoveryCode(trx, userId, prepared.recoveryCodeId, at)) throw new ProofRejected('wrong_recovery_code')
    await recordEvent(trx, ctx, 'user.recovery_code_used', { type: 'user', id: userId }, { remaining: await countUnusedRecoveryCodes(trx, userId) })
  } else {
    const expected = step.webauthnChallenge
    if (expected === null || await challengeOf(proof.passkey) !== expected) throw new ProofRejected('passkey_rejected')
    if (enrol) {
      const passkey = await addPasskey(trx, userId, proof.passkey, expected, rp, proof.passkeyName ?? 'Passkey', at)
        .catch((error: unknown) => { throw error instanceof AppError ? new ProofRejected('passkey_rejected') : error })
      await recordEvent(trx, ctx, 'user.passkey_added', { type: 'user', id: userId }, { passkey_id: passkey.id, name: passkey.name, during: 'sign_in' })
    } else if (await checkAssertion(trx, proof.passkey, expected, rp, userId, false, at) === undefined) {
      throw new ProofRejected('passkey_rejected')
    }
  }
  return enrol ? await issueRecoveryCodes(trx, ctx, userId, at, prepared.recoveryCodes!) : undefined
}

/** The second step went through: the account's code budget starts afresh, the address gets its unit back. */
export async function secondStepPassed (deps: MfaDeps, step: SecondStep): Promise<void> {
  await Promise.all([deps.failures.reset(step.budgets[0]!.key), deps.failures.release([step.budgets[1]!.key])])
}

/**
 * The second step failed: a factor that was not accepted is recorded
 * (`user.mfa_failed`) and answered with 401 `mfa_failed`; anything else (a
 * database error, say) is not a wrong guess, so the unit goes back.
 */
export async function secondStepFailed (deps: MfaDeps, ctx: RequestContext, step: SecondStep, error: unknown): Promise<never> {
  if (!(error instanceof ProofRejected)) {
    await deps.failures.release(step.budgets.map(b => b.key))
    throw error
  }
  await recordEvent(deps.db, ctx, 'user.mfa_failed', { type: 'user', id: step.userId }, { reason: error.reason, method: step.method, challenge_id: step.challengeId })
  throw mfaFailed()
}

/** The open sign-in challenge a token stands for; only for the enrolment and WebAuthn steps, which check no factor. */
async function openChallengeOf (deps: MfaDeps, token: string) {
  const challenge = await findOpenSignInChallenge(deps.db, digestOf(token), nowIso())
  if (challenge === undefined || challenge.user_id === null) throw mfaFailed()
  const user = await findUserById(deps.db, challenge.user_id)
  if (user === undefined || toBool(user.disabled)) throw mfaFailed()
  return { challenge, user }
}

/** What an open sign-in challenge offers now (for the sign-in page to show again), or undefined when it is closed. */
export async function describeChallenge (deps: MfaDeps, token: string): Promise<MfaPending | undefined> {
  if (!token.startsWith(MFA_TOKEN_PREFIX)) return undefined
  const challenge = await findOpenSignInChallenge(deps.db, digestOf(token), nowIso())
  if (challenge === undefined || challenge.user_id === null) return undefined
  const user = await findUserById(deps.db, challenge.user_id)
  if (user === undefined) return undefined
  const expiresAt = toIso(challenge.expires_at)
  if (toBool(challenge.enrol)) return { challengeToken: token, expiresAt, methods: enrollable(deps), enrol: true }
  return { challengeToken: token, expiresAt, methods: (await secondFactorNeeded(deps, user))?.methods ?? [], enrol: false }
}

/** TOTP set-up during a sign-in that must enrol a factor first. */
export async function startTotpForChallenge (deps: MfaDeps, token: string): Promise<TotpSetup> {
  const { challenge, user } = await openChallengeOf(deps, token)
  if (!toBool(challenge.enrol)) throw new AppError('totp_already_enrolled', 409, 'This sign-in asks for a second factor the user has; it enrols nothing.')
  return await startTotp(deps, user)
}

/** WebAuthn options for a sign-in challenge: to register a first passkey (enrolment), or to sign with one. */
export async function passkeyOptionsForChallenge (deps: MfaDeps, token: string, rp: RelyingParty): Promise<{ options: object, ceremony: 'create' | 'get' }> {
  const { challenge, user } = await openChallengeOf(deps, token)
  const enrol = toBool(challenge.enrol)
  const options = enrol ? await registrationOptions(deps.db, user, rp) : await authenticationOptions(deps.db, user.id, rp)
  await setWebauthnChallenge(deps.db, challenge.id, options.challenge)
  return { options, ceremony: enrol ? 'create' : 'get' }
}

// ---------------------------------------------------------------------------
// Self-service (a signed-in session) and administration

export async function mfaStatus (deps: MfaDeps, userId: string): Promise<MfaStatus> {
  const user = await findUserById(deps.db, userId)
  if (user === undefined) throw new AppError('user_not_found', 404, 'No user has this id.')
  const totp = await findTotp(deps.db, userId)
  return {
    required: mfaRequiredFor(deps.config, user.role),
    totp: { enrolled: totp?.confirmed_at != null, pending: totp !== undefined && totp.confirmed_at === null },
    passkeys: (await listPasskeys(deps.db, userId)).map(toPasskey),
    recovery_codes_remaining: await countUnusedRecoveryCodes(deps.db, userId)
  }
}

/**
 * A new TOTP secret for the user, waiting for its first code (an earlier
 * unconfirmed one is replaced). Needs MFA_ENCRYPTION_KEY: the secret is only
 * ever stored sealed under it.
 */
export async function startTotp (deps: MfaDeps, user: { id: string, username: string }): Promise<TotpSetup> {
  const key = deps.config.mfaEncryptionKey
  if (key === undefined) {
    throw new AppError('totp_not_configured', 409, 'Authenticator apps (TOTP) need MFA_ENCRYPTION_KEY, which this deployment has not set; use a passkey, or ask the operator.')
  }
  // Loaded by the first enrolment: most processes never make a TOTP secret or a QR code.
  const { generateSecret } = await import('otplib')
  const secret = generateSecret()
  if (!await putPendingTotp(deps.db, user.id, seal(key, secret, user.id), nowIso())) {
    throw new AppError('totp_already_enrolled', 409, 'An authenticator app is enrolled already; remove it first to set up another.')
  }
  return await totpSetupOf(user.username, secret)
}

async function totpSetupOf (username: string, secret: string): Promise<TotpSetup> {
  const [{ generateURI }, { default: QRCode }] = await Promise.all([import('otplib'), import('qrcode')])
  const uri = generateURI({ issuer: ISSUER, label: username, secret })
  return { secret, otpauth_uri: uri, qr_svg: await QRCode.toString(uri, { type: 'svg', errorCorrectionLevel: 'M', margin: 2 }) }
}

/** The set-up waiting for its first code, shown again (after a mistyped code, or to carry on later); undefined when none waits. */
export async function pendingTotpSetup (deps: MfaDeps, user: { id: string, username: string }): Promise<TotpSetup | undefined> {
  const totp = await findTotp(deps.db, user.id)
  if (totp === undefined || totp.confirmed_at !== null) return undefined
  const secret = await openTotpSecret(deps, user.id, totp.secret)
  return secret === undefined ? undefined : await totpSetupOf(user.username, secret)
}

/** Throws away a set-up still waiting for its first code (the person gave up, or scanned it into the wrong app). */
export async function cancelTotpSetup (deps: MfaDeps, userId: string): Promise<void> {
  if (!await deletePendingTotp(deps.db, userId)) throw new AppError('totp_not_pending', 409, 'There is no authenticator app set-up waiting for a code.')
}

/**
 * Confirms a pending TOTP set-up with a code from the app. Wrong codes are
 * throttled on the user's second-factor budget and keep the set-up, up to
 * PENDING_TOTP_MAX_FAILURES of them; then it is dropped. The user's first
 * factor also brings ten recovery codes.
 */
export async function confirmTotp (deps: MfaDeps, ctx: RequestContext, userId: string, code: string): Promise<{ recoveryCodes?: string[] }> {
  const totp = await findTotp(deps.db, userId)
  if (totp === undefined || totp.confirmed_at !== null) throw new AppError('totp_not_pending', 409, 'There is no authenticator app set-up waiting for a code; start one first.')
  const budgets = secondFactorBudgets(deps, userId, ctx.clientIp ?? 'unknown')
  await reserveAttempt(deps, budgets)
  const secret = await openTotpSecret(deps, userId, totp.secret)
  const step = secret === undefined ? undefined : await totpStep(secret, code, null)
  const at = nowIso()
  const codes = step === undefined ? undefined : await prepareRecoveryCodes(deps)
  const result = step === undefined || codes === undefined
    ? undefined
    : await deps.db.transaction().execute(async trx => {
      if (!await acceptTotpStep(trx, userId, step, at, true)) return undefined
      await recordEvent(trx, ctx, 'user.totp_enrolled', { type: 'user', id: userId }, {})
      const hadCodes = await countUnusedRecoveryCodes(trx, userId) > 0
      return hadCodes ? {} : { recoveryCodes: await issueRecoveryCodes(trx, ctx, userId, at, codes) }
    })
  if (result === undefined) {
    const failures = await countTotpConfirmFailure(deps.db, userId)
    const dropped = failures !== undefined && failures >= PENDING_TOTP_MAX_FAILURES && await deletePendingTotp(deps.db, userId)
    await recordEvent(deps.db, ctx, 'user.mfa_failed', { type: 'user', id: userId }, {
      reason: 'wrong_code', method: 'totp', during: 'enrolment', ...(dropped ? { setup_discarded: true } : {})
    })
    if (dropped) {
      throw new AppError('totp_not_pending', 409, `${PENDING_TOTP_MAX_FAILURES} wrong codes: this set-up was discarded. Remove its entry from the app and start again.`)
    }
    throw new AppError('invalid_code', 422, 'That is not the code the app shows now; the set-up stays, try the next code.', {
      errors: [{ in: 'body', pointer: '/code', detail: 'does not match' }]
    })
  }
  await Promise.all([deps.failures.reset(budgets[0]!.key), deps.failures.release([budgets[1]!.key])])
  return result
}

/** Refuses to take away a required user's last factor: they could not sign in again without an admin. */
async function assertNotLastRequired (trx: Db, deps: MfaDeps, userId: string, removing: 'totp' | 'passkey'): Promise<void> {
  const user = await findUserById(trx, userId)
  if (user === undefined || !mfaRequiredFor(deps.config, user.role)) return
  const left = await factorCounts(trx, userId)
  const remaining = (left.totp ? 1 : 0) + left.passkeys - 1
  if (remaining < 1 && (removing === 'passkey' || left.totp)) {
    throw new AppError('mfa_required', 409, 'This is your last second factor and this deployment requires one; enrol another first.')
  }
}

/** With the last factor gone, recovery codes would be a factor of their own; they go too. */
async function dropCodesIfNoFactor (trx: Db, userId: string): Promise<void> {
  const left = await factorCounts(trx, userId)
  if (!left.totp && left.passkeys === 0) await deleteRecoveryCodes(trx, userId)
}

export async function removeTotp (deps: MfaDeps, ctx: RequestContext, userId: string): Promise<void> {
  await deps.db.transaction().execute(async trx => {
    await assertNotLastRequired(trx, deps, userId, 'totp')
    if (!await deleteTotp(trx, userId)) throw new AppError('totp_not_pending', 409, 'No authenticator app is enrolled.')
    await dropCodesIfNoFactor(trx, userId)
    await recordEvent(trx, ctx, 'user.totp_removed', { type: 'user', id: userId }, {})
  })
}

export async function regenerateRecoveryCodes (deps: MfaDeps, ctx: RequestContext, userId: string): Promise<string[]> {
  const codes = await prepareRecoveryCodes(deps)
  return await deps.db.transaction().execute(async trx => {
    const factors = await factorCounts(trx, userId)
    if (!factors.totp && factors.passkeys === 0) {
      throw new AppError('mfa_not_enrolled', 409, 'Recovery codes stand in for a second factor; enrol an authenticator app or a passkey first.')
    }
    return await issueRecoveryCodes(trx, ctx, userId, nowIso(), codes)
  })
}

/** Options to register one more passkey for a signed-in user; the challenge is remembered for CEREMONY_MS. */
export async function startPasskeyRegistration (deps: MfaDeps, user: { id: string, username: string }, rp: RelyingParty): Promise<{ options: object, ceremony: 'create' }> {
  const options = await registrationOptions(deps.db, user, rp)
  await rememberCeremony(deps.db, 'register', user.id, options.challenge)
  return { options, ceremony: 'create' }
}

export async function finishPasskeyRegistration (
  deps: MfaDeps, ctx: RequestContext, userId: string, name: string, credential: PasskeyCredential, rp: RelyingParty
): Promise<{ passkey: Passkey, recoveryCodes?: string[] }> {
  const challenge = await challengeOf(credential)
  const at = nowIso()
  const codes = await prepareRecoveryCodes(deps)
  return await deps.db.transaction().execute(async trx => {
    const ceremony = challenge === undefined ? undefined : await takeWebauthnChallenge(trx, 'register', challenge, userId, at)
    if (ceremony === undefined) throw new AppError('passkey_rejected', 422, 'This passkey answers no registration this server started for you, or it took too long; start again.')
    const passkey = await addPasskey(trx, userId, credential, ceremony.webauthn_challenge!, rp, name, at)
    await recordEvent(trx, ctx, 'user.passkey_added', { type: 'user', id: userId }, { passkey_id: passkey.id, name })
    const hadCodes = await countUnusedRecoveryCodes(trx, userId) > 0
    return hadCodes ? { passkey } : { passkey, recoveryCodes: await issueRecoveryCodes(trx, ctx, userId, at, codes) }
  })
}

export async function renameOwnPasskey (deps: MfaDeps, ctx: RequestContext, userId: string, id: string, name: string): Promise<Passkey> {
  return await deps.db.transaction().execute(async trx => {
    const row = await renamePasskey(trx, userId, id, name)
    if (row === undefined) throw new AppError('passkey_not_found', 404, 'You have no passkey with this id.')
    await recordEvent(trx, ctx, 'user.passkey_renamed', { type: 'user', id: userId }, { passkey_id: id, name })
    return toPasskey(row)
  })
}

export async function removeOwnPasskey (deps: MfaDeps, ctx: RequestContext, userId: string, id: string): Promise<void> {
  await deps.db.transaction().execute(async trx => {
    const owned = await findPasskeyOf(trx, userId, id)
    if (owned === undefined) throw new AppError('passkey_not_found', 404, 'You have no passkey with this id.')
    await assertNotLastRequired(trx, deps, userId, 'passkey')
    await deletePasskey(trx, userId, id)
    await dropCodesIfNoFactor(trx, userId)
    await recordEvent(trx, ctx, 'user.passkey_removed', { type: 'user', id: userId }, { passkey_id: id })
  })
}

/**
 * An admin's way back in for a user who lost their factors: removes the
 * authenticator app, every passkey and the recovery codes, and closes open
 * sign-in challenges. Under MFA_REQUIRED the user enrols again at next sign-in.
 */
export async function resetFactors (deps: MfaDeps, ctx: RequestContext, userId: string): Promise<void> {
  await deps.db.transaction().execute(async trx => {
    const user = await findUserById(trx, userId)
    if (user === undefined) throw new AppError('user_not_found', 404, 'No user has this id.')
    const removed = await deleteAllFactors(trx, userId)
    await recordEvent(trx, ctx, 'user.mfa_reset', { type: 'user', id: userId }, {
      totp: removed.totp, passkeys: removed.passkeys, recovery_codes: removed.recoveryCodes
    })
  })
}

// ---------------------------------------------------------------------------
// Passwordless sign-in with a passkey

export async function startPasskeySignIn (deps: MfaDeps, rp: RelyingParty): Promise<{ options: object, ceremony: 'get' }> {
  const options = await authenticationOptions(deps.db, null, rp)
  await rememberCeremony(deps.db, 'passkey', null, options.challenge)
  return { options, ceremony: 'get' }
}

/** The user a passwordless passkey names, before anything is checked; throws ProofRejected when none or disabled. */
export async function passkeyOwner (deps: MfaDeps, credential: PasskeyCredential, now: Date): Promise<{ userId: string, locked: boolean }> {
  const passkey = await findPasskeyOwner(deps.db, typeof credential.id === 'string' ? credential.id : '')
  if (passkey === undefined) throw new ProofRejected('unknown_passkey')
  if (toBool(passkey.disabled)) throw new ProofRejected('disabled', passkey.id)
  return { userId: passkey.id, locked: passkey.locked_until !== null && new Date(passkey.locked_until) > now }
}

/** Takes the ceremony's challenge and checks the assertion, in the transaction that opens the session; throws ProofRejected. */
export async function spendPasskeyAssertion (trx: Db, credential: PasskeyCredential, rp: RelyingParty, userId: string, now: Date): Promise<void> {
  const at = now.toISOString()
  const challenge = await challengeOf(credential)
  const ceremony = challenge === undefined ? undefined : await takeWebauthnChallenge(trx, 'passkey', challenge, null, at)
  if (ceremony === undefined) throw new ProofRejected('unknown_challenge')
  const assertion = await checkAssertion(trx, credential, ceremony.webauthn_challenge!, rp, userId, true, at)
  if (assertion === undefined) throw new ProofRejected('passkey_rejected')
}
