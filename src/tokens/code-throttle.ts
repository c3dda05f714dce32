import { AppError } from '../errors.ts'
import type { FailureCounter } from '../sessions/failure-counter.ts'
import type { Config } from '../config.ts'

/*
 * Typed codes are throttled twice: each token ends after CODE_MAX_FAILURES
 * wrong codes (tokens.repository.ts), and each client address has the sign-in
 * budget of wrong codes across accounts (LOGIN_MAX_FAILURES_PER_ADDRESS per
 * LOGIN_FAILURE_WINDOW_S), shared through Redis when configured, so one
 * address cannot spread guesses over many accounts' codes.
 */

export type CodeThrottleDeps = { failures: FailureCounter, config: Pick<Config, 'loginMaxFailuresPerAddress' | 'loginFailureWindowMs'> }

const keyOf = (ip: string | null): string => `code:${ip ?? 'unknown'}`

/** Takes a unit before a code is checked, or answers 429. */
export async function reserveCodeAttempt (deps: CodeThrottleDeps, ip: string | null): Promise<void> {
  const reservation = await deps.failures.reserve([{ key: keyOf(ip), limit: deps.config.loginMaxFailuresPerAddress }], deps.config.loginFailureWindowMs)
  if (reservation.allowed) return
  const retryAfter = String(Math.max(1, Math.ceil(reservation.resetMs / 1000)))
  throw new AppError('rate_limited', 429, 'Too many wrong codes from this address; wait before trying again.', {
    headers: { 'Retry-After': retryAfter, 'RateLimit-Limit': String(reservation.limit), 'RateLimit-Remaining': '0', 'RateLimit-Reset': retryAfter }
  })
}

/** A right code is not a guess: its unit goes back. */
export async function releaseCodeAttempt (deps: CodeThrottleDeps, ip: string | null): Promise<void> {
  await deps.failures.release([keyOf(ip)])
}

export function tokenInvalid (): AppError {
  return new AppError('token_invalid', 400, 'This link or code does not work: it was used, replaced by a newer one, revoked, or has expired (or the code or name is wrong). Ask for a new one.')
}
