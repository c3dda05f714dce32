import { createRequire } from 'node:module'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import rateLimit, { type FastifyRateLimitStore, type FastifyRateLimitStoreCtor } from '@fastify/rate-limit'
import type { Redis } from 'ioredis'
import { AppError } from '../errors.ts'

const WINDOW_MS = 60_000
const NAMESPACE = 'gatehouse:rate:'

type IncrCallback = Parameters<FastifyRateLimitStore['incr']>[1]
interface LibraryStore { incr: (key: string, callback: IncrCallback, timeWindow: number, max: number) => void }
// The package exports only the plugin; its Redis store (one Lua script that counts and expires atomically) lives in this file.
const RedisStore = createRequire(import.meta.url)('@fastify/rate-limit/store/RedisStore.js') as
  new (continueExceeding: boolean, exponentialBackoff: boolean, redis: Redis, key: string) => LibraryStore

/**
 * The library's Redis store, under our namespace only. Its own child() names
 * each limiter after a route, which a limiter made by createRateLimit does not
 * have: keys came out as `gatehouse:rate:undefinedundefined-addr:…`. Our key
 * generators already say which budget a key counts (`addr:…`, `cred:…`).
 */
function namespacedRedisStore (redis: Redis): FastifyRateLimitStoreCtor {
  const store = new RedisStore(false, false, redis, NAMESPACE)
  return class NamespacedRedisStore implements FastifyRateLimitStore {
    incr (key: string, callback: IncrCallback, timeWindow?: number, max?: number): void {
      store.incr(key, callback, timeWindow ?? WINDOW_MS, max ?? 0)
    }

    child (): FastifyRateLimitStore {
      return this
    }
  }
}

type Limiter = (request: FastifyRequest) => Promise<{ isAllowed: boolean, max?: number, remaining?: number, ttlInSeconds?: number, isExceeded?: boolean }>

/**
 * Counts one request against a limiter; answers 429 (problem+json, Retry-After,
 * RateLimit-*) when over, and otherwise reports the budget in RateLimit-* headers.
 */
async function spend (limiter: Limiter, request: FastifyRequest, reply: FastifyReply, what: string): Promise<void> {
  const result = await limiter(request)
  if (result.isAllowed || result.max === undefined) return
  const reset = String(result.ttlInSeconds ?? 0)
  reply.header('RateLimit-Limit', String(result.max))
  reply.header('RateLimit-Remaining', String(result.remaining ?? 0))
  reply.header('RateLimit-Reset', reset)
  if (result.isExceeded === true) {
    throw new AppError('rate_limited', 429, `Too many requests ${what}: at most ${result.max} a minute. Retry after ${reset} s.`, {
      headers: { 'Retry-After': String(Math.max(1, Number(reset))) }
    })
  }
}

/**
 * The general request limit, in one-minute windows, shared through Redis
 * when configured. Two budgets: one per client address for every request
 * (so made-up credentials and refused requests count too), checked before
 * anything else; and one per credential (API key or session, by its id),
 * checked once the credential is known. 0 switches a budget off. Health,
 * readiness and metrics are exempt. Sign-in has its own, much stricter,
 * failure-based throttle (sessions/failure-counter.ts).
 */
export default fp(async function rateLimitPlugin (app: FastifyInstance, options: { redis: Redis | undefined }) {
  const { rateLimitPerCredential, rateLimitPerAddress } = app.config
  if (rateLimitPerCredential === 0 && rateLimitPerAddress === 0) return
  await app.register(rateLimit, {
    global: false,
    timeWindow: WINDOW_MS,
    // A Redis that fails or times out fails the request (503 dependency_unavailable), never lets it through unlimited.
    skipOnError: false,
    ...(options.redis !== undefined ? { store: namespacedRedisStore(options.redis) } : {})
  })
  const exempt = (request: FastifyRequest): boolean => request.routeOptions.config.rateLimit === false

  if (rateLimitPerAddress > 0) {
    const perAddress = app.createRateLimit({ keyGenerator: (request) => `addr:${request.ip}`, max: rateLimitPerAddress, timeWindow: WINDOW_MS }) as Limiter
    app.addHook('onRequest', async (request, reply) => {
      if (!exempt(request)) await spend(perAddress, request, reply, 'from this address')
    })
  }
  if (rateLimitPerCredential > 0) {
    const perCredential = app.createRateLimit({
      keyGenerator: (request) => `cred:${request.principal!.type}:${request.principal!.id}`,
      max: rateLimitPerCredential,
      timeWindow: WINDOW_MS
    }) as Limiter
    // Called by the auth plugin once it knows who is calling.
    app.decorate('spendCredentialBudget', async (request: FastifyRequest, reply: FastifyReply) => {
      if (request.principal !== null && !exempt(request)) await spend(perCredential, request, reply, 'with this credential')
    })
  }
}, { name: 'gatehouse-rate-limit' })

declare module 'fastify' {
  interface FastifyInstance {
    spendCredentialBudget?: (request: FastifyRequest, reply: FastifyReply) => Promise<void>
  }
}
