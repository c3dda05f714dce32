import { Type, type Static } from 'typebox'
import { Timestamp } from '../lib/openapi.ts'
import { TokenProofFields } from '../tokens/tokens.schemas.ts'

export const InvitationAcceptance = Type.Object({
  ...TokenProofFields,
  password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: 'The password to set, under the password rules.' })
}, {
  $id: 'InvitationAcceptance',
  additionalProperties: false,
  description: 'Accepts an invitation with its link\'s token, or the username and the mailed code, and sets the password.'
})
export type InvitationAcceptance = Static<typeof InvitationAcceptance>

export const EmailVerificationRequest = Type.Object({
  email: Type.Optional(Type.String({ format: 'email', maxLength: 254, description: 'A new address for your account; omitted, your current address is confirmed.', examples: ['ada@example.com'] }))
}, { $id: 'EmailVerificationRequest', additionalProperties: false, description: 'Which address to confirm.' })
export type EmailVerificationRequest = Static<typeof EmailVerificationRequest>

export const EmailVerificationSent = Type.Object({
  email: Type.String({ format: 'email', maxLength: 254, description: 'Where the link and code were mailed.' }),
  expires_at: Timestamp({ description: 'When they stop working (EMAIL_VERIFICATION_LIFETIME_HOURS, default 24 h).' })
}, { $id: 'EmailVerificationSent', additionalProperties: false })

export const EmailConfirmation = Type.Object(TokenProofFields, {
  $id: 'EmailConfirmation',
  additionalProperties: false,
  description: 'Confirms an address with its link\'s token, or the address and the mailed code (`login` is the address).'
})
export type EmailConfirmation = Static<typeof EmailConfirmation>
