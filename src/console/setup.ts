import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext } from '../auth/auth.plugin.ts'
import { isAdmin, type RequestContext } from '../auth/principal.ts'
import { authenticateApiKey } from '../api-keys/api-keys.service.ts'
import { AppError } from '../errors.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { passwordPolicyOf } from '../lib/password-policy.ts'
import { sendMfaStep } from '../mfa/mfa-pages.ts'
import { CSP, smallPage } from '../lib/page-style.ts'
import { type SessionsDeps } from '../sessions/sessions.types.ts'
import { reserveAttempt } from '../sessions/throttle.ts'
import { signIn } from '../sign-in/password.flow.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import { createUser, listUsersPage, type UsersDeps } from '../users/users.service.ts'
import { fieldOfError, parseCreate, text, type FieldErrors, type Fields } from './console.forms.ts'

interface FormState {
  username?: string
  errors?: FieldErrors
  /** A message about the whole form (a wrong key, too many tries). */
  error?: string
}

function page (title: string, body: string): string {
  return smallPage({ title, body })
}

function fieldError (errors: FieldErrors | undefined, name: string): string {
  const message = errors?.[name]
  return message === undefined ? '' : `<p class="error" id="${name}-error">${escapeHtml(message)}</p>\n`
}

function describedBy (errors: FieldErrors | undefined, name: string): string {
  return errors?.[name] !== undefined ? ` aria-invalid="true" aria-describedby="${name}-error"` : ''
}

function setupForm (base: string, minLength: number, state: FormState): string {
  const { errors } = state
  return page('Set up the first admin', `${state.error !== undefined ? `<p class="error" role="alert" id="error">${escapeHtml(state.error)}</p>\n` : ''}<p>Paste the admin API key gatehouse printed at its first start, and choose the username and password of the first admin user. You are then signed in to the admin console.</p>
<form method="post" action="${base}/admin/setup">
<label for="api_key">Admin API key</label>
${fieldError(errors, 'api_key')}<input id="api_key" name="api_key" type="password" autocomplete="off" required${describedBy(errors, 'api_key')}>
<label for="username">Username</label>
${fieldError(errors, 'username')}<input id="username" name="username" autocomplete="username" required value="${escapeHtml(state.username ?? '')}"${describedBy(errors, 'username')}>
<label for="password">Password (at least ${minLength} characters)</label>
${fieldError(errors, 'password')}<input id="password" name="password" type="password" autocomplete="new-password" required${describedBy(errors, 'password')}>
<button type="submit">Create admin and sign in</button>
</form>
`)
}

function alreadySetUpPage (base: string): string {
  return page('Already set up', `<p>An admin user exists, so the console is set up. Sign in with that user's username and password.</p>
<p><a href="${base}/login?next=${encodeURIComponent(`${base}/admin`)}">Sign in to the admin console</a></p>
`)
}

/**
 * `/admin/setup`: the way into the console on a fresh deployment. The admin
 * API key the first start printed opens it once: whoever holds the key
 * chooses the first admin's username and password, the user is created
 * through the API's own createUser (its events name the key as the actor)
 * and signed in. Offered only while no enabled admin user exists; a wrong key
 * counts against the address's sign-in budget, as a wrong password does.
 * Outside the console's own hooks (console.routes.ts), which let only
 * signed-in admins through.
 */
export default async function setupRoutes (app: FastifyTypeBox, deps: SessionsDeps): Promise<void> {
  const base = app.config.basePath
  const usersDeps: UsersDeps = { db: deps.db, passwords: deps.passwords, passwordPolicy: passwordPolicyOf(app.config) }
  const minLength = app.config.passwordMinLength
  const send = (reply: FastifyReply, status: number, html: string): FastifyReply => sendHtmlPage(reply, status, html, CSP)

  const adminExists = async (): Promise<boolean> => {
    const admins = await listUsersPage(usersDeps, { role: 'admin', disabled: false }, 'created_at', 1, undefined)
    return admins.users.length > 0
  }

  app.get('/admin/setup', { schema: { hide: true } }, async (_request, reply) => {
    if (await adminExists()) return send(reply, 200, alreadySetUpPage(base))
    return send(reply, 200, setupForm(base, minLength, {}))
  })

  app.post('/admin/setup', { schema: { hide: true }, config: { accepts: ['application/x-www-form-urlencoded'] } }, async (request: FastifyRequest, reply) => {
    const fields = (request.body ?? {}) as Fields
    const username = text(fields, 'username').trim()
    const password = text(fields, 'password')
    const secret = text(fields, 'api_key').trim()
    try {
      assertSameOrigin(request, app.config.trustedOrigins)
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      return send(reply, error.status, page('Refused', `<p class="error" role="alert">${escapeHtml(error.detail)}</p>\n`))
    }
    if (await adminExists()) return send(reply, 409, alreadySetUpPage(base))

    const addressBudget = `addr:${request.ip}`
    try {
      await reserveAttempt(deps, [{ key: addressBudget, limit: app.config.loginMaxFailuresPerAddress }])
    } catch (error) {
      if (!(error instanceof AppError) || error.code !== 'rate_limited') throw error
      for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
      return send(reply, 429, setupForm(base, minLength, { username, error: 'Too many failed attempts from this address. Wait a few minutes, then try again.' }))
    }
    const principal = secret === '' ? undefined : await authenticateApiKey(deps.db, secret)
    if (principal === undefined || !isAdmin(principal)) {
      // The unit stays taken: a wrong key is a failed sign-in.
      return send(reply, 401, setupForm(base, minLength, { username, errors: { api_key: 'This is not an admin API key of this deployment (or it was revoked).' } }))
    }
    await deps.failures.release([addressBudget])

    const parsed = parseCreate({ username, password, role: 'admin' }, usersDeps.passwordPolicy)
    if (!parsed.ok) return send(reply, 422, setupForm(base, minLength, { username, errors: parsed.errors }))
    const ctx: RequestContext = { ...requestContext(request), actorType: 'api_key', actorId: principal.id }
    try {
      await createUser(usersDeps, principal, ctx, parsed.value)
    } catch (error) {
      const field = error instanceof AppError ? fieldOfError(error) : undefined
      if (field === undefined) throw error
      const appError = error as AppError
      return send(reply, appError.status, setupForm(base, minLength, { username, errors: { [field]: appError.detail } }))
    }
    request.log.info({ username }, 'first admin user created through the set-up page')

    // Signed in as any sign-in is: MFA_REQUIRED asks for a second factor here, before the console opens.
    const next = `${base}/admin`
    try {
      const result = await signIn(deps, sessionContext(request), username, password)
      if (result.kind === 'mfa') return await sendMfaStep(app, deps, reply, result, next)
      setSignInCookies(request, reply, result, app.config)
      return await reply.code(303).header('Location', next).send()
    } catch (error) {
      // The user exists now; only the automatic sign-in did not happen (PASSWORD_SIGN_IN=off, say).
      if (!(error instanceof AppError)) throw error
      return send(reply, 200, page('Admin created', `<p>${escapeHtml(username)} is an admin now, but could not be signed in: ${escapeHtml(error.detail)}</p>
<p><a href="${base}/login?next=${encodeURIComponent(next)}">Sign in</a></p>
`))
    }
  })
}
