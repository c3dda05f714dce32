import { Type, type Static } from 'typebox'
import { Timestamp } from '../lib/openapi.ts'
import { TokenProofFields } from '../tokens/tokens.schemas.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'

export const PasswordResetRequest = Type.Object({
  email: Type.Optional(Type.String({ format: 'email', maxLength: 254, description: 'The account\'s address, ignoring case.', examples: ['ada@example.com'] })),
  username: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: USERNAME_PATTERN, description: 'Or the account\'s username, ignoring case.' }))
}, {
  $id: 'PasswordResetRequest',
  additionalProperties: false,
  description: 'Whose password to reset: `email` or `username` (one of them).',
  examples: [{ email: 'ada@example.com' }]
})
export type PasswordResetRequest = Static<typeof PasswordResetRequest>

export const PASSWORD_RESET_ACCEPTED_TEXT = 'If an account with a password matches, a link to reset its password has been mailed to its address. It works for a limited time.'

export const PasswordResetAccepted = Type.Object({
  status: Type.Literal('accepted'),
  detail: Type.Literal(PASSWORD_RESET_ACCEPTED_TEXT)
}, { $id: 'PasswordResetAccepted', additionalProperties: false, description: 'The same answer whether or not an account matched.' })

export const PasswordResetCompletion = Type.Object({
  ...TokenProofFields,
  new_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: 'The new password, under the password rules.' })
}, {
  $id: 'PasswordResetCompletion',
  additionalProperties: false,
  description: 'Sets a new password with a reset link\'s token, or the username or address and the mailed code.'
})
export type PasswordResetCompletion = Static<typeof PasswordResetCompletion>

export const PasswordResetLink = Type.Object({
  delivery: Type.Union([Type.Literal('queued'), Type.Literal('not_sent')], {
    description: '`queued`: the mail with the link and code is in the outbox, to be sent to the user\'s address; whether it went shows in the ' +
      '`mail.sent` or `mail.failed` event and in `/readyz` `checks.mail`. `not_sent`: no mail (no SMTP, or no address); hand over `url` (or `code`) yourself.'
  }),
  mailed: Type.Boolean({ deprecated: true, description: 'The same as `delivery: "queued"` (it never meant delivered); use `delivery`.' }),
  expires_at: Timestamp({ description: 'When the link and code stop working (PASSWORD_RESET_LIFETIME_MINUTES, default 60).' }),
  url: Type.Optional(Type.String({ format: 'uri', maxLength: 2048, description: 'Only without SMTP: the one-time link to hand to the user. Shown once.' })),
  code: Type.Optional(Type.String({ maxLength: 16, pattern: '^[A-Z0-9]{4}-[A-Z0-9]{4}$', description: 'Only without SMTP: the short code the user may type at the reset page instead.' }))
}, { $id: 'PasswordResetLink', additionalProperties: false, description: 'A password-reset link an administrator issued for a user (docs/email.md#password-reset).' })
export type PasswordResetLink = Static<typeof PasswordResetLink>
