import type {
  AuthenticationResponseJSON, PublicKeyCredentialCreationOptionsJSON, PublicKeyCredentialRequestOptionsJSON, RegistrationResponseJSON
} from '@simplewebauthn/server'
import { toIso, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { newId } from '../lib/ids.ts'
import { findPasskeyByCredentialId, insertPasskey, listPasskeys, recordPasskeyUse } from './mfa.repository.ts'
import type { Passkey } from './mfa.schemas.ts'

/** Where a WebAuthn ceremony is valid: the relying party id (a domain) and the page origins it may run on. */
export interface RelyingParty {
  id: string
  origins: string[]
}

// @simplewebauthn/server (and the X.509 and ASN.1 code under it) is a fifth
// of start-up's module loading; it is loaded by the first passkey ceremony.
type WebAuthn = typeof import('@simplewebauthn/server') & typeof import('@simplewebauthn/server/helpers')
let webauthnModules: Promise<WebAuthn> | undefined
async function webauthn (): Promise<WebAuthn> {
  webauthnModules ??= Promise.all([import('@simplewebauthn/server'), import('@simplewebauthn/server/helpers')])
    .then(([server, helpers]) => ({ ...server, ...helpers }))
  return await webauthnModules
}

/** How long a browser has to finish a ceremony once it has the options. */
export const CEREMONY_MS = 5 * 60_000
const RP_NAME = 'gatehouse'

export function toPasskey (row: { id: string, name: string, created_at: Date | string, last_used_at: Date | string | null, transports: string[] | string }): Passkey {
  return { id: row.id, name: row.name, created_at: toIso(row.created_at), last_used_at: toIso(row.last_used_at), transports: toStringArray(row.transports) }
}

/** The WebAuthn user handle: the user's UUID as its 16 bytes, which names nobody to anyone else. */
function userHandle (userId: string): Uint8Array<ArrayBuffer> {
  return new Uint8Array(Buffer.from(userId.replace(/-/g, ''), 'hex'))
}

export async function registrationOptions (db: Db, user: { id: string, username: string }, rp: RelyingParty): Promise<PublicKeyCredentialCreationOptionsJSON> {
  const existing = await listPasskeys(db, user.id)
  const { generateRegistrationOptions } = await webauthn()
  return await generateRegistrationOptions({
    rpName: RP_NAME,
    rpID: rp.id,
    userName: user.username,
    userID: userHandle(user.id),
    attestationType: 'none',
    timeout: CEREMONY_MS,
    // The same authenticator twice would be one factor counted as two.
    excludeCredentials: existing.map(p => ({ id: p.credential_id, transports: toStringArray(p.transports) })),
    // Discoverable where the authenticator can, so the passkey also signs in without a password.
    authenticatorSelection: { residentKey: 'preferred', userVerification: 'preferred' }
  })
}

export async function authenticationOptions (db: Db, userId: string | null, rp: RelyingParty): Promise<PublicKeyCredentialRequestOptionsJSON> {
  const allow = userId === null ? [] : (await listPasskeys(db, userId)).map(p => ({ id: p.credential_id, transports: toStringArray(p.transports) }))
  const { generateAuthenticationOptions } = await webauthn()
  return await generateAuthenticationOptions({
    rpID: rp.id,
    timeout: CEREMONY_MS,
    // Passwordless sign-in rests on the passkey alone, so the authenticator must verify its user.
    userVerification: userId === null ? 'required' : 'preferred',
    ...(allow.length > 0 ? { allowCredentials: allow } : {})
  })
}

/** The challenge a browser's response answers (from its client data), or undefined when the response is not one. */
export async function challengeOf (response: unknown): Promise<string | undefined> {
  const { decodeClientDataJSON, isoBase64URL } = await webauthn()
  const clientData = (response as { response?: { clientDataJSON?: unknown } } | null)?.response?.clientDataJSON
  if (typeof clientData !== 'string' || clientData.length > 4096 || !isoBase64URL.isBase64URL(clientData)) return undefined
  try {
    const challenge = decodeClientDataJSON(clientData).challenge
    return typeof challenge === 'string' && challenge.length <= 512 ? challenge : undefined
  } catch {
    return undefined
  }
}

function rejected (detail: string, cause?: unknown): AppError {
  return new AppError('passkey_rejected', 422, detail, { cause })
}

/**
 * Checks a new credential against the challenge this server issued and
 * stores it. Attestation is not asked for ("none"): any authenticator the
 * user chooses will do, as with every passkey-accepting site.
 */
export async function addPasskey (trx: Db, userId: string, response: unknown, expectedChallenge: string, rp: RelyingParty, name: string, at: string): Promise<Passkey> {
  const { isoBase64URL, verifyRegistrationResponse } = await webauthn()
  let verified
  try {
    verified = await verifyRegistrationResponse({
      response: response as RegistrationResponseJSON,
      expectedChallenge,
      expectedOrigin: rp.origins,
      expectedRPID: rp.id,
      requireUserVerification: false
    })
  } catch (error) {
    throw rejected(`The passkey could not be verified: ${(error as Error).message}`, error)
  }
  if (!verified.verified) throw rejected('The passkey could not be verified.')
  const { credential } = verified.registrationInfo
  if (await findPasskeyByCredentialId(trx, credential.id) !== undefined) throw rejected('This passkey is registered already.')
  const id = newId()
  const transports = credential.transports ?? []
  await insertPasskey(trx, {
    id,
    user_id: userId,
    credential_id: credential.id,
    public_key: isoBase64URL.fromBuffer(credential.publicKey),
    sign_count: credential.counter,
    transports: JSON.stringify(transports),
    name,
    created_at: at
  })
  return { id, name, created_at: at, last_used_at: null, transports }
}

export interface Assertion {
  passkeyId: string
  userId: string
  userVerified: boolean
}

/**
 * Checks an assertion (a passkey signing the challenge) and records the
 * passkey's use. `userId` restricts it to that user's passkeys (second
 * factor); null takes whichever user the credential belongs to (passwordless).
 * Undefined when it does not verify, names an unknown passkey, or replays a
 * signature counter.
 */
export async function checkAssertion (db: Db, response: unknown, expectedChallenge: string, rp: RelyingParty, userId: string | null, requireUserVerification: boolean, at: string): Promise<Assertion | undefined> {
  const credentialId = (response as { id?: unknown } | null)?.id
  if (typeof credentialId !== 'string' || credentialId.length > 1024) return undefined
  const passkey = await findPasskeyByCredentialId(db, credentialId)
  if (passkey === undefined || (userId !== null && passkey.user_id !== userId)) return undefined
  const previous = Number(passkey.sign_count)
  const { isoBase64URL, verifyAuthenticationResponse } = await webauthn()
  let verified
  try {
    verified = await verifyAuthenticationResponse({
      response: response as AuthenticationResponseJSON,
      expectedChallenge,
      expectedOrigin: rp.origins,
      expectedRPID: rp.id,
      credential: { id: passkey.credential_id, publicKey: isoBase64URL.toBuffer(passkey.public_key), counter: previous, transports: toStringArray(passkey.transports) as never },
      requireUserVerification
    })
  } catch {
    return undefined
  }
  if (!verified.verified) return undefined
  // Two requests bringing the same signature: only one moves the counter.
  if (!await recordPasskeyUse(db, passkey.id, previous, verified.authenticationInfo.newCounter, at)) return undefined
  return { passkeyId: passkey.id, userId: passkey.user_id, userVerified: verified.authenticationInfo.userVerified }
}
