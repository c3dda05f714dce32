import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext } from '../auth/auth.plugin.ts'
import { coerceFormFields } from '../lib/forms.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import { AppError } from '../errors.ts'
import { User } from '../users/users.schemas.ts'
import { endUserSessions, etagOf, getUser } from '../users/users.service.ts'
import { LoginBody, PasswordChange, Session, SessionList, SessionParams, SessionsEnded, SessionsOfUserParams, UserSessionParams } from './sessions.schemas.ts'
import { type SessionsDeps } from './sessions.types.ts'
import { signIn } from '../sign-in/password.flow.ts'
import {
  changeOwnPassword, endOtherOwnSessions, endOwnSession, endUserSession, listOwnSessions, listUserSessions, signOut
} from './sessions.service.ts'
import { MfaChallenge } from '../mfa/mfa.schemas.ts'
import { clearSessionCookie, sessionContext, setSignInCookies } from './cookies.ts'

/**
 * `X-Auth-Groups`: each name percent-encoded as encodeURIComponent does, then
 * joined by `,`. A header value is Latin-1 without CR or LF, or Node refuses
 * to write it (and the gate refuses every member): any name a client can
 * store, `データ` or one holding a comma or a line break, reads back exactly
 * with `split(',').map(decodeURIComponent)`. A lone surrogate (which would
 * make encodeURIComponent throw) is written as U+FFFD, as UTF-8 stores it.
 */
function groupsHeader (groups: readonly string[]): string {
  return groups.map(name => encodeURIComponent(name.replace(/\p{Surrogate}/gu, '\uFFFD'))).join(',')
}

export default async function sessionsRoutes (app: FastifyTypeBox, deps: SessionsDeps): Promise<void> {
  const FORM_TYPES = ['application/json', 'application/x-www-form-urlencoded']

  app.post('/api/login', {
    schema: {
      tags: ['sessions'],
      operationId: 'login',
      summary: 'Sign In',
      description: 'Starts a session. API clients use the returned token as a bearer token; browsers get it as an HttpOnly cookie. ' +
        'Every failure (unknown user, wrong password, disabled or locked account) is the same 401 `invalid_credentials`. ' +
        'Too many failures for one account from one address, or from one address overall, answer 429 with Retry-After. ' +
        'For a user with a second factor (or who must enrol one, MFA_REQUIRED) a right password answers 202 with a challenge token instead of a session: ' +
        'finish with Complete Sign-in (`POST /auth/api/login/mfa`); see docs/mfa.md.',
      consumes: FORM_TYPES,
      body: ref(LoginBody),
      response: {
        200: { ...ref(Session), description: 'Signed in; the cookie is set too.' },
        202: { ...ref(MfaChallenge), description: 'The password is right; a second factor is needed to finish.' },
        ...problems(400, 401, 403, 415, 422, 429, 503)
      }
    },
    config: { secretsInBody: true, accepts: FORM_TYPES },
    preValidation: coerceFormFields(LoginBody)
  }, async (request, reply) => {
    // A sign-in from another site's form would sign the browser into an account of the attacker's choosing.
    if (request.headers.origin !== undefined) assertSameOrigin(request, app.config.trustedOrigins)
    const result = await signIn(deps, sessionContext(request), request.body.username, request.body.password)
    if (result.kind === 'mfa') {
      return await reply.code(202).send({
        mfa_required: true as const, challenge_token: result.challengeToken, expires_at: result.expiresAt, methods: result.methods, enrolment_required: result.enrol
      })
    }
    setSignInCookies(request, reply, result, app.config)
    return { token: result.token, token_type: 'Bearer' as const, session_id: result.sessionId, expires_at: result.expiresAt, user: result.user }
  })

  app.post('/api/logout', {
    schema: {
      tags: ['sessions'],
      operationId: 'logout',
      summary: 'Sign Out',
      description: 'Ends the current session on the server; its token and cookie stop working at once.',
      security: SECURITY,
      response: { 204: { type: 'null', description: 'Signed out.' }, ...problems(401, 403, 503) }
    },
    config: { scope: 'signed_in' }
  }, async (request, reply) => {
    await signOut(app.db, requestContext(request), request.principal!)
    clearSessionCookie(reply)
    return await reply.code(204).send(null)
  })

  app.get('/api/me', {
    schema: {
      tags: ['sessions'],
      operationId: 'get_me',
      summary: 'Who Am I',
      description: 'The user behind the credential: a signed-in user\'s session, or an API key owned by a user (a deployment key has none: 403). ' +
        'Its `ETag` is Get User\'s, for an `If-Match` on Update User.',
      security: SECURITY,
      response: { 200: withHeaders({ ...ref(User), description: 'The signed-in user; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 503) }
    },
    config: { scope: 'signed_in' }
  }, async (request, reply) => {
    if (request.principal!.userId === null) {
      throw new AppError('forbidden', 403, 'This credential is a deployment API key; it belongs to no user.')
    }
    const { user, version } = await getUser({ db: app.db }, request.principal!.userId)
    return await reply.header('ETag', etagOf(version)).send(user)
  })

  app.put('/api/me/password', {
    schema: {
      tags: ['sessions'],
      operationId: 'change_my_password',
      summary: 'Change My Password',
      description: 'Needs the current password, whatever the session\'s age: it is the recent proof this change asks for, and it counts as a ' +
        're-authentication of this session (docs/mfa.md#recent-authentication). Wrong current passwords are throttled like sign-ins. ' +
        'Ends your other sessions and revokes your API keys. Needs a session, not an API key.',
      security: SECURITY,
      body: ref(PasswordChange),
      response: { 204: { type: 'null', description: 'Changed.' }, ...problems(400, 401, 403, 415, 422, 429, 503) }
    },
    config: { secretsInBody: true, scope: 'signed_in', accepts: ['application/json'] }
  }, async (request, reply) => {
    await changeOwnPassword(deps, request.principal!, requestContext(request), request.body.current_password, request.body.new_password)
    return await reply.code(204).send(null)
  })

  const own = { scope: 'signed_in' as const }
  const admin = { scope: 'admin' as const }
  const SESSIONS_DOC = ' See docs/sessions.md#your-sessions.'

  app.get('/api/me/sessions', {
    schema: {
      tags: ['sessions'],
      operationId: 'list_my_sessions',
      summary: 'List My Sessions',
      description: 'Where you are signed in: your sessions that still work, most recently used first, with the device, address, ' +
        'how each was opened and whether a second factor was shown; the one making the request has `current: true`. Needs a session, not an API key.' + SESSIONS_DOC,
      security: SECURITY,
      response: { 200: { ...SessionList, description: 'Your live sessions.' }, ...problems(401, 403, 503) }
    },
    config: own
  }, async (request) => await listOwnSessions(app, request.principal!))

  app.delete('/api/me/sessions/:session_id', {
    schema: {
      tags: ['sessions'],
      operationId: 'end_my_session',
      summary: 'End One of My Sessions',
      description: 'Its token and cookie stop working at once, on every instance. Ending the current session signs out (and clears the cookie). ' +
        'A session id that is not one of yours is 404 `session_not_found`. Needs a session, not an API key.' + SESSIONS_DOC,
      security: SECURITY,
      params: SessionParams,
      response: { 204: { type: 'null', description: 'Ended.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: own
  }, async (request, reply) => {
    const { current } = await endOwnSession(app.db, requestContext(request), request.principal!, request.params.session_id)
    if (current) clearSessionCookie(reply)
    return await reply.code(204).send(null)
  })

  app.post('/api/me/sessions/end-others', {
    schema: {
      tags: ['sessions'],
      operationId: 'end_my_other_sessions',
      summary: 'End My Other Sessions',
      description: 'Signs you out everywhere else: every session of yours but the one making the request ends at once. API keys stay. ' +
        'Needs a session, not an API key.' + SESSIONS_DOC,
      security: SECURITY,
      response: { 200: { ...ref(SessionsEnded), description: 'The other sessions ended.' }, ...problems(401, 403, 503) }
    },
    config: own
  }, async (request) => ({ ended: await endOtherOwnSessions(app.db, requestContext(request), request.principal!) }))

  app.get('/api/users/:user_id/sessions', {
    schema: {
      tags: ['sessions'],
      operationId: 'list_user_sessions',
      summary: 'List a User\'s Sessions',
      description: 'For administrators: the user\'s sessions that still work, as List My Sessions shows them.' + SESSIONS_DOC,
      security: SECURITY,
      params: SessionsOfUserParams,
      response: { 200: { ...SessionList, description: 'The user\'s live sessions.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request) => await listUserSessions(app, request.principal!, request.params.user_id))

  app.delete('/api/users/:user_id/sessions/:session_id', {
    schema: {
      tags: ['sessions'],
      operationId: 'end_user_session',
      summary: 'End a User\'s Session',
      description: 'For administrators: ends one session of the user at once (`session.ended`, reason `ended_by_admin`). Their API keys stay.' + SESSIONS_DOC,
      security: SECURITY,
      params: UserSessionParams,
      response: { 204: { type: 'null', description: 'Ended.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request, reply) => {
    const { current } = await endUserSession(app.db, requestContext(request), request.principal!, request.params.user_id, request.params.session_id)
    if (current) clearSessionCookie(reply)
    return await reply.code(204).send(null)
  })

  app.delete('/api/users/:user_id/sessions', {
    schema: {
      tags: ['sessions'],
      operationId: 'end_user_sessions',
      summary: 'End All of a User\'s Sessions',
      description: 'For administrators: signs the user out everywhere (one `session.ended` each, reason `ended_by_admin`), as the console\'s End sessions does. ' +
        'Their API keys stay. Includes your own session when the user is you.' + SESSIONS_DOC,
      security: SECURITY,
      params: SessionsOfUserParams,
      response: { 200: { ...ref(SessionsEnded), description: 'The user\'s sessions ended.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request) => ({ ended: await endUserSessions({ db: app.db }, request.principal!, requestContext(request), request.params.user_id) }))

  app.get('/api/verify', {
    schema: {
      tags: ['sessions'],
      operationId: 'verify',
      summary: 'Verify (for a reverse proxy)',
      description: 'For nginx `auth_request` or Traefik ForwardAuth: 200 with X-Auth-User-Id, X-Auth-Username, X-Auth-Role and X-Auth-Groups ' +
        'for a valid session cookie, session token or API key; 401 otherwise. No password work happens here. ' +
        '`X-Auth-Groups` holds each group name encoded with `encodeURIComponent`, joined by `,` (docs/nginx.md). ' +
        '`X-Auth-MFA: true` when the session\'s sign-in included a second factor or a passkey (always `false` for API keys), so the web UI can require it. ' +
        'Under MFA_REQUIRED, `X-Auth-Role` is `user` for a session without a second factor, whatever the account\'s role (docs/mfa.md).',
      security: SECURITY,
      response: { 200: { type: 'null', description: 'The credential is valid; identity in the X-Auth-* headers.' }, ...problems(401, 503) }
    },
    config: { scope: 'signed_in' },
    // The proxy logs the request it guards; one more line per page view here would be noise.
    logLevel: 'warn'
  }, async (request, reply) => {
    const principal = request.principal!
    const user = principal.user
    return await reply
      .header('X-Auth-User-Id', user?.id ?? '')
      .header('X-Auth-Username', user?.username ?? '')
      .header('X-Auth-Role', user?.role ?? (principal.scopes.has('admin') ? 'admin' : ''))
      .header('X-Auth-Groups', groupsHeader(user?.groups ?? []))
      .header('X-Auth-Credential', principal.type)
      .header('X-Auth-MFA', principal.mfa === true ? 'true' : 'false')
      .code(200).send(null)
  })
}
