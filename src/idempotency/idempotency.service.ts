import { randomUUID } from 'node:crypto'
import type { Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import {
  deleteIdempotencyKeysBefore,
  deleteInProgress,
  findIdempotencyKey,
  insertInProgress,
  storeAnswer,
  takeOverExpired,
  type IdempotencyKeyId,
  type StoredAnswer
} from './idempotency.repository.ts'

export type { IdempotencyKeyId, StoredAnswer } from './idempotency.repository.ts'

/** How long a key is kept after its first request (docs/api.md, "Retry-safe writes"). */
export const IDEMPOTENCY_KEY_TTL_MS = 24 * 3_600_000

/**
 * How long a request holds its key while it runs. Every statement it makes is
 * bounded by seconds (DATABASE_STATEMENT_TIMEOUT_MS and the acquire timeout);
 * a key held longer belongs to an instance that stopped mid-request, and a
 * retry may then take it over rather than wait a day for the purge.
 */
export const IN_PROGRESS_LEASE_MS = 60_000

/** What the 409 asks a client to wait before retrying a key that is in progress. */
const IN_PROGRESS_RETRY_AFTER_S = 1

/** How often a claim starts again when the row it found vanished meanwhile (freed after a 5xx, or purged). */
const CLAIM_ATTEMPTS = 3

/** The request holds its key and runs; its answer is stored with `finishIdempotentRequest`. */
export interface HeldKey { id: IdempotencyKeyId, lockToken: string }

export type Claim = { held: HeldKey } | { replay: StoredAnswer }

/**
 * Claims a key for a request, or finds the first answer given with it. A key
 * sent with another request than the first (by fingerprint) is refused with
 * 422 `idempotency_key_reused`; one whose first request still runs, with 409
 * `idempotency_key_in_progress`.
 */
export async function claimIdempotencyKey (db: Db, id: IdempotencyKeyId, fingerprint: string, now = Date.now()): Promise<Claim> {
  const lockToken = randomUUID()
  const lockedUntil = new Date(now + IN_PROGRESS_LEASE_MS).toISOString()
  for (let attempt = 0; attempt < CLAIM_ATTEMPTS; attempt += 1) {
    if (await insertInProgress(db, id, fingerprint, lockToken, lockedUntil, new Date(now).toISOString())) return { held: { id, lockToken } }
    const row = await findIdempotencyKey(db, id)
    if (row === undefined) continue
    if (row.fingerprint !== fingerprint) {
      throw new AppError('idempotency_key_reused', 422,
        'This Idempotency-Key was sent earlier with another request (a different body) to this operation. Use a new key for a new request.')
    }
    if (row.state === 'done') {
      return { replay: { statusCode: row.status_code!, headers: JSON.parse(row.response_headers ?? '{}') as Record<string, string>, body: Buffer.from(row.response_body ?? []) } }
    }
    const lockExpired = row.locked_until !== null && Date.parse(String(row.locked_until)) < now
    if (lockExpired && await takeOverExpired(db, id, lockToken, lockedUntil, new Date(now).toISOString())) return { held: { id, lockToken } }
    break
  }
  throw new AppError('idempotency_key_in_progress', 409,
    'A request with this Idempotency-Key is still being processed. Retry after the time in Retry-After to get its answer.',
    { headers: { 'Retry-After': String(IN_PROGRESS_RETRY_AFTER_S) } })
}

/**
 * Whether an answer is final and is given again to a retry: every 2xx, 3xx
 * and 4xx but 408 and 429, which ask the client to try again later, as every
 * 5xx does (the key is then freed).
 */
export function isFinalAnswer (statusCode: number): boolean {
  return statusCode < 500 && statusCode !== 408 && statusCode !== 429
}

/**
 * Stores the answer of a request that held its key, or frees the key when
 * there is no final answer to keep (`answer` undefined).
 */
export async function finishIdempotentRequest (db: Db, held: HeldKey, answer: StoredAnswer | undefined): Promise<void> {
  if (answer === undefined || !isFinalAnswer(answer.statusCode)) {
    await deleteInProgress(db, held.id, held.lockToken)
    return
  }
  await storeAnswer(db, held.id, held.lockToken, answer)
}

/** Housekeeping, hourly: keys are kept for IDEMPOTENCY_KEY_TTL_MS after their first request. */
export async function purgeIdempotencyKeys (db: Db, now = Date.now()): Promise<number> {
  return await deleteIdempotencyKeysBefore(db, new Date(now - IDEMPOTENCY_KEY_TTL_MS).toISOString())
}
