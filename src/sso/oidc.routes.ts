import { createHash } from 'node:crypto'
import { Type } from 'typebox'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { AppError } from '../errors.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import { sendMfaStep } from '../mfa/mfa-pages.ts'
import { sameOriginRedirect } from '../lib/redirect.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import { listIdentities, unlinkIdentity } from './identities.service.ts'
import { MAX_IDENTITIES, MAX_PROVIDERS, OidcProvider, OidcProviderCreate, OidcProviderPatch, PROVIDER_ID_PATTERN, ProviderParams, UserIdentity, UserIdentityParams, UserParams } from './oidc.schemas.ts'
import { finishLogin } from '../sign-in/oidc.flow.ts'
import { LOGIN_STATE_MS, SsoRefusal, startLogin, type SsoDeps } from './oidc.service.ts'
import { createProvider, deleteProvider, getProvider, listProviders, updateProvider } from './providers.service.ts'

/** Holds `state` between the redirect to the provider and its answer, so the answer is only taken in the browser that set out. */
const STATE_COOKIE_PLAIN = 'gatehouse_oidc_state'
const STATE_COOKIE_SECURE = '__Host-gatehouse_oidc_state'

const PROVIDER_ID = new RegExp(PROVIDER_ID_PATTERN)

const STYLE = `body{font:16px/1.5 system-ui,sans-serif;margin:0;min-height:100vh;display:grid;place-items:center;background:#f4f5f7;color:#1b1d21}
main{background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002;width:min(22rem,90vw)}h1{font-size:1.4rem;margin:0 0 1rem}
.error{background:#fde8e8;color:#8a1c1c;border:1px solid #e5a3a3;padding:.6rem;border-radius:4px}a{color:#1f5fcf;font-weight:600}a:focus{outline:3px solid #2f6fde;outline-offset:1px}`
const CSP = `default-src 'none'; style-src 'sha256-${createHash('sha256').update(STYLE).digest('base64')}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`

function refusalPage (basePath: string, message: string, next: string | undefined): string {
  const back = `${basePath}/login${next !== undefined ? `?next=${encodeURIComponent(next)}` : ''}`
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign-in failed</title>
<style>${STYLE}</style>
</head>
<body>
<main>
<h1>Sign-in failed</h1>
<p class="error" role="alert" id="error">${escapeHtml(message)}</p>
<p><a href="${escapeHtml(back)}">Back to sign-in</a></p>
</main>
</body>
</html>
`
}

export default async function oidcRoutes (app: FastifyTypeBox, deps: SsoDeps): Promise<void> {
  const basePath = app.config.basePath
  // Through safeNext again: a sign-in started before an upgrade kept its `next` as given, unencoded.
  const afterSignIn = (next: string | undefined): string => sameOriginRedirect(next) ?? app.config.loginDefaultNext ?? `${basePath}/login`
  /**
   * The redirect URI: the same at the start and at the callback, and what the provider has registered.
   * Undefined when the Host header cannot be part of a URL (`a b`): no browser sends such a one.
   */
  const redirectUri = (request: FastifyRequest, providerId: string): string | undefined => {
    const uri = `${app.config.oidcRedirectOrigin ?? `${request.protocol}://${request.host}`}${basePath}/sso/${providerId}/callback`
    return URL.canParse(uri) ? uri : undefined
  }
  const BAD_HOST = 'This address (its Host header) is not one a sign-in can return to.'
  const page = (reply: FastifyReply, status: number, message: string, next?: string): FastifyReply =>
    sendHtmlPage(reply, status, refusalPage(basePath, message, next), CSP)
  // The id goes into a redirect URI and a lookup; anything else is answered as an unknown provider.
  const validId = (id: string): boolean => PROVIDER_ID.test(id)

  // Browser routes: plain redirects and pages, left out of the API document like /auth/login.
  app.get('/sso/:provider_id/start', { schema: { hide: true } }, async (request, reply) => {
    const providerId = (request.params as { provider_id: string }).provider_id
    const next = sameOriginRedirect((request.query as Record<string, unknown>).next)
    try {
      if (!validId(providerId)) throw new AppError('sso_provider_not_found', 404, 'unknown provider')
      const uri = redirectUri(request, providerId)
      if (uri === undefined) return page(reply, 400, BAD_HOST, next)
      const started = await startLogin(deps, providerId, next, uri)
      const secure = request.protocol === 'https'
      reply.setCookie(secure ? STATE_COOKIE_SECURE : STATE_COOKIE_PLAIN, started.state, {
        path: '/', httpOnly: true, sameSite: 'lax', secure, maxAge: LOGIN_STATE_MS / 1000
      })
      return await reply.code(303).header('Location', started.url).send()
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      if (error.code === 'sso_provider_not_found') return page(reply, 404, 'This sign-in provider is not known or not enabled.', next)
      if (error.code === 'dependency_unavailable') return page(reply.header('Retry-After', '5'), 503, 'The identity provider cannot be reached just now. Try again in a minute.', next)
      throw error
    }
  })

  app.get('/sso/:provider_id/callback', { schema: { hide: true } }, async (request, reply) => {
    const providerId = (request.params as { provider_id: string }).provider_id
    const secure = request.protocol === 'https'
    const cookieName = secure ? STATE_COOKIE_SECURE : STATE_COOKIE_PLAIN
    const browserState = request.cookies[cookieName]
    reply.clearCookie(cookieName, { path: '/', httpOnly: true, sameSite: 'lax', secure })
    try {
      if (!validId(providerId)) throw new AppError('sso_provider_not_found', 404, 'unknown provider')
      const query = request.url.includes('?') ? request.url.slice(request.url.indexOf('?')) : ''
      const uri = redirectUri(request, providerId)
      if (uri === undefined) return page(reply, 400, BAD_HOST)
      const result = await finishLogin(deps, sessionContext(request), providerId, new URL(uri + query), browserState, uri)
      if (result.kind === 'mfa') return await sendMfaStep(app, deps, reply, result, result.next)
      setSignInCookies(request, reply, result, app.config)
      return await reply.code(303).header('Location', afterSignIn(result.next)).send()
    } catch (error) {
      if (error instanceof SsoRefusal) return page(reply, error.status, error.detail, error.next)
      if (!(error instanceof AppError)) throw error
      if (error.code === 'sso_provider_not_found') return page(reply, 404, 'This sign-in provider is not known or not enabled.')
      if (error.code === 'dependency_unavailable') return page(reply.header('Retry-After', '5'), 503, 'The identity provider cannot be reached just now. Try again in a minute.')
      if (error.code === 'rate_limited') {
        for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
        return page(reply, 429, 'Too many failed sign-ins. Wait a few minutes, then try again.')
      }
      throw error
    }
  })

  const common = { tags: ['sso'], security: SECURITY }
  const admin = { scope: 'admin' as const }

  app.get('/api/sso/providers', {
    schema: {
      ...common,
      operationId: 'list_sso_providers',
      summary: 'List SSO Providers',
      description: 'Every OpenID Connect provider: those from OIDC_PROVIDERS (`source: environment`, read-only here), then those created here. Client secrets are never shown.',
      response: { 200: { ...Type.Array(ref(OidcProvider), { maxItems: MAX_PROVIDERS * 2 }), description: 'The providers.' }, ...problems(401, 403, 503) }
    },
    config: admin
  }, async () => await listProviders(app.db, app.config))

  app.post('/api/sso/providers', {
    schema: {
      ...common,
      operationId: 'create_sso_provider',
      summary: 'Create SSO Provider',
      description: 'Adds an OpenID Connect provider. Register `redirect_path` (under the origin browsers use) as its redirect URI at the provider. ' +
        'The client secret is write-only and stored encrypted with MFA_ENCRYPTION_KEY.',
      body: ref(OidcProviderCreate),
      response: {
        201: withHeaders({ ...ref(OidcProvider), description: 'The provider, without its secret.' }, 'Location'),
        ...problems(401, 403, 409, 413, 415, 422, 503)
      }
    },
    config: { ...admin, accepts: ['application/json'] }
  }, async (request, reply) => {
    const provider = await createProvider(app.db, requestContext(request), app.config, request.body)
    return await reply.code(201).header('Location', `${basePath}/api/sso/providers/${provider.id}`).send(provider)
  })

  app.get('/api/sso/providers/:provider_id', {
    schema: {
      ...common,
      operationId: 'get_sso_provider',
      summary: 'Get SSO Provider',
      description: 'One provider, without its client secret.',
      params: ProviderParams,
      response: { 200: { ...ref(OidcProvider), description: 'The provider.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request) => await getProvider(app.db, app.config, request.params.provider_id))

  app.patch('/api/sso/providers/:provider_id', {
    schema: {
      ...common,
      operationId: 'update_sso_provider',
      summary: 'Update SSO Provider',
      description: 'A JSON merge patch (RFC 7396) of a provider created through the API; those from OIDC_PROVIDERS answer 409.',
      params: ProviderParams,
      body: ref(OidcProviderPatch),
      response: { 200: { ...ref(OidcProvider), description: 'The updated provider.' }, ...problems(401, 403, 404, 409, 413, 415, 422, 503) }
    },
    config: { ...admin, accepts: ['application/merge-patch+json', 'application/json'] }
  }, async (request) => await updateProvider(app.db, requestContext(request), app.config, request.params.provider_id, request.body))

  app.delete('/api/sso/providers/:provider_id', {
    schema: {
      ...common,
      operationId: 'delete_sso_provider',
      summary: 'Delete SSO Provider',
      description: 'Removes a provider created through the API (409 for one from OIDC_PROVIDERS). Its users keep their accounts.',
      params: ProviderParams,
      response: { 204: { type: 'null', description: 'Deleted.' }, ...problems(401, 403, 404, 409, 422, 503) }
    },
    config: admin
  }, async (request, reply) => {
    await deleteProvider(app.db, requestContext(request), app.config, request.params.provider_id)
    return await reply.code(204).send(null)
  })

  app.get('/api/users/:user_id/identities', {
    schema: {
      ...common,
      operationId: 'list_user_identities',
      summary: 'List Linked Identities',
      description: 'The identity-provider accounts that sign in as this user (OpenID Connect, LDAP), oldest first.',
      params: UserParams,
      response: { 200: { ...Type.Array(ref(UserIdentity), { maxItems: MAX_IDENTITIES }), description: 'The linked identities.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request) => await listIdentities(app.db, request.params.user_id))

  app.delete('/api/users/:user_id/identities/:identity_id', {
    schema: {
      ...common,
      operationId: 'unlink_user_identity',
      summary: 'Unlink Identity',
      description: 'Removes the link; that provider account\'s next sign-in is treated as a first one. The user and their sessions stay.',
      params: UserIdentityParams,
      response: { 204: { type: 'null', description: 'Unlinked.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: admin
  }, async (request, reply) => {
    await unlinkIdentity(app.db, requestContext(request), request.params.user_id, request.params.identity_id)
    return await reply.code(204).send(null)
  })
}
