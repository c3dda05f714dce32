import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { authenticateApiKey } from '../api-keys/api-keys.service.ts'
import { AppError } from '../errors.ts'
import { hasScope, type Principal, type RequestContext, type Scope } from './principal.ts'

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | null
  }
  interface FastifyContextConfig {
    /** The scope a route needs; absent means the route is public. */
    scope?: Scope
  }
}

const CHALLENGE = 'Bearer realm="gatehouse", ApiKey realm="gatehouse"'

function unauthenticated (detail: string): AppError {
  return new AppError('unauthenticated', 401, detail, { headers: { 'WWW-Authenticate': CHALLENGE } })
}

/**
 * Finds the credential, in the order a careful client would prefer: headers
 * first, the main API's `?API_KEY=` last. The query value is removed from
 * `request.query` so nothing downstream can echo it.
 */
function takeCredential (request: FastifyRequest, allowQuery: boolean): string | undefined {
  const query = request.query as Record<string, unknown> | undefined
  const fromQuery = query?.API_KEY
  if (query !== undefined) delete query.API_KEY
  const authorization = request.headers.authorization
  if (authorization !== undefined) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization)
    if (match === null) throw unauthenticated('The Authorization header must be "Bearer <API key>".')
    return match[1]
  }
  const header = request.headers['x-api-key']
  if (typeof header === 'string' && header !== '') return header
  if (fromQuery !== undefined) {
    if (!allowQuery) throw unauthenticated('API keys in the URL are switched off here; send the key in the X-API-Key or Authorization header.')
    if (typeof fromQuery !== 'string' || fromQuery === '') throw unauthenticated('Give API_KEY once, with a value.')
    return fromQuery
  }
  return undefined
}

export function requestContext (request: FastifyRequest): RequestContext {
  return {
    actorType: request.principal?.type ?? 'system',
    actorId: request.principal?.id ?? null,
    requestId: request.id,
    clientIp: request.ip
  }
}

/** Authenticates every request to a route that declares a scope, before its body is even read. */
export default fp(async function authPlugin (app: FastifyInstance) {
  app.decorateRequest('principal', null)
  app.addHook('onRequest', async (request) => {
    const scope = request.routeOptions.config.scope
    if (scope === undefined) {
      // Public routes ignore credentials, but a query key must still not travel further.
      delete (request.query as Record<string, unknown> | undefined)?.API_KEY
      return
    }
    const credential = takeCredential(request, app.config.allowQueryApiKey)
    if (credential === undefined) throw unauthenticated('This operation needs an API key: send it as "Authorization: Bearer <key>", in X-API-Key, or as ?API_KEY=.')
    const principal = await authenticateApiKey(app.db, credential)
    if (principal === undefined) throw unauthenticated('The API key is unknown, expired or revoked.')
    request.principal = principal
    if (!hasScope(principal, scope)) {
      throw new AppError('forbidden', 403, `This operation needs the "${scope}" scope, which this credential does not have.`)
    }
  })
}, { name: 'auth' })
