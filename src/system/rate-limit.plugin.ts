import { createRequire } from 'node:module'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { FastifyRateLimitStore } from '@fastify/rate-limit'
import type { Redis } from 'ioredis'
import { AppError } from '../errors.ts'

const WINDOW_MS = 60_000
const NAMESPACE = 'gatehouse:rate:'

type IncrCallback = Parameters<FastifyRateLimitStore['incr']>[1]
interface LibraryStore { incr: (key: string, callback: IncrCallback, timeWindow: number, max: number) => void }
// The package exports only the plugin; its stores live in files of their own: an LRU-bounded map of counters,
// and for Redis one Lua script that counts and expires atomically.
const requireHere = createRequire(import.meta.url)
const RedisStore = requireHere('@fastify/rate-limit/store/RedisStore.js') as
  new (continueExceeding: boolean, exponentialBackoff: boolean, redis: Redis, key: string) => LibraryStore
const LocalStore = requireHere('@fastify/rate-limit/store/LocalStore.js') as
  new (continueExceeding: boolean, exponentialBackoff: boolean, cache?: number) => LibraryStore

/**
 * Counts one request against a budget: rejects with a 429 problem
 * (Retry-After, RateLimit-*) when over it, with the store's error when it
 * could not count (a Redis that fails or times out fails the request, 503
 * dependency_unavailable, never lets it through unlimited), and otherwise
 * resolves, the budget reported in RateLimit-* headers.
 *
 * The library's stores are used without its request handler, which took
 * several promises per budget: the two budgets cost the uncached users page
 * (issue 39's first row) 8% of its CPU per request (switched off, median of
 * eight interleaved rounds), and counted this way 2.6% less than through the
 * handler (0.974, median of eight).
 */
async function spend (store: LibraryStore, key: string, max: number, reply: FastifyReply, what: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    store.incr(key, (error, count) => {
      if (error !== null || count === undefined) {
        reject(error ?? new Error('the rate-limit store answered without a count'))
        return
      }
      const reset = String(Math.ceil(count.ttl / 1000))
      reply.header('RateLimit-Limit', String(max))
      reply.header('RateLimit-Remaining', String(Math.max(0, max - count.current)))
      reply.header('RateLimit-Reset', reset)
      if (count.current > max) {
        reject(new AppError('rate_limited', 429, `Too many requests ${what}: at most ${max} a minute. Retry after ${reset} s.`, {
          headers: { 'Retry-After': String(Math.max(1, Number(reset))) }
        }))
        return
      }
      resolve()
    }, WINDOW_MS, max)
  })
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
  // Both budgets count in one store; their keys say which (`addr:…`, `cred:…`). 5,000 keys in memory, as the library keeps.
  const store = options.redis !== undefined ? new RedisStore(false, false, options.redis, NAMESPACE) : new LocalStore(false, false, 5000)
  const exempt = (request: FastifyRequest): boolean => request.routeOptions.config.rateLimit === false

  if (rateLimitPerAddress > 0) {
    app.addHook('onRequest', async (request, reply) => {
      if (!exempt(request)) await spend(store, `addr:${request.ip}`, rateLimitPerAddress, reply, 'from this address')
    })
  }
  if (rateLimitPerCredential > 0) {
    // Called by the auth plugin once it knows who is calling.
    app.decorate('spendCredentialBudget', async (request: FastifyRequest, reply: FastifyReply) => {
      if (request.principal === null || exempt(request)) return
      await spend(store, `cred:${request.principal!.type}:${request.principal!.id}`, rateLimitPerCredential, reply, 'with this credential')
    })
  }
}, { name: 'gatehouse-rate-limit' })

declare module 'fastify' {
  interface FastifyInstance {
    spendCredentialBudget?: (request: FastifyRequest, reply: FastifyReply) => Promise<void>
  }
}
