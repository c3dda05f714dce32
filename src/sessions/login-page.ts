import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import type { PrincipalUser } from '../auth/principal.ts'
import { assertSameOrigin, sessionCookieOf } from '../auth/auth.plugin.ts'
import { AppError } from '../errors.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { sameOriginRedirect } from '../lib/redirect.ts'
import { type SessionsDeps } from './sessions.types.ts'
import { signIn } from '../sign-in/password.flow.ts'
import { authenticateSession, signOut } from './sessions.service.ts'
import { clearSessionCookie, sessionContext, setSignInCookies } from './cookies.ts'
import { CSP, smallPage } from '../lib/page-style.ts'
import { sendMfaStep } from '../mfa/mfa-pages.ts'
import { signInProviders } from '../sso/oidc.service.ts'

function passwordFormHtml (basePath: string, options: { next: string | undefined, username?: string, error?: string, forgot?: boolean }): string {
  return `<form method="post" action="${basePath}/login"${options.error !== undefined ? ' aria-describedby="error"' : ''}>
${options.next !== undefined ? `<input type="hidden" name="next" value="${escapeHtml(options.next)}">\n` : ''}<label for="username">Username or email</label>
<input id="username" name="username" autocomplete="username" required autofocus value="${escapeHtml(options.username ?? '')}">
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
${options.forgot === true ? `<p><a href="${basePath}/forgot-password">Forgot password?</a></p>\n` : ''}`
}

/** `passwordForm: false`: PASSWORD_SIGN_IN=off with no directory configured, so no password could open anything and no form asks for one. */
function page (basePath: string, options: { next: string | undefined, username?: string, error?: string, providers?: Array<{ id: string, displayName: string }>, passwordForm?: boolean, forgot?: boolean }): string {
  const query = options.next !== undefined ? `?next=${encodeURIComponent(options.next)}` : ''
  // One link per enabled OpenID Connect provider (docs/sso.md).
  const sso = (options.providers ?? []).map(p => `<p><a class="sso" href="${basePath}/sso/${p.id}/start${query}">Sign in with ${escapeHtml(p.displayName)}</a></p>\n`).join('')
  const error = options.error !== undefined ? `<p class="error" role="alert" id="error">${escapeHtml(options.error)}</p>` : ''
  return smallPage({
    title: 'Sign in',
    body: `${error}
${options.passwordForm === false ? '' : passwordFormHtml(basePath, options)}<p><a href="${basePath}/login/passkey${options.next !== undefined ? `?next=${encodeURIComponent(options.next)}` : ''}">Sign in with a passkey</a></p>
${sso}`
  })
}

/**
 * What a browser that is already signed in sees at the sign-in page: who it is
 * signed in as and a sign-out button, plus a link on when there is somewhere to
 * go. Without a web UI behind gatehouse, this is where a sign-in ends.
 */
function signedInPage (basePath: string, user: PrincipalUser, continueTo: string | undefined): string {
  const onward = continueTo !== undefined ? `<p><a href="${escapeHtml(continueTo)}">Continue</a></p>\n` : ''
  return smallPage({
    title: 'Signed in',
    body: `<dl>
<dt>Username</dt>
<dd id="username">${escapeHtml(user.username)}</dd>
<dt>Role</dt>
<dd id="role">${escapeHtml(user.role)}</dd>
</dl>
${onward}<p><a href="${basePath}/account" id="account-link">Your account</a>: password, second factors and where you are signed in.</p>
<form method="post" action="${basePath}/logout">
<button type="submit">Sign out</button>
</form>
`
  })
}

function sendPage (reply: FastifyReply, status: number, html: string): FastifyReply {
  return sendHtmlPage(reply, status, html, CSP)
}

function field (body: unknown, name: string): string {
  const value = (body as Record<string, unknown> | null)?.[name]
  return typeof value === 'string' ? value : ''
}

/** `GET/POST ${basePath}/login` and `POST ${basePath}/logout`: the browser's way in and out. */
/** The sign-in page: a plugin of its own, registered by sessions/sign-in.plugin.ts after the sessions API. */
export default async function loginPage (app: FastifyTypeBox, deps: SessionsDeps): Promise<void> {
  const basePath = app.config.basePath
  const hide = { schema: { hide: true }, config: { accepts: ['application/x-www-form-urlencoded'] } }
  // Sign-in and password forms: a secret in the query string is refused (lib/http.ts secretsInBody).
  const secretForm = { ...hide, config: { ...hide.config, secretsInBody: true } }

  // Without a usable next: the web UI's start page if one is configured, else the signed-in page.
  const afterSignIn = (next: string | undefined): string => next ?? app.config.loginDefaultNext ?? `${basePath}/login`
  const passwordForm = app.config.passwordSignIn || app.config.ldap !== undefined
  // Reset is for local passwords: offered only where they are used at all (docs/email.md#password-reset).
  const pageOf = (options: Parameters<typeof page>[1]): string => page(basePath, { ...options, forgot: app.config.passwordSignIn })

  app.get('/login', { schema: { hide: true } }, async (request, reply) => {
    const next = sameOriginRedirect((request.query as Record<string, unknown>).next)
    const token = sessionCookieOf(request)
    const principal = token !== undefined && token !== '' ? await authenticateSession(deps, token) : undefined
    if (principal?.user != null) {
      return sendPage(reply, 200, signedInPage(basePath, principal.user, next ?? app.config.loginDefaultNext))
    }
    return sendPage(reply, 200, pageOf({ next, passwordForm, providers: await signInProviders(deps.db, app.config) }))
  })

  app.post('/login', secretForm, async (request: FastifyRequest, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const next = sameOriginRedirect(field(request.body, 'next'))
    const username = field(request.body, 'username')
    const password = field(request.body, 'password')
    try {
      if (username === '' || password === '' || username.length > 254 || password.length > 1024) {
        throw new AppError('invalid_credentials', 401, 'missing or oversized fields')
      }
      const result = await signIn(deps, sessionContext(request), username, password)
      if (result.kind === 'mfa') return await sendMfaStep(app, deps, reply, result, next)
      setSignInCookies(request, reply, result, app.config)
      return await reply.code(303).header('Location', afterSignIn(next)).send()
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      if (error.code === 'rate_limited') {
        for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
        return sendPage(reply, 429, pageOf({ next, username, providers: await signInProviders(deps.db, app.config), error: 'Too many failed sign-ins. Wait a few minutes, then try again.' }))
      }
      if (error.code === 'password_sign_in_disabled' || error.code === 'directory_unavailable') {
        for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
        return sendPage(reply, error.status, pageOf({ next, username, passwordForm, providers: await signInProviders(deps.db, app.config), error: error.detail }))
      }
      if (error.code !== 'invalid_credentials') throw error
      return sendPage(reply, 401, pageOf({ next, username, providers: await signInProviders(deps.db, app.config), error: 'Sign-in failed. Check your username and password.' }))
    }
  })

  app.post('/logout', hide, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const token = sessionCookieOf(request)
    const principal = token !== undefined ? await authenticateSession(deps, token) : undefined
    if (principal !== undefined) {
      request.principal = principal
      await signOut(app.db, { ...sessionContext(request), actorType: 'user', actorId: principal.userId }, principal)
    }
    clearSessionCookie(reply)
    return await reply.code(303).header('Location', `${basePath}/login`).send()
  })
}
