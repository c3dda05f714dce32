import type { Redis, Result } from 'ioredis'

/** One sign-in budget: at most `limit` failures under `key` in a window. */
export interface Budget {
  key: string
  limit: number
}

export type Reservation =
  | { allowed: true }
  /**
   * The spent budget that keeps the caller out longest: its key, `resetMs`
   * until its window ends, and when the window started (epoch ms; the same
   * for every instance that sees this window, so it names the window).
   */
  | { allowed: false, limit: number, resetMs: number, key: string, windowStartedAt: number }

/**
 * Counts failed sign-ins per key in fixed windows that start at the first
 * failure. An attempt takes its unit *before* the password is verified
 * (`reserve`), atomically for all its budgets, and gives it back when it turns
 * out not to be a failure (`release`). Checking first and counting after the
 * verification would let every concurrent guess through the check before any
 * of them was counted.
 *
 * In memory for one instance; in Redis when several instances must share
 * what they have seen (REDIS_URL).
 */
export interface FailureCounter {
  /** Takes one unit from every budget, or from none when any of them is spent. */
  reserve: (budgets: Budget[], windowMs: number) => Promise<Reservation>
  /** Gives one unit back to each key (never below zero). */
  release: (keys: string[]) => Promise<void>
  reset: (key: string) => Promise<void>
  close: () => Promise<void>
}

/** Bounded, so a flood of distinct usernames cannot grow it without limit: the oldest window goes first. */
const MEMORY_MAX_KEYS = 100_000

export function memoryFailureCounter (): FailureCounter {
  const windows = new Map<string, { count: number, resetAt: number, startedAt: number }>()
  const read = (key: string, now: number): { count: number, resetAt: number, startedAt: number } | undefined => {
    const entry = windows.get(key)
    if (entry !== undefined && entry.resetAt <= now) {
      windows.delete(key)
      return undefined
    }
    return entry
  }
  return {
    // No await between the check and the count: one turn of the event loop is atomic.
    reserve: async (budgets, windowMs) => {
      const now = Date.now()
      let worst: { limit: number, resetMs: number, key: string, windowStartedAt: number } | undefined
      for (const { key, limit } of budgets) {
        const entry = read(key, now)
        if (entry !== undefined && entry.count >= limit && (worst === undefined || entry.resetAt - now > worst.resetMs)) {
          worst = { limit, resetMs: entry.resetAt - now, key, windowStartedAt: entry.startedAt }
        }
      }
      if (worst !== undefined) return { allowed: false, ...worst }
      for (const { key } of budgets) {
        let entry = read(key, now)
        if (entry === undefined) {
          if (windows.size >= MEMORY_MAX_KEYS) windows.delete(windows.keys().next().value!)
          entry = { count: 0, resetAt: now + windowMs, startedAt: now }
          windows.set(key, entry)
        }
        entry.count += 1
      }
      return { allowed: true }
    },
    release: async (keys) => {
      const now = Date.now()
      for (const key of keys) {
        const entry = read(key, now)
        if (entry !== undefined && entry.count > 0) entry.count -= 1
      }
    },
    reset: async (key) => { windows.delete(key) },
    close: async () => { windows.clear() }
  }
}

/**
 * Checks every budget and, only when none is spent, counts one failure in
 * each; the window starts with a key's first count, and its start (the
 * caller's clock, ARGV[2]) is kept beside it under `<key>:since`, so every
 * instance names a window alike. KEYS: the n counters, then their n `:since`
 * keys. One script, so Redis runs it as one step however many instances
 * reserve at once.
 */
const RESERVE = `
local n = #KEYS / 2
local worst_ttl = -1
local worst_limit = 0
local worst = 0
for i = 1, n do
  local limit = tonumber(ARGV[i + 2])
  if tonumber(redis.call('GET', KEYS[i]) or '0') >= limit then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl > worst_ttl then
      worst_ttl = ttl
      worst_limit = limit
      worst = i
    end
  end
end
if worst_ttl >= 0 then return {0, worst_limit, worst_ttl, worst, redis.call('GET', KEYS[n + worst]) or ''} end
for i = 1, n do
  if redis.call('INCR', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    redis.call('SET', KEYS[n + i], ARGV[2], 'PX', ARGV[1])
  end
end
return {1, 0, 0, 0, ''}
`

/** Never creates a key and never goes below zero, so a late release cannot grant credit in a later window. */
const RELEASE = `
for _, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count > 0 then redis.call('DECR', key) end
end
return 0
`

declare module 'ioredis' {
  interface RedisCommander<Context> {
    gatehouseReserveFailures: (...args: Array<string | number>) => Result<[number, number, number, number, string], Context>
    gatehouseReleaseFailures: (...args: Array<string | number>) => Result<number, Context>
  }
}

/** Keys live under `gatehouse:login:` in the shared Redis; the caller owns (and closes) the client. */
export function redisFailureCounter (redis: Redis): FailureCounter {
  const prefix = 'gatehouse:login:'
  if (typeof redis.gatehouseReserveFailures !== 'function') {
    redis.defineCommand('gatehouseReserveFailures', { lua: RESERVE })
    redis.defineCommand('gatehouseReleaseFailures', { lua: RELEASE })
  }
  return {
    reserve: async (budgets, windowMs) => {
      const now = Date.now()
      const [allowed, limit, resetMs, worst, since] = await redis.gatehouseReserveFailures(
        budgets.length * 2, ...budgets.map(b => prefix + b.key), ...budgets.map(b => `${prefix}${b.key}:since`),
        windowMs, now, ...budgets.map(b => b.limit))
      if (allowed === 1) return { allowed: true }
      const left = Math.max(0, resetMs)
      // A window counted before `:since` was kept: its start from its end, to the second, which every instance reads alike but for clock skew.
      const windowStartedAt = since !== '' ? Number(since) : Math.round((now + left - windowMs) / 1000) * 1000
      return { allowed: false, limit, resetMs: left, key: budgets[worst - 1]!.key, windowStartedAt }
    },
    release: async (keys) => {
      if (keys.length > 0) await redis.gatehouseReleaseFailures(keys.length, ...keys.map(k => prefix + k))
    },
    reset: async (key) => { await redis.del(prefix + key, `${prefix}${key}:since`) },
    close: async () => {}
  }
}
