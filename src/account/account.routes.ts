import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext } from '../auth/auth.plugin.ts'
import { coerceFormFields } from '../lib/forms.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import type { BackgroundTasks } from '../lib/background.ts'
import { Session } from '../sessions/sessions.schemas.ts'
import { MfaChallenge } from '../mfa/mfa.schemas.ts'
import { User } from '../users/users.schemas.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import type { SessionsDeps } from '../sessions/sessions.types.ts'
import { acceptInvitation } from '../sign-in/invitation.flow.ts'
import { tokenProofOf } from '../tokens/tokens.schemas.ts'
import { completePasswordReset, issuePasswordReset, requestPasswordReset, type PasswordResetsDeps } from '../password-resets/password-resets.service.ts'
import { PASSWORD_RESET_ACCEPTED_TEXT, PasswordResetAccepted, PasswordResetCompletion, PasswordResetLink, PasswordResetRequest } from '../password-resets/password-resets.schemas.ts'
import { UserIdParams } from '../users/users.schemas.ts'
import { etagOf } from '../users/users.service.ts'
import { confirmEmail, sendEmailVerification, type EmailVerificationDeps } from '../email-verification/email-verification.service.ts'
import { EmailConfirmation, EmailVerificationRequest, EmailVerificationSent, InvitationAcceptance } from './account.schemas.ts'
import { AppError } from '../errors.ts'

export type AccountDeps = SessionsDeps & { background: BackgroundTasks }

export const ACCOUNT_SCHEMAS = [InvitationAcceptance, EmailVerificationRequest, EmailVerificationSent, EmailConfirmation, PasswordResetRequest, PasswordResetAccepted, PasswordResetCompletion, PasswordResetLink]

/** The account's e-mail flows over the API (docs/email.md): accepting an invitation, password reset, confirming an address. */
export default async function accountRoutes (app: FastifyTypeBox, deps: AccountDeps): Promise<void> {
  const resets: PasswordResetsDeps = { ...deps, config: app.config }
  const verification: EmailVerificationDeps = { db: deps.db, passwords: deps.passwords, failures: deps.failures, config: app.config }
  const JSON_TYPES = ['application/json']
  const DOC = ' See docs/email.md.'

  app.post('/api/invitations/accept', {
    schema: {
      tags: ['sessions'],
      operationId: 'accept_invitation',
      summary: 'Accept an Invitation',
      description: 'Sets the invited user\'s password (under the password rules) with the invitation link\'s `token`, or with `login` (the username) and the mailed `code`, ' +
        'and signs them in, as Sign In answers: a session, or, where MFA_REQUIRED applies, 202 with a challenge to enrol a second factor. ' +
        'A used, replaced, revoked or expired token, or a wrong code, is 400 `token_invalid`; a token ends after 5 wrong codes, and wrong codes are throttled per client address (429).' + DOC,
      body: ref(InvitationAcceptance),
      response: {
        200: { ...ref(Session), description: 'Accepted and signed in; the cookie is set too.' },
        202: { ...ref(MfaChallenge), description: 'Accepted; a second factor must be enrolled to finish signing in.' },
        ...problems(400, 415, 422, 429, 503)
      }
    },
    config: { secretsInBody: true, accepts: JSON_TYPES }
  }, async (request, reply) => {
    if (request.headers.origin !== undefined) assertSameOrigin(request, app.config.trustedOrigins)
    const result = await acceptInvitation(deps, sessionContext(request), tokenProofOf(request.body), request.body.password)
    if (result.kind === 'mfa') {
      return await reply.code(202).send({ mfa_required: true as const, challenge_token: result.challengeToken, expires_at: result.expiresAt, methods: result.methods, enrolment_required: result.enrol })
    }
    setSignInCookies(request, reply, result, app.config)
    return { token: result.token, token_type: 'Bearer' as const, session_id: result.sessionId, expires_at: result.expiresAt, user: result.user }
  })

  app.post('/api/password-resets', {
    schema: {
      tags: ['sessions'],
      operationId: 'request_password_reset',
      summary: 'Request a Password Reset',
      description: 'Mails a one-time link and code to set a new password, to the account `email` or `username` names. The answer is the same 202, with the same body, ' +
        'in the same time, whether or not such an account exists, is disabled, or signs in only through single sign-on or a directory (those get no mail): ' +
        'the account is looked up after the answer. Throttled per name and per client address (429); an account gets at most PASSWORD_RESET_MAX_PER_HOUR mails an hour. ' +
        'The link works for PASSWORD_RESET_LIFETIME_MINUTES (60). With PASSWORD_SIGN_IN=off: 403 `password_sign_in_disabled` for everyone.' + DOC,
      consumes: [...JSON_TYPES, 'application/x-www-form-urlencoded'],
      body: ref(PasswordResetRequest),
      response: { 202: { ...ref(PasswordResetAccepted), description: 'Taken; mail follows if an account matched.' }, ...problems(400, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, accepts: [...JSON_TYPES, 'application/x-www-form-urlencoded'] },
    preValidation: coerceFormFields(PasswordResetRequest)
  }, async (request, reply) => {
    const { email, username } = request.body
    const identifier = email ?? username
    if (identifier === undefined || (email !== undefined && username !== undefined)) {
      throw new AppError('validation_failed', 422, 'Give `email` or `username`, one of them.', { errors: [{ in: 'body', pointer: '/email', detail: 'email or username' }] })
    }
    await requestPasswordReset(resets, requestContext(request), identifier)
    return await reply.code(202).send({ status: 'accepted' as const, detail: PASSWORD_RESET_ACCEPTED_TEXT })
  })

  app.post('/api/users/:user_id/password-reset', {
    schema: {
      tags: ['default'],
      security: SECURITY,
      operationId: 'issue_password_reset',
      summary: 'Issue a Password-Reset Link',
      description: 'A one-time link and code for the user to set a new password themselves: mailed to them when mail is configured and they have an address, ' +
        'otherwise in this answer (`url`, `code`) to hand over, shown once. The earlier reset link stops working. ' +
        '409 for a user a reset is not for: disabled, invited and not yet accepted, without password sign-in, a directory user, or single-sign-on only.' + DOC,
      params: UserIdParams,
      response: { 200: { ...ref(PasswordResetLink), description: 'Issued.' }, ...problems(401, 403, 404, 409, 422, 503) }
    },
    config: { scope: 'users:write' }
  }, async (request) => await issuePasswordReset(resets, requestContext(request), request.params.user_id))

  app.post('/api/password-resets/complete', {
    schema: {
      tags: ['sessions'],
      operationId: 'complete_password_reset',
      summary: 'Set a New Password (Reset)',
      description: 'Sets the new password with the reset link\'s `token`, or `login` (username or address) and the mailed `code`. Every session and API key of the account ends, ' +
        'the account lock (if any) is lifted, and the owner is told by mail that the password changed. A used, replaced or expired token, or a wrong code, is 400 `token_invalid`.' + DOC,
      body: ref(PasswordResetCompletion),
      response: { 204: { type: 'null', description: 'The password is set; sign in with it.' }, ...problems(400, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, accepts: JSON_TYPES }
  }, async (request, reply) => {
    await completePasswordReset(resets, requestContext(request), tokenProofOf(request.body), request.body.new_password)
    return await reply.code(204).send(null)
  })

  app.post('/api/me/email', {
    schema: {
      tags: ['sessions'],
      operationId: 'confirm_my_email',
      summary: 'Confirm or Change My Address',
      description: 'Mails a one-time link and code to `email`, a new address for your account, or without it to your current address. A new address takes effect only ' +
        'when it is confirmed (Confirm an Address); the old one is then told. Without SMTP: 409 `mail_unavailable` (an admin can set the address). Needs a session.' + DOC,
      security: SECURITY,
      body: ref(EmailVerificationRequest),
      response: { 202: { ...ref(EmailVerificationSent), description: 'Mailed.' }, ...problems(401, 403, 409, 415, 422, 503) }
    },
    config: { scope: 'signed_in', accepts: JSON_TYPES }
  }, async (request, reply) => {
    return await reply.code(202).send(await sendEmailVerification(verification, request.principal!, requestContext(request), request.body.email))
  })

  app.post('/api/email-verifications/confirm', {
    schema: {
      tags: ['sessions'],
      operationId: 'confirm_email',
      summary: 'Confirm an Address',
      description: 'Confirms an address with its link\'s `token`, or `login` (the address) and the mailed `code`; needs no session. The account\'s address becomes it, ' +
        'with `email_verified: true`. A used, replaced or expired token, or a wrong code, is 400 `token_invalid`.' + DOC,
      body: ref(EmailConfirmation),
      response: { 200: withHeaders({ ...ref(User), description: 'The account, with its confirmed address; `ETag` versions it, as Get User\'s does.' }, 'ETag'), ...problems(400, 409, 415, 422, 429, 503) }
    },
    config: { accepts: JSON_TYPES }
  }, async (request, reply) => {
    const { user, version } = await confirmEmail(verification, requestContext(request), tokenProofOf(request.body))
    return await reply.header('ETag', etagOf(version)).send(user)
  })
}
