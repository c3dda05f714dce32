import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { authenticateApiKey } from '../api-keys/api-keys.service.ts'
import { AppError } from '../errors.ts'
import { CredentialCache } from './credential-cache.ts'
import { authenticateSession, SESSION_TOKEN_PREFIX } from '../sessions/sessions.service.ts'
import { hasScope, isAdmin, type Principal, type RequestContext, type Scope } from './principal.ts'

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | null
  }
  interface FastifyContextConfig {
    /**
     * Who may call the route: a scope, or `signed_in` for any valid credential.
     * Absent means the route is public.
     */
    scope?: Scope | 'signed_in'
    /** Also allow a credential of the user named by the `user_id` path parameter (self-service). */
    self?: boolean
  }
}

/** The session cookie: `__Host-` (Secure, Path=/, no Domain) over HTTPS; browsers refuse that prefix over HTTP. */
export const SESSION_COOKIE_SECURE = '__Host-gatehouse_session'
export const SESSION_COOKIE_PLAIN = 'gatehouse_session'

const CHALLENGE = 'Bearer realm="gatehouse", ApiKey realm="gatehouse"'
const UNSAFE_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE'])

function unauthenticated (detail: string): AppError {
  return new AppError('unauthenticated', 401, detail, { headers: { 'WWW-Authenticate': CHALLENGE } })
}

interface Credential { secret: string, fromCookie: boolean }

/**
 * Finds the credential, in the order a careful client would prefer: headers
 * first, the main API's `?API_KEY=` next, the browser's session cookie last.
 * The query value is removed from `request.query` so nothing downstream can echo it.
 */
function takeCredential (request: FastifyRequest, allowQuery: boolean): Credential | undefined {
  const query = request.query as Record<string, unknown> | undefined
  const fromQuery = query?.API_KEY
  // Deleted only when present: a delete turns the object into a slower dictionary for every later reader.
  if (fromQuery !== undefined) delete query!.API_KEY
  const authorization = request.headers.authorization
  if (authorization !== undefined) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization)
    if (match === null) throw unauthenticated('The Authorization header must be "Bearer <API key or session token>".')
    return { secret: match[1]!, fromCookie: false }
  }
  const header = request.headers['x-api-key']
  if (typeof header === 'string' && header !== '') return { secret: header, fromCookie: false }
  if (fromQuery !== undefined) {
    if (!allowQuery) throw unauthenticated('API keys in the URL are switched off here; send the key in the X-API-Key or Authorization header.')
    if (typeof fromQuery !== 'string' || fromQuery === '') throw unauthenticated('Give API_KEY once, with a value.')
    // The URL form is for API keys, as the main API's clients send them
    // (PRODUCT §4). A session is a person's sign-in: in a URL it would stay in
    // browser history, proxies' logs and Referer headers (ASVS 14.2.1).
    if (fromQuery.startsWith(SESSION_TOKEN_PREFIX)) {
      throw unauthenticated('A session token is never taken from the URL; send it as "Authorization: Bearer <token>" or X-API-Key.')
    }
    return { secret: fromQuery, fromCookie: false }
  }
  const cookie = sessionCookieOf(request)
  if (cookie !== undefined && cookie !== '') return { secret: cookie, fromCookie: true }
  return undefined
}

/**
 * The session cookie a request brings. Over HTTPS only the `__Host-` one,
 * which is the only one gatehouse sets there: any host of the same site
 * (another subdomain) can set a plain `gatehouse_session` for the whole
 * domain, and with it sign a browser in as someone else (cookie tossing).
 * Browsers accept a `__Host-` cookie only from this host, over HTTPS.
 */
export function sessionCookieOf (request: FastifyRequest): string | undefined {
  const cookies = request.cookies
  return request.protocol === 'https' ? cookies[SESSION_COOKIE_SECURE] : cookies[SESSION_COOKIE_SECURE] ?? cookies[SESSION_COOKIE_PLAIN]
}

/**
 * Cross-site request forgery: a browser sends the session cookie with any
 * request to us, so a write that rides on the cookie must come from our own
 * origin (or one the operator trusts). Browsers send Origin on every
 * non-GET request; Sec-Fetch-Site where Origin is absent.
 */
export function assertSameOrigin (request: FastifyRequest, trustedOrigins: readonly string[]): void {
  const origin = request.headers.origin
  const own = `${request.protocol}://${request.host}`
  // "null" is what a browser sends when a page's referrer policy hides the origin; then only Sec-Fetch-Site can vouch.
  if (origin !== undefined && origin !== 'null') {
    if (origin === own || trustedOrigins.includes(origin)) return
  } else if (request.headers['sec-fetch-site'] === 'same-origin') {
    return
  }
  throw new AppError('csrf_rejected', 403, 'A change made with the session cookie must come from this service\'s own pages (the Origin header did not match).')
}

export function requestContext (request: FastifyRequest): RequestContext {
  const principal = request.principal
  // Events name a signed-in user as the actor (not their session), and a key by its id.
  return {
    actorType: principal === null ? 'system' : principal.type === 'session' ? 'user' : 'api_key',
    actorId: principal === null ? null : principal.type === 'session' ? principal.userId : principal.id,
    requestId: request.id,
    clientIp: request.ip,
    ...(principal !== null ? { credential: { admin: isAdmin(principal), userId: principal.userId } } : {})
  }
}

/**
 * The principal a secret stands for, read from the database: session tokens
 * carry their own prefix; everything else is tried as an API key. The answer
 * is kept in the credential cache under `key` (the hook below reads it there
 * while fresh, see credential-cache.ts); failures are never cached.
 */
async function authenticate (app: FastifyInstance, secret: string, key: string | undefined): Promise<Principal | undefined> {
  const cache = app.credentials
  const generation = cache.generation()
  const principal = secret.startsWith(SESSION_TOKEN_PREFIX)
    ? await authenticateSession({ db: app.db, config: app.config }, secret)
    : await authenticateApiKey(app.db, secret)
  if (principal !== undefined && key !== undefined) cache.set(key, principal, generation)
  return principal
}

/** Authenticates every request to a route that declares who may call it, before its body is even read. */
export default fp(async function authPlugin (app: FastifyInstance) {
  app.decorateRequest('principal', null)
  app.addHook('onRequest', async (request, reply) => {
    const { scope, self } = request.routeOptions.config
    if (scope === undefined) {
      // Public routes ignore credentials, but a query key must still not travel further.
      const query = request.query as Record<string, unknown> | undefined
      if (query?.API_KEY !== undefined) delete query.API_KEY
      return
    }
    const credential = takeCredential(request, app.config.allowQueryApiKey)
    if (credential === undefined) {
      throw unauthenticated('This operation needs a credential: an API key ("Authorization: Bearer <key>", X-API-Key or ?API_KEY=) or a signed-in session.')
    }
    // A cached answer is taken without another async call: the common case, once per request.
    const cache = app.credentials
    const key = cache.enabled ? CredentialCache.keyOf(credential.secret) : undefined
    const principal = (key !== undefined ? cache.get(key) : undefined) ?? await authenticate(app, credential.secret, key)
    if (principal === undefined) throw unauthenticated('The credential is unknown, expired, revoked or signed out.')
    request.principal = principal
    if (app.spendCredentialBudget !== undefined) await app.spendCredentialBudget(request, reply)
    if (credential.fromCookie && UNSAFE_METHODS.has(request.method)) assertSameOrigin(request, app.config.trustedOrigins)
    // A provisioning key reaches the SCIM door and nothing else, not even what any credential may call.
    if (principal.scopes.has('scim') && scope !== 'scim') {
      throw new AppError('forbidden', 403, 'A key with the "scim" scope is for SCIM provisioning (/scim/v2) only.')
    }
    if (scope === 'signed_in' || hasScope(principal, scope)) return
    const userId = (request.params as { user_id?: string } | undefined)?.user_id
    if (self === true && principal.userId !== null && userId === principal.userId) return
    throw new AppError('forbidden', 403, `This operation needs the "${scope}" scope, which this credential does not have.`)
  })
}, { name: 'auth' })
