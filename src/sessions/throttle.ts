import type { RequestContext } from '../auth/principal.ts'
import { AppError } from '../errors.ts'
import { recordEvent } from '../events/events.repository.ts'
import { nowIso } from '../lib/ids.ts'
import type { Budget } from './failure-counter.ts'
import { claimThrottleWindow } from './sessions.repository.ts'
import type { SessionsDeps } from './sessions.types.ts'

/**
 * The identifier as names are compared: a directory ignores case, surrounding
 * spaces and runs of inner spaces (LDAP's caseIgnoreMatch), so " Bob " signs
 * in as bob there. Looking the user up and keying the failure budget by this
 * form gives every spelling of one name the same budget. No local username or
 * email has spaces, so locally it only forgives stray ones.
 */
export function signInKey (identifier: string): string {
  return identifier.trim().replace(/\s+/g, ' ').toLowerCase()
}

/**
 * Throttling budgets: one account from one address, and one address across
 * accounts. The account is the user the identifier names, so a username and
 * an email of the same person share one budget; an identifier that names
 * nobody is counted as typed.
 */
export function throttleBudgets (deps: Pick<SessionsDeps, 'config'>, account: string, ip: string): Budget[] {
  return [
    { key: `acct:${account}:${ip}`, limit: deps.config.loginMaxFailuresPerAccount },
    { key: `addr:${ip}`, limit: deps.config.loginMaxFailuresPerAddress }
  ]
}

/**
 * Takes this attempt's unit from its budgets before any password work, or
 * answers 429 when one of them is spent. Atomic, so a burst of concurrent
 * guesses gets exactly as many verifications as the budget allows.
 */
export async function reserveAttempt (deps: Pick<SessionsDeps, 'failures' | 'config'>, budgets: Budget[]): Promise<void> {
  const reservation = await deps.failures.reserve(budgets, deps.config.loginFailureWindowMs)
  if (reservation.allowed) return
  throw throttled(reservation)
}

function throttled (reservation: { limit: number, resetMs: number }): AppError {
  const retryAfter = Math.max(1, Math.ceil(reservation.resetMs / 1000))
  return new AppError('rate_limited', 429, 'Too many failed sign-ins; wait before trying again.', {
    headers: {
      'Retry-After': String(retryAfter),
      'RateLimit-Limit': String(reservation.limit),
      'RateLimit-Remaining': '0',
      'RateLimit-Reset': String(retryAfter)
    }
  })
}

/** A throttled sign-in, as its `user.login_throttled` event tells it. */
export interface ThrottledSignIn {
  ctx: RequestContext
  /** The budget's account: `user:<id>`, or `name:<identifier>` when it names nobody. */
  account: string
  target: { type: 'user', id: string } | null
  identifier: string
}

/** Windows this instance has already recorded, so repeats within one cost no write; the database's key decides between instances. */
const recordedWindows = new Map<string, number>()
const RECORDED_MAX = 10_000

/**
 * As reserveAttempt, for a password sign-in; a refusal also records
 * `user.login_throttled`, once per account and throttle window (PRODUCT.md
 * §17): the audit trail shows the brute force without a row per guess. The
 * window is the spent budget's, named by its start, which the failure
 * counter keeps (in Redis, for every instance), and the first refusal's
 * insert of `<account>|<budget>|<start>` is the one that records.
 */
export async function reserveSignInAttempt (deps: Pick<SessionsDeps, 'failures' | 'config' | 'db'>, budgets: Budget[], attempt: ThrottledSignIn): Promise<void> {
  const reservation = await deps.failures.reserve(budgets, deps.config.loginFailureWindowMs)
  if (reservation.allowed) return
  const windowKey = `${attempt.account}|${reservation.key}|${reservation.windowStartedAt}`
  if (!recordedWindows.has(windowKey)) {
    const endsAt = new Date(reservation.windowStartedAt + deps.config.loginFailureWindowMs).toISOString()
    await deps.db.transaction().execute(async trx => {
      if (!await claimThrottleWindow(trx, windowKey, endsAt, nowIso())) return
      await recordEvent(trx, attempt.ctx, 'user.login_throttled', attempt.target, {
        identifier: attempt.identifier.slice(0, 254),
        throttled_by: reservation.key.startsWith('addr:') ? 'address' : 'account',
        window_ends_at: endsAt
      })
    })
    if (recordedWindows.size >= RECORDED_MAX) recordedWindows.clear()
    recordedWindows.set(windowKey, Date.parse(endsAt))
  }
  throw throttled(reservation)
}
