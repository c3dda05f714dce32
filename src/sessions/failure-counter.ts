import type { Redis } from 'ioredis'

export interface Count {
  count: number
  /** Milliseconds until the window, and so the count, expires. */
  resetMs: number
}

/**
 * Counts failed sign-ins per key in fixed windows that start at the first
 * failure. In memory for one instance; in Redis when several instances must
 * share what they have seen (REDIS_URL).
 */
export interface FailureCounter {
  get: (key: string) => Promise<Count>
  increment: (key: string, windowMs: number) => Promise<Count>
  reset: (key: string) => Promise<void>
  close: () => Promise<void>
}

/** Bounded, so a flood of distinct usernames cannot grow it without limit: the oldest window goes first. */
const MEMORY_MAX_KEYS = 100_000

export function memoryFailureCounter (): FailureCounter {
  const windows = new Map<string, { count: number, resetAt: number }>()
  const read = (key: string, now: number): { count: number, resetAt: number } | undefined => {
    const entry = windows.get(key)
    if (entry !== undefined && entry.resetAt <= now) {
      windows.delete(key)
      return undefined
    }
    return entry
  }
  return {
    get: async (key) => {
      const now = Date.now()
      const entry = read(key, now)
      return entry === undefined ? { count: 0, resetMs: 0 } : { count: entry.count, resetMs: entry.resetAt - now }
    },
    increment: async (key, windowMs) => {
      const now = Date.now()
      let entry = read(key, now)
      if (entry === undefined) {
        if (windows.size >= MEMORY_MAX_KEYS) windows.delete(windows.keys().next().value!)
        entry = { count: 0, resetAt: now + windowMs }
        windows.set(key, entry)
      }
      entry.count += 1
      return { count: entry.count, resetMs: entry.resetAt - now }
    },
    reset: async (key) => { windows.delete(key) },
    close: async () => { windows.clear() }
  }
}

/** Keys live under `gatehouse:login:` in the shared Redis; the caller owns (and closes) the client. */
export function redisFailureCounter (redis: Redis): FailureCounter {
  const prefix = 'gatehouse:login:'
  const asCount = (count: unknown, ttl: unknown): Count => ({ count: Number(count ?? 0), resetMs: Math.max(0, Number(ttl ?? 0)) })
  return {
    get: async (key) => {
      const replies = (await redis.multi().get(prefix + key).pttl(prefix + key).exec())! as Array<[unknown, unknown]>
      const count = replies[0]?.[1]
      return count === null || count === undefined ? { count: 0, resetMs: 0 } : asCount(count, replies[1]?.[1])
    },
    increment: async (key, windowMs) => {
      // The expiry is set only by the failure that opens the window (NX).
      const replies = (await redis.multi().incr(prefix + key).pexpire(prefix + key, windowMs, 'NX').pttl(prefix + key).exec())! as Array<[unknown, unknown]>
      return asCount(replies[0]?.[1], replies[2]?.[1])
    },
    reset: async (key) => { await redis.del(prefix + key) },
    close: async () => {}
  }
}
