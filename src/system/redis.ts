import { once } from 'node:events'
import type { Redis } from 'ioredis'
import type { Config } from '../config.ts'
import type { FastifyTypeBox } from '../lib/http.ts'

/**
 * The Redis connection REDIS_URL names, or undefined without one. Imported
 * only when configured: ioredis is a tenth of start-up's module loading.
 */
export async function connectRedis (app: FastifyTypeBox, config: Pick<Config, 'redisUrl' | 'redisCommandTimeoutMs'>): Promise<Redis | undefined> {
  if (config.redisUrl === undefined) return undefined
  const redis = new (await import('ioredis')).Redis(config.redisUrl, {
    // Every command has a deadline, also while it waits for a (re)connection
    // in the offline queue; past it the request gets 503 (errors.ts).
    commandTimeout: config.redisCommandTimeoutMs,
    // A connection that owes answers and receives nothing for this long is
    // dead though never closed (a network dropping packets): drop it and
    // reconnect, rather than send every later command into the void.
    socketTimeout: config.redisCommandTimeoutMs,
    connectTimeout: config.redisCommandTimeoutMs,
    maxRetriesPerRequest: 2
  })
  // Connection errors surface on the commands that need the connection; the event must still be handled.
  redis.on('error', () => {})
  // The first requests after start would otherwise race the connection's
  // handshake against their command deadline. A Redis that does not come up
  // in time does not stop the start: requests that need it get 503 and
  // /readyz says so until it answers.
  app.addHook('onReady', async () => {
    if (redis.status === 'ready') return
    let timer: NodeJS.Timeout | undefined
    await Promise.race([
      once(redis, 'ready').catch(() => {}),
      new Promise(resolve => { timer = setTimeout(resolve, config.redisCommandTimeoutMs) })
    ]).finally(() => clearTimeout(timer))
  })
  // Registered before what uses it, so closed after it (onClose runs last-registered first).
  // QUIT waits for an answer, which a stalled Redis never gives.
  app.addHook('onClose', async () => { await redis.quit().catch(() => { redis.disconnect() }) })
  return redis
}
