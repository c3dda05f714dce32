import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import rateLimit from '@fastify/rate-limit'
import type { Redis } from 'ioredis'
import { AppError } from '../errors.ts'
import { SESSION_COOKIE_PLAIN, SESSION_COOKIE_SECURE } from '../auth/auth.plugin.ts'
import { digestOf } from '../lib/secrets.ts'

/**
 * The general request limit: per credential (API key or session) when the
 * request carries one, per client address otherwise, in one-minute windows,
 * with RateLimit-* headers. Shared through Redis when configured. Sign-in has
 * its own, much stricter, failure-based throttle (sessions/failure-counter.ts).
 */
export default fp(async function rateLimitPlugin (app: FastifyInstance, options: { redis: Redis | undefined }) {
  const { rateLimitPerCredential, rateLimitPerAddress } = app.config
  if (rateLimitPerCredential === 0) return
  const credentialOf = (request: FastifyRequest): string | undefined => {
    const header = request.headers.authorization ?? request.headers['x-api-key']
    if (typeof header === 'string' && header !== '') return header
    const query = (request.query as Record<string, unknown> | undefined)?.API_KEY
    if (typeof query === 'string' && query !== '') return query
    return request.cookies?.[SESSION_COOKIE_SECURE] ?? request.cookies?.[SESSION_COOKIE_PLAIN]
  }
  await app.register(rateLimit, {
    global: true,
    timeWindow: 60_000,
    // Only a digest of the credential is kept as the key, in memory or in Redis.
    keyGenerator: (request) => {
      const credential = credentialOf(request)
      return credential !== undefined ? `cred:${digestOf(credential).slice(0, 32)}` : `addr:${request.ip}`
    },
    max: (_request, key) => key.startsWith('cred:') ? rateLimitPerCredential : rateLimitPerAddress,
    ...(options.redis !== undefined ? { redis: options.redis, nameSpace: 'gatehouse:rate:' } : {}),
    enableDraftSpec: true,
    errorResponseBuilder: (_request, context) => new AppError('rate_limited', 429,
      `Too many requests: at most ${context.max} a minute. Slow down and retry after ${context.after}.`,
      { headers: { 'Retry-After': String(Math.max(1, Math.ceil(context.ttl / 1000))) } })
  })
}, { name: 'gatehouse-rate-limit', dependencies: ['@fastify/cookie'] })
