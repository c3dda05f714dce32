import { AppError } from '../errors.ts'
import type { Budget } from './failure-counter.ts'
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
  const retryAfter = Math.max(1, Math.ceil(reservation.resetMs / 1000))
  throw new AppError('rate_limited', 429, 'Too many failed sign-ins; wait before trying again.', {
    headers: {
      'Retry-After': String(retryAfter),
      'RateLimit-Limit': String(reservation.limit),
      'RateLimit-Remaining': '0',
      'RateLimit-Reset': String(retryAfter)
    }
  })
}
