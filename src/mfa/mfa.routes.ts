import type { FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { problems, ref, SECURITY } from '../lib/openapi.ts'
import { Session } from '../sessions/sessions.schemas.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import { relyingParty, sessionUser } from './mfa.http.ts'
import { type SessionsDeps } from '../sessions/sessions.types.ts'
import {
  ChallengeTokenBody, MfaSession, MfaStatus, MfaVerifyBody, Passkey, PasskeyAdded, PasskeyAssertionBody, PasskeyCreate, PasskeyParams, PasskeyPatch,
  ReauthBody, Reauthenticated, RecoveryCodeList, TotpConfirm, TotpConfirmed, TotpSetup, UserParams, WebAuthnOptions
} from './mfa.schemas.ts'
import { completeSignIn, passkeySignIn } from '../sign-in/second-step.flow.ts'
import { cancelTotpSetup, confirmTotp, finishPasskeyRegistration, mfaStatus, passkeyOptionsForChallenge, regenerateRecoveryCodes, removeOwnPasskey, removeTotp, renameOwnPasskey, resetFactors, startPasskeyRegistration, startPasskeySignIn, startTotp, startTotpForChallenge } from './mfa.service.ts'
import { assertRecentAuthentication, reauthenticate, startReauthPasskey } from './reauthentication.service.ts'

const JSON_ONLY = ['application/json']
const REAUTH_NOTE = ' Needs a recent sign-in or re-authentication (REAUTH_WINDOW_SECONDS, default 10 minutes): otherwise 403 `reauthentication_required`; ' +
  're-authenticate with Re-authenticate (`POST /auth/api/me/reauthenticate`) and try again.'

export default async function mfaRoutes (app: FastifyTypeBox, deps: SessionsDeps): Promise<void> {
  app.post('/api/login/mfa', {
    schema: {
      tags: ['mfa'],
      operationId: 'complete_login',
      summary: 'Complete Sign-in (second factor)',
      description: 'The second step after Sign In answered 202: the challenge token with exactly one of a TOTP code, a recovery code or a ' +
        'passkey assertion (from Passkey Options for the challenge). When the sign-in asked the user to enrol, the first code of the new ' +
        'TOTP set-up or the new passkey\'s registration completes it, and the answer carries ten recovery codes. ' +
        'Every failure is the same 401 `mfa_failed`; wrong codes count against the account\'s second-factor budget (429 when spent).',
      consumes: JSON_ONLY,
      body: ref(MfaVerifyBody),
      response: { 200: { ...ref(MfaSession), description: 'Signed in; the cookie is set too.' }, ...problems(400, 401, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, accepts: JSON_ONLY }
  }, async (request, reply) => {
    const body = request.body
    const result = await completeSignIn(deps, sessionContext(request), body.challenge_token, {
      totpCode: body.totp_code, recoveryCode: body.recovery_code, passkey: body.passkey, passkeyName: body.passkey_name
    }, relyingParty(request, app.config))
    setSignInCookies(request, reply, result.signIn, app.config)
    const s = result.signIn
    return {
      token: s.token,
      token_type: 'Bearer' as const,
      session_id: s.sessionId,
      expires_at: s.expiresAt,
      user: s.user,
      ...(result.recoveryCodes !== undefined ? { recovery_codes: result.recoveryCodes } : {})
    }
  })

  app.post('/api/login/mfa/totp', {
    schema: {
      tags: ['mfa'],
      operationId: 'start_login_totp',
      summary: 'Set Up TOTP During Sign-in',
      description: 'For a sign-in with `enrolment_required`: a new authenticator-app secret, as a URI and a QR code. Complete the sign-in with its first code.',
      consumes: JSON_ONLY,
      body: ref(ChallengeTokenBody),
      response: { 200: { ...ref(TotpSetup), description: 'Scan it, then send a code to Complete Sign-in.' }, ...problems(400, 401, 409, 415, 422) }
    },
    config: { secretsInBody: true, accepts: JSON_ONLY }
  }, async (request) => await startTotpForChallenge(deps, request.body.challenge_token))

  app.post('/api/login/mfa/passkey-options', {
    schema: {
      tags: ['mfa'],
      operationId: 'login_passkey_options',
      summary: 'Passkey Options for a Sign-in Challenge',
      description: 'WebAuthn options for the second step: `get` to sign with one of the user\'s passkeys, or `create` to register a first one when the sign-in requires enrolment.',
      consumes: JSON_ONLY,
      body: ref(ChallengeTokenBody),
      response: { 200: { ...ref(WebAuthnOptions), description: 'Pass `options` to the browser\'s WebAuthn call.' }, ...problems(401, 415, 422) }
    },
    config: { accepts: JSON_ONLY }
  }, async (request) => await passkeyOptionsForChallenge(deps, request.body.challenge_token, relyingParty(request, app.config)))

  app.post('/api/login/passkey/options', {
    schema: {
      tags: ['mfa'],
      operationId: 'passkey_login_options',
      summary: 'Passkey Sign-in Options',
      description: 'Starts a passwordless sign-in: WebAuthn request options for any of this site\'s passkeys (discoverable credentials), valid 5 minutes.',
      response: { 200: { ...ref(WebAuthnOptions), description: 'Pass `options` to navigator.credentials.get().' }, ...problems(503) }
    }
  }, async (request) => await startPasskeySignIn(deps, relyingParty(request, app.config)))

  app.post('/api/login/passkey', {
    schema: {
      tags: ['mfa'],
      operationId: 'passkey_login',
      summary: 'Sign In With a Passkey',
      description: 'Passwordless sign-in: the assertion for Passkey Sign-in Options\' challenge. The authenticator must verify its user (PIN or biometrics), ' +
        'so the session counts as multi-factor. Every failure is the same 401 `invalid_credentials`, throttled per address like passwords.',
      consumes: JSON_ONLY,
      body: ref(PasskeyAssertionBody),
      response: { 200: { ...ref(Session), description: 'Signed in; the cookie is set too.' }, ...problems(400, 401, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, accepts: JSON_ONLY }
  }, async (request, reply) => {
    const signedIn = await passkeySignIn(deps, sessionContext(request), request.body.credential, relyingParty(request, app.config))
    setSignInCookies(request, reply, signedIn, app.config)
    return { token: signedIn.token, token_type: 'Bearer' as const, session_id: signedIn.sessionId, expires_at: signedIn.expiresAt, user: signedIn.user }
  })

  const own = { scope: 'signed_in' as const }

  /** The session's user, for a change to factors: only with a sign-in or re-authentication within REAUTH_WINDOW_SECONDS. */
  const recentSessionUser = async (request: FastifyRequest): Promise<{ id: string, username: string }> => {
    const user = sessionUser(request)
    await assertRecentAuthentication(deps, { id: request.principal!.id, userId: user.id })
    return user
  }

  app.post('/api/me/reauthenticate', {
    schema: {
      tags: ['mfa'],
      operationId: 'reauthenticate',
      summary: 'Re-authenticate',
      description: 'Proves again that the session\'s person is there, for changes to second factors (docs/mfa.md#recent-authentication): ' +
        'exactly one of the current password, a TOTP code, a recovery code (spent) or a passkey assertion (from Re-authentication Passkey Options). ' +
        'The session may then change factors for REAUTH_WINDOW_SECONDS. Throttled like sign-in: failures are 401 `invalid_credentials` and count ' +
        'against the same budgets (429 when spent). Needs a session, not an API key; a user with neither a password nor a factor signs in again instead.',
      security: SECURITY,
      consumes: JSON_ONLY,
      body: ref(ReauthBody),
      response: { 200: { ...ref(Reauthenticated), description: 'Re-authenticated.' }, ...problems(400, 401, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, ...own, accepts: JSON_ONLY }
  }, async (request) => {
    const user = sessionUser(request)
    const body = request.body
    const result = await reauthenticate(deps, requestContext(request), { id: request.principal!.id, userId: user.id }, {
      password: body.password, totpCode: body.totp_code, recoveryCode: body.recovery_code, passkey: body.passkey
    }, relyingParty(request, app.config))
    return { method: result.method, reauthenticated_at: result.reauthenticatedAt, valid_until: result.validUntil }
  })

  app.post('/api/me/reauthenticate/passkey-options', {
    schema: {
      tags: ['mfa'],
      operationId: 'reauthenticate_passkey_options',
      summary: 'Re-authentication Passkey Options',
      description: 'WebAuthn request options for one of your passkeys, valid 5 minutes; send the assertion to Re-authenticate as `passkey`.',
      security: SECURITY,
      response: { 200: { ...ref(WebAuthnOptions), description: 'Pass `options` to navigator.credentials.get().' }, ...problems(401, 403, 404, 503) }
    },
    config: own
  }, async (request) => await startReauthPasskey(deps, sessionUser(request).id, relyingParty(request, app.config)))

  app.get('/api/me/mfa', {
    schema: {
      tags: ['mfa'],
      operationId: 'get_my_mfa',
      summary: 'My Second Factors',
      description: 'Whether MFA_REQUIRED applies to you, your authenticator app, your passkeys and how many recovery codes are left.',
      security: SECURITY,
      response: { 200: { ...ref(MfaStatus), description: 'Enrolled factors and remaining recovery codes.' }, ...problems(401, 403, 503) }
    },
    config: own
  }, async (request) => await mfaStatus(deps, sessionUser(request).id))

  app.post('/api/me/mfa/totp', {
    schema: {
      tags: ['mfa'],
      operationId: 'start_my_totp',
      summary: 'Set Up an Authenticator App',
      description: 'A new TOTP secret (RFC 6238, SHA-1, 6 digits, 30 s) as a URI and a server-rendered QR code; it works once confirmed with a code. ' +
        'A set-up still waiting for its code is replaced. Answers 409 `totp_not_configured` when the deployment has no MFA_ENCRYPTION_KEY.' + REAUTH_NOTE,
      security: SECURITY,
      response: { 200: { ...ref(TotpSetup), description: 'Scan it, then confirm with a code.' }, ...problems(401, 403, 409, 503) }
    },
    config: own
  }, async (request) => await startTotp(deps, await recentSessionUser(request)))

  app.post('/api/me/mfa/totp/confirm', {
    schema: {
      tags: ['mfa'],
      operationId: 'confirm_my_totp',
      summary: 'Confirm the Authenticator App',
      description: 'The app\'s current code turns the set-up on. With the user\'s first factor come ten recovery codes, shown once. ' +
        'A wrong code (422 `invalid_code`) keeps the set-up for the next try, and counts against the second-factor budget; after 10 wrong codes ' +
        'the set-up is discarded (409 `totp_not_pending`).' + REAUTH_NOTE,
      security: SECURITY,
      consumes: JSON_ONLY,
      body: ref(TotpConfirm),
      response: { 200: { ...ref(TotpConfirmed), description: 'Enrolled.' }, ...problems(400, 401, 403, 409, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, ...own, accepts: JSON_ONLY }
  }, async (request) => {
    const result = await confirmTotp(deps, requestContext(request), (await recentSessionUser(request)).id, request.body.code)
    return result.recoveryCodes !== undefined ? { recovery_codes: result.recoveryCodes } : {}
  })

  app.delete('/api/me/mfa/totp', {
    schema: {
      tags: ['mfa'],
      operationId: 'remove_my_totp',
      summary: 'Remove the Authenticator App',
      description: 'Refused (409 `mfa_required`) when it is the last factor of a user MFA_REQUIRED applies to.' + REAUTH_NOTE,
      security: SECURITY,
      response: { 204: { type: 'null', description: 'Removed.' }, ...problems(401, 403, 409, 503) }
    },
    config: own
  }, async (request, reply) => {
    await removeTotp(deps, requestContext(request), (await recentSessionUser(request)).id)
    return await reply.code(204).send(null)
  })

  app.delete('/api/me/mfa/totp/setup', {
    schema: {
      tags: ['mfa'],
      operationId: 'cancel_my_totp_setup',
      summary: 'Cancel the Authenticator App Set-up',
      description: 'Discards a set-up still waiting for its first code (409 `totp_not_pending` when none waits). An enrolled app stays.',
      security: SECURITY,
      response: { 204: { type: 'null', description: 'Discarded.' }, ...problems(401, 403, 409, 503) }
    },
    config: own
  }, async (request, reply) => {
    await cancelTotpSetup(deps, sessionUser(request).id)
    return await reply.code(204).send(null)
  })

  app.post('/api/me/mfa/recovery-codes', {
    schema: {
      tags: ['mfa'],
      operationId: 'regenerate_my_recovery_codes',
      summary: 'New Recovery Codes',
      description: 'Ten new single-use codes; the old ones stop working.' + REAUTH_NOTE,
      security: SECURITY,
      response: { 200: { ...ref(RecoveryCodeList), description: 'Shown this once.' }, ...problems(401, 403, 409, 503) }
    },
    config: own
  }, async (request) => ({ recovery_codes: await regenerateRecoveryCodes(deps, requestContext(request), (await recentSessionUser(request)).id) }))

  app.post('/api/me/passkeys/options', {
    schema: {
      tags: ['mfa'],
      operationId: 'my_passkey_options',
      summary: 'Passkey Registration Options',
      description: 'Starts adding a passkey: WebAuthn creation options, valid 5 minutes.' + REAUTH_NOTE,
      security: SECURITY,
      response: { 200: { ...ref(WebAuthnOptions), description: 'Pass `options` to navigator.credentials.create().' }, ...problems(401, 403, 503) }
    },
    config: own
  }, async (request) => await startPasskeyRegistration(deps, await recentSessionUser(request), relyingParty(request, app.config)))

  app.post('/api/me/passkeys', {
    schema: {
      tags: ['mfa'],
      operationId: 'add_my_passkey',
      summary: 'Add a Passkey',
      description: 'Registers the credential the browser created for Passkey Registration Options. With the user\'s first factor come ten recovery codes.' + REAUTH_NOTE,
      security: SECURITY,
      consumes: JSON_ONLY,
      body: ref(PasskeyCreate),
      response: {
        201: { ...ref(PasskeyAdded), description: 'Added.' },
        ...problems(401, 403, 415, 422, 503)
      }
    },
    config: { ...own, accepts: JSON_ONLY }
  }, async (request, reply) => {
    const user = await recentSessionUser(request)
    const result = await finishPasskeyRegistration(deps, requestContext(request), user.id, request.body.name, request.body.credential, relyingParty(request, app.config))
    return await reply.code(201).send({ passkey: result.passkey, ...(result.recoveryCodes !== undefined ? { recovery_codes: result.recoveryCodes } : {}) })
  })

  app.patch('/api/me/passkeys/:passkey_id', {
    schema: {
      tags: ['mfa'],
      operationId: 'rename_my_passkey',
      summary: 'Rename a Passkey',
      description: 'Changes the name shown for one of your passkeys.',
      security: SECURITY,
      params: PasskeyParams,
      consumes: JSON_ONLY,
      body: ref(PasskeyPatch),
      response: { 200: { ...ref(Passkey), description: 'Renamed.' }, ...problems(401, 403, 404, 415, 422, 503) }
    },
    config: { ...own, accepts: JSON_ONLY }
  }, async (request) => await renameOwnPasskey(deps, requestContext(request), sessionUser(request).id, request.params.passkey_id, request.body.name))

  app.delete('/api/me/passkeys/:passkey_id', {
    schema: {
      tags: ['mfa'],
      operationId: 'remove_my_passkey',
      summary: 'Remove a Passkey',
      description: 'Refused (409 `mfa_required`) when it is the last factor of a user MFA_REQUIRED applies to.' + REAUTH_NOTE,
      security: SECURITY,
      params: PasskeyParams,
      response: { 204: { type: 'null', description: 'Removed.' }, ...problems(401, 403, 404, 409, 503) }
    },
    config: own
  }, async (request, reply) => {
    await removeOwnPasskey(deps, requestContext(request), (await recentSessionUser(request)).id, request.params.passkey_id)
    return await reply.code(204).send(null)
  })

  app.get('/api/users/:user_id/mfa', {
    schema: {
      tags: ['mfa'],
      operationId: 'get_user_mfa',
      summary: 'A User\'s Second Factors',
      description: 'For administrators: what the user has enrolled (never a secret).',
      security: SECURITY,
      params: UserParams,
      response: { 200: { ...ref(MfaStatus), description: 'Enrolled factors and remaining recovery codes.' }, ...problems(401, 403, 404, 503) }
    },
    config: { scope: 'admin' }
  }, async (request) => await mfaStatus(deps, request.params.user_id))

  app.delete('/api/users/:user_id/mfa', {
    schema: {
      tags: ['mfa'],
      operationId: 'reset_user_mfa',
      summary: 'Reset a User\'s Second Factors',
      description: 'For a user who lost their device: removes the authenticator app, every passkey and the recovery codes (event `user.mfa_reset`). ' +
        'Under MFA_REQUIRED the user enrols again at the next sign-in.',
      security: SECURITY,
      params: UserParams,
      response: { 204: { type: 'null', description: 'Reset.' }, ...problems(401, 403, 404, 503) }
    },
    config: { scope: 'admin' }
  }, async (request, reply) => {
    await resetFactors(deps, requestContext(request), request.params.user_id)
    return await reply.code(204).send(null)
  })
}
