import { Type, type Static } from 'typebox'
import { Nullable, ref, Timestamp, Uuid } from '../lib/openapi.ts'
import { User } from '../users/users.schemas.ts'

const MFA_TOKEN_PATTERN = '^gatehouse_mfa_[0-9A-Za-z]{43}$'
const ChallengeToken = Type.String({ maxLength: 57, pattern: MFA_TOKEN_PATTERN, description: 'From the 202 answer of Sign In. Single-use, valid 5 minutes.' })
/** A name a person gives: any printable text. */
const Name = (options: Record<string, unknown> = {}): ReturnType<typeof Type.String> =>
  Type.String({ minLength: 1, maxLength: 64, pattern: '^[^\\u0000-\\u001f\\u007f]+$', ...options })
const Transport = Type.String({ maxLength: 32, pattern: '^[a-z-]+$' })
const B64 = (maxLength: number, description?: string): ReturnType<typeof Type.String> =>
  Type.String({ maxLength, pattern: '^[A-Za-z0-9_-]*={0,2}$', ...(description !== undefined ? { description } : {}) })

export const MFA_METHODS = ['totp', 'recovery_code', 'passkey'] as const
export type MfaMethod = typeof MFA_METHODS[number]

export const MfaChallenge = Type.Object({
  mfa_required: Type.Literal(true),
  challenge_token: Type.String({ maxLength: 57, pattern: MFA_TOKEN_PATTERN, description: 'Send it to Complete Sign-in (`POST /auth/api/login/mfa`) with a second factor.' }),
  expires_at: Timestamp(),
  methods: Type.Array(Type.Enum(MFA_METHODS), {
    maxItems: 3,
    uniqueItems: true,
    description: 'What the user can complete the sign-in with; when `enrolment_required`, what the user can enrol.'
  }),
  enrolment_required: Type.Boolean({ description: 'MFA_REQUIRED applies to this user, who has no second factor yet: enrol one with this token (TOTP set-up or passkey options), then complete the sign-in with it.' })
}, { $id: 'MfaChallenge', additionalProperties: false })
export type MfaChallenge = Static<typeof MfaChallenge>

/** A WebAuthn credential as the browser serialises it (PublicKeyCredential.toJSON(), or @simplewebauthn/browser). */
export const PasskeyCredential = Type.Object({
  id: B64(1024),
  rawId: B64(1024),
  type: Type.Literal('public-key'),
  response: Type.Object({
    clientDataJSON: B64(4096),
    attestationObject: Type.Optional(B64(16_384)),
    authenticatorData: Type.Optional(B64(4096)),
    signature: Type.Optional(B64(1024)),
    userHandle: Type.Optional(Nullable(B64(128))),
    transports: Type.Optional(Type.Array(Transport, { maxItems: 8 })),
    publicKey: Type.Optional(B64(4096)),
    publicKeyAlgorithm: Type.Optional(Type.Integer({ format: 'int32', minimum: -65_536, maximum: 65_535, description: 'A COSE algorithm number.' }))
  }, { additionalProperties: false }),
  clientExtensionResults: Type.Optional(Type.Object({}, { additionalProperties: true, maxProperties: 16 })),
  authenticatorAttachment: Type.Optional(Nullable(Type.String({ maxLength: 32, pattern: '^[a-z-]+$' })))
}, {
  $id: 'PasskeyCredential',
  additionalProperties: false,
  description: 'What `navigator.credentials.create()` or `.get()` gave, as JSON (`credential.toJSON()`, or @simplewebauthn/browser\'s startRegistration/startAuthentication).'
})
export type PasskeyCredential = Static<typeof PasskeyCredential>

export const MfaVerifyBody = Type.Object({
  challenge_token: ChallengeToken,
  totp_code: Type.Optional(Type.String({ minLength: 1, maxLength: 16, pattern: '^[0-9 ]+$', description: 'The 6 digits the authenticator app shows.' })),
  recovery_code: Type.Optional(Type.String({ minLength: 1, maxLength: 32, pattern: '^[A-Za-z0-9 -]+$', description: 'One of the ten recovery codes; each works once (case, spaces and dashes do not matter).' })),
  passkey: Type.Optional(ref(PasskeyCredential)),
  passkey_name: Type.Optional(Name({ description: 'When enrolling a passkey: a name to tell it apart later.' }))
}, { $id: 'MfaVerifyBody', additionalProperties: false, description: 'Exactly one of `totp_code`, `recovery_code` or `passkey`.' })
export type MfaVerifyBody = Static<typeof MfaVerifyBody>

export const ChallengeTokenBody = Type.Object({ challenge_token: ChallengeToken }, { $id: 'ChallengeTokenBody', additionalProperties: false })
export type ChallengeTokenBody = Static<typeof ChallengeTokenBody>

const RecoveryCodes = Type.Array(Type.String({ maxLength: 11, pattern: '^[a-z0-9]{5}-[a-z0-9]{5}$' }), {
  minItems: 10,
  maxItems: 10,
  description: 'Ten single-use recovery codes, shown this once: only their digests are kept. Each replaces a second factor once.'
})

export const MfaSession = Type.Object({
  token: Type.String({ maxLength: 61, pattern: '^gatehouse_session_[0-9A-Za-z]{43}$', description: 'The session token; browsers get it as a cookie too.' }),
  token_type: Type.Literal('Bearer'),
  session_id: Uuid(),
  expires_at: Timestamp(),
  user: ref(User),
  recovery_codes: Type.Optional(RecoveryCodes)
}, { $id: 'MfaSession', additionalProperties: false, description: 'A session, like Sign In\'s; with `recovery_codes` when this sign-in enrolled the user\'s first factor.' })

export const TotpSetup = Type.Object({
  secret: Type.String({ maxLength: 64, pattern: '^[A-Z2-7]+=*$', description: 'The shared secret, base32, for typing into an authenticator app.' }),
  otpauth_uri: Type.String({ maxLength: 512, format: 'uri', pattern: '^otpauth://totp/', description: 'The `otpauth://totp/...` URI the QR code holds.' }),
  qr_svg: Type.String({ maxLength: 65_536, pattern: '^<svg ', description: 'The URI as a QR code, an SVG document.' })
}, { $id: 'TotpSetup', additionalProperties: false })
export type TotpSetup = Static<typeof TotpSetup>

export const TotpConfirm = Type.Object({
  code: Type.String({ minLength: 1, maxLength: 16, pattern: '^[0-9 ]+$', description: 'The code the app shows now.' })
}, { $id: 'TotpConfirm', additionalProperties: false })

export const RecoveryCodeList = Type.Object({ recovery_codes: RecoveryCodes }, { $id: 'RecoveryCodeList', additionalProperties: false })

export const TotpConfirmed = Type.Object({
  recovery_codes: Type.Optional(RecoveryCodes)
}, { $id: 'TotpConfirmed', additionalProperties: false, description: 'With `recovery_codes` when this was the user\'s first factor.' })

export const Passkey = Type.Object({
  id: Uuid(),
  name: Name(),
  created_at: Timestamp(),
  last_used_at: Nullable(Timestamp()),
  transports: Type.Array(Transport, { maxItems: 8, description: 'How the browser reaches the authenticator (usb, internal, hybrid, …).' })
}, { $id: 'Passkey', additionalProperties: false })
export type Passkey = Static<typeof Passkey>

export const PasskeyCreate = Type.Object({
  name: Name({ description: 'To tell it apart later, e.g. "Work laptop".' }),
  credential: ref(PasskeyCredential)
}, { $id: 'PasskeyCreate', additionalProperties: false })

export const PasskeyAdded = Type.Object({
  passkey: ref(Passkey),
  recovery_codes: Type.Optional(RecoveryCodes)
}, { $id: 'PasskeyAdded', additionalProperties: false, description: 'With `recovery_codes` when this was the user\'s first factor.' })

export const PasskeyPatch = Type.Object({
  name: Name()
}, { $id: 'PasskeyPatch', additionalProperties: false })

export const PasskeyAssertionBody = Type.Object({
  credential: ref(PasskeyCredential)
}, { $id: 'PasskeyAssertionBody', additionalProperties: false })

export const WebAuthnOptions = Type.Object({
  options: Type.Object({}, {
    additionalProperties: true,
    maxProperties: 16,
    description: 'PublicKeyCredentialCreationOptionsJSON or PublicKeyCredentialRequestOptionsJSON: pass it to ' +
      '`PublicKeyCredential.parseCreationOptionsFromJSON` / `parseRequestOptionsFromJSON` or to @simplewebauthn/browser.'
  }),
  ceremony: Type.Enum(['create', 'get'], { description: '`create`: register a new passkey; `get`: sign with one.' })
}, { $id: 'WebAuthnOptions', additionalProperties: false })

export const MfaStatus = Type.Object({
  required: Type.Boolean({ description: 'MFA_REQUIRED applies to this user.' }),
  totp: Type.Object({
    enrolled: Type.Boolean(),
    pending: Type.Boolean({ description: 'A set-up waits for its first code.' })
  }, { additionalProperties: false }),
  passkeys: Type.Array(ref(Passkey), { maxItems: 1000 }),
  recovery_codes_remaining: Type.Integer({ format: 'int32', minimum: 0, maximum: 10 })
}, { $id: 'MfaStatus', additionalProperties: false })
export type MfaStatus = Static<typeof MfaStatus>

export const ReauthBody = Type.Object({
  password: Type.Optional(Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: 'Your current password.' })),
  totp_code: Type.Optional(Type.String({ minLength: 1, maxLength: 16, pattern: '^[0-9 ]+$', description: 'The 6 digits your authenticator app shows.' })),
  recovery_code: Type.Optional(Type.String({ minLength: 1, maxLength: 32, pattern: '^[A-Za-z0-9 -]+$', description: 'One of your recovery codes; it is spent.' })),
  passkey: Type.Optional(ref(PasskeyCredential))
}, { $id: 'ReauthBody', additionalProperties: false, description: 'Exactly one of `password`, `totp_code`, `recovery_code` or `passkey` (an assertion for Re-authentication Passkey Options).' })

export const Reauthenticated = Type.Object({
  method: Type.Enum(['password', ...MFA_METHODS], { description: 'What proved it.' }),
  reauthenticated_at: Timestamp(),
  valid_until: Timestamp({ description: 'Changes to factors are allowed until then (REAUTH_WINDOW_SECONDS).' })
}, { $id: 'Reauthenticated', additionalProperties: false })

export const PasskeyParams = Type.Object({ passkey_id: Uuid() }, { additionalProperties: false })
export const UserParams = Type.Object({ user_id: Uuid() }, { additionalProperties: false })

export const MFA_SCHEMAS = [
  MfaChallenge, PasskeyCredential, MfaVerifyBody, ChallengeTokenBody, MfaSession, TotpSetup, TotpConfirm, RecoveryCodeList,
  TotpConfirmed, Passkey, PasskeyAdded, PasskeyCreate, PasskeyPatch, PasskeyAssertionBody, WebAuthnOptions, MfaStatus, ReauthBody, Reauthenticated
]
