import type { UserPage } from './users.repository.ts'

/** An instance's page cache: 4 MiB at most (a page of 50 is some 35 KiB by sizeOf). */
export const USERS_PAGE_CACHE_BYTES = 4 * 1024 * 1024

interface Entry { stamp: string, page: UserPage, size: number }

/**
 * List pages as read, served again only while the database says nothing
 * could have changed them. One per instance (app.ts `usersPages`).
 *
 * Every lookup carries the stamp read from the database for this request
 * (users.repository.ts `readChangeStamp`), which moves with any committed
 * write that may change a page, by anyone: an entry from another stamp is
 * never served, so a cached page is never staler than reading it again would
 * be. The stamp must be read before the page it labels: a write landing in
 * between makes the page newer than its stamp, which only costs a miss later,
 * whereas the other order could label an old page with a new stamp.
 *
 * Bounded by an estimate of the bytes held (sizeOf), least recently used out first.
 *
 * Reading the stamp is a round trip of its own on PostgreSQL, wasted whenever
 * the lookup misses. When the database is written all the time (or requests
 * never ask for the same page twice) every lookup misses, so after
 * `missStreak` misses in a row the cache rests for `restMs`: `resting()` says
 * to read pages directly, without a stamp, until then.
 */
export class PageCache {
  readonly #entries = new Map<string, Entry>()
  readonly #maxBytes: number
  readonly #missStreak: number
  readonly #restMs: number
  #bytes = 0
  #misses = 0
  #restUntil = 0
  /** Lookups so far, for the metrics: served from here, missed, or answered without a lookup while resting. */
  readonly counts = { hit: 0, miss: 0, resting: 0 }

  constructor (maxBytes: number, { missStreak = 8, restMs = 1000 }: { missStreak?: number, restMs?: number } = {}) {
    this.#maxBytes = maxBytes
    this.#missStreak = missStreak
    this.#restMs = restMs
  }

  /** Whether to read the page directly; a true answer counts as a lookup (`counts.resting`). */
  resting (now = Date.now()): boolean {
    if (now >= this.#restUntil) return false
    this.counts.resting++
    return true
  }

  get (key: string, stamp: string, now = Date.now()): UserPage | undefined {
    const entry = this.#entries.get(key)
    if (entry === undefined || entry.stamp !== stamp) {
      this.counts.miss++
      if (entry !== undefined) this.#remove(key, entry)
      if (++this.#misses >= this.#missStreak) {
        this.#misses = 0
        this.#restUntil = now + this.#restMs
      }
      return undefined
    }
    this.#misses = 0
    this.counts.hit++
    // Re-inserted: a Map iterates in insertion order, so the first key is the least recently used.
    this.#entries.delete(key)
    this.#entries.set(key, entry)
    return entry.page
  }

  set (key: string, stamp: string, page: UserPage): void {
    const size = sizeOf(key, page)
    if (size > this.#maxBytes / 8) return
    const old = this.#entries.get(key)
    if (old !== undefined) this.#remove(key, old)
    this.#entries.set(key, { stamp, page, size })
    this.#bytes += size
    for (const [oldestKey, oldest] of this.#entries) {
      if (this.#bytes <= this.#maxBytes) break
      this.#remove(oldestKey, oldest)
    }
  }

  get size (): number {
    return this.#entries.size
  }

  #remove (key: string, entry: Entry): void {
    this.#entries.delete(key)
    this.#bytes -= entry.size
  }
}

/**
 * An upper bound of what an entry keeps alive: two bytes a character of its
 * strings (JavaScript's widest), and 16 bytes for each other value and each
 * property, array element or object.
 */
function sizeOf (key: string, page: UserPage): number {
  return 2 * key.length + 2 * (page.next?.join('').length ?? 0) + valueSize(page.users)
}

function valueSize (value: unknown): number {
  if (typeof value === 'string') return 16 + 2 * value.length
  if (Array.isArray(value)) return value.reduce<number>((sum, item) => sum + valueSize(item), 16)
  if (value !== null && typeof value === 'object') return Object.values(value).reduce<number>((sum, item) => sum + 16 + valueSize(item), 16)
  return 16
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The users list's page cache of this instance. */
    usersPages: PageCache
  }
}
