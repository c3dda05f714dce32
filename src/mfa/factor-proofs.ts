import { createHash, randomInt, timingSafeEqual } from 'node:crypto'
import type { Db } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId } from '../lib/ids.ts'
import { open, SecretBoxError } from '../lib/secret-box.ts'
import type { Budget } from '../sessions/failure-counter.ts'
import type { SessionsDeps } from '../sessions/sessions.types.ts'
import { insertChallenge, listUnusedRecoveryCodes, replaceRecoveryCodes } from './mfa.repository.ts'
import type { PasskeyCredential } from './mfa.schemas.ts'
import { CEREMONY_MS } from './webauthn.ts'

/**
 * What the second step of sign-in and a re-authentication both check a
 * factor with (mfa.service.ts, reauthentication.service.ts): the budgets, the
 * TOTP code, the recovery codes, a WebAuthn ceremony's challenge.
 */

type MfaDeps = SessionsDeps
const RECOVERY_CODE_COUNT = 10
/** 32 symbols without 0/o, 1/l/i: ten of them are 50 bits, read aloud or typed without mistakes. */
const RECOVERY_ALPHABET = 'abcdefghjkmnpqrstuvwxyz23456789'

/**
 * A second factor's budgets: the account, from every address together (whoever
 * holds the challenge knows the password already, so spreading guesses over
 * addresses must not multiply them), and the address as for passwords.
 */
export function secondFactorBudgets (deps: MfaDeps, userId: string, ip: string): Budget[] {
  return [
    { key: `mfa:${userId}`, limit: deps.config.mfaMaxFailures },
    { key: `addr:${ip}`, limit: deps.config.loginMaxFailuresPerAddress }
  ]
}

export async function openTotpSecret (deps: MfaDeps, userId: string, sealed: string): Promise<string | undefined> {
  const keys = deps.config.mfaKeyRing
  if (keys.length === 0) return undefined
  try {
    return open(keys, sealed, userId)
  } catch (error) {
    // A key that changed makes the factor unusable until reset; the code is then simply not accepted.
    if (error instanceof SecretBoxError) return undefined
    throw error
  }
}

/** The time step a code belongs to, if it is this secret's code now (±30 s) and later than `after`. */
export async function totpStep (secret: string, code: string, after: number | null): Promise<number | undefined> {
  const token = code.replace(/\s/g, '')
  if (!/^\d{6}$/.test(token)) return undefined
  const { verify: verifyTotp } = await import('otplib')
  const result = await verifyTotp({ secret, token, epochTolerance: 30, ...(after !== null ? { afterTimeStep: after } : {}) })
  // The functional API's result type also covers HOTP, which has no time step.
  return result.valid && 'timeStep' in result ? result.timeStep : undefined
}

export function normaliseRecoveryCode (code: string): string {
  return code.toLowerCase().replace(/[^a-z0-9]/g, '')
}

export function newRecoveryCodes (): string[] {
  return Array.from({ length: RECOVERY_CODE_COUNT }, () => {
    const chars = Array.from({ length: 10 }, () => RECOVERY_ALPHABET[randomInt(RECOVERY_ALPHABET.length)]!).join('')
    return `${chars.slice(0, 5)}-${chars.slice(5)}`
  })
}

/*
 * A recovery code holds about 50 bits: a plain digest of it falls to an
 * offline search by whoever reads the table, and the code then passes for a
 * second factor for as long as it stays unused (months). So each is stored as
 * an argon2id hash at the deployment's password cost (OWASP ASVS 5.0, 6.5.2),
 * behind its first two characters in clear (`ab$argon2id$...`): they pick the
 * one hash a typed code is checked against, so a try costs one verification,
 * not ten, and what stays hashed (8 characters, about 40 bits) would take
 * centuries of a core. Hashes are made and checked before the transaction
 * that stores or spends them: awaited inside it, on SQLite, they would hold
 * the one connection.
 */
const RECOVERY_LOOKUP_LENGTH = 2

/** Ten new codes and the rows that store them, hashed; issueRecoveryCodes writes them. */
export interface PreparedRecoveryCodes { codes: string[], rows: Array<{ id: string, digest: string }> }

export async function prepareRecoveryCodes (deps: MfaDeps): Promise<PreparedRecoveryCodes> {
  const codes = newRecoveryCodes()
  const rows = await Promise.all(codes.map(async code => {
    const normalised = normaliseRecoveryCode(code)
    return { id: newId(), digest: `${normalised.slice(0, RECOVERY_LOOKUP_LENGTH)}$${await deps.passwords.hash(normalised)}` }
  }))
  return { codes, rows }
}

/** Replaces the user's recovery codes with the prepared ones, recorded; returns them (the only time they are seen). */
export async function issueRecoveryCodes (trx: Db, ctx: RequestContext, userId: string, at: string, prepared: PreparedRecoveryCodes): Promise<string[]> {
  await replaceRecoveryCodes(trx, userId, prepared.rows, at)
  await recordEvent(trx, ctx, 'user.recovery_codes_generated', { type: 'user', id: userId }, { count: prepared.codes.length })
  return prepared.codes
}

/**
 * The id of the user's unused recovery code that `typed` is, or undefined.
 * Always one argon2id verification (against the dummy hash when no stored
 * code starts as `typed` does), so the answer's time says nothing. Codes
 * stored before they were hashed (SHA-256 of the code, hex) still match.
 */
export async function matchRecoveryCode (deps: MfaDeps, userId: string, typed: string): Promise<string | undefined> {
  const normalised = normaliseRecoveryCode(typed)
  const lookup = `${normalised.slice(0, RECOVERY_LOOKUP_LENGTH)}$`
  const rows = await listUnusedRecoveryCodes(deps.db, userId)
  const legacy = Buffer.from(createHash('sha256').update(normalised, 'utf8').digest('hex'))
  const old = rows.find(r => !r.digest.includes('$') && r.digest.length === legacy.length && timingSafeEqual(Buffer.from(r.digest), legacy))
  if (old !== undefined) return old.id
  const candidates = rows.filter(r => r.digest.startsWith(lookup))
  if (candidates.length === 0) {
    await deps.passwords.verify(deps.dummyHash, normalised)
    return undefined
  }
  // Two codes of ten share their first characters about once in twenty users: then each is checked.
  for (const candidate of candidates) {
    if (await deps.passwords.verify(candidate.digest.slice(lookup.length), normalised)) return candidate.id
  }
  return undefined
}

export interface MfaProof {
  totpCode?: string | undefined
  recoveryCode?: string | undefined
  passkey?: PasskeyCredential | undefined
  passkeyName?: string | undefined
}

/** A second factor (or a passkey) that was not accepted; `reason` goes in the event. */
export class ProofRejected extends Error {
  /** `userId`: whose factor it was, when that was found before the rejection. */
  constructor (readonly reason: string, readonly userId?: string) { super(reason) }
}

/** A WebAuthn ceremony's challenge, remembered for CEREMONY_MS so that its answer can be checked once. */
export async function rememberCeremony (db: Db, purpose: 'register' | 'passkey', userId: string | null, challenge: string): Promise<void> {
  const now = Date.now()
  await insertChallenge(db, {
    id: newId(),
    purpose,
    digest: null,
    user_id: userId,
    webauthn_challenge: challenge,
    enrol: false,
    created_at: new Date(now).toISOString(),
    expires_at: new Date(now + CEREMONY_MS).toISOString()
  })
}
