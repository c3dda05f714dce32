import { sql } from 'kysely'
import type { Db } from './schema.ts'

/** PostgreSQL's deadlock_detected and serialization_failure: the transaction was chosen to be rolled back, and may simply be run again. */
export type RetryReason = 'deadlock' | 'serialization_failure'
const RETRYABLE = new Map<string, RetryReason>([['40P01', 'deadlock'], ['40001', 'serialization_failure']])

/** Per database: transactionRetried's transactions PostgreSQL rolled back, by why (for /metrics; a deadlock counted here is a lock order to fix). */
const retriesOf = new WeakMap<Db, Record<RetryReason, number>>()

export function transactionRetryCounts (db: Db): Record<RetryReason, number> {
  return { ...(retriesOf.get(db) ?? { deadlock: 0, serialization_failure: 0 }) }
}

/**
 * Runs `work` in a transaction, and runs it again (at most `attempts` times in
 * all) when PostgreSQL rolled it back to break a deadlock. Changes of users
 * and groups lock them in one order (users first, each kind in id order), so
 * a deadlock should not happen; should one still (a lock order missed), it is
 * retried here rather than answered with 409 `conflict`, and counted.
 * `work` must do nothing outside the transaction that cannot be done twice.
 */
export async function transactionRetried<T> (db: Db, work: (trx: Db) => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await db.transaction().execute(work)
    } catch (error) {
      const code = (error as { code?: unknown } | null)?.code
      const reason = typeof code === 'string' ? RETRYABLE.get(code) : undefined
      if (reason === undefined) throw error
      const counts = retriesOf.get(db) ?? { deadlock: 0, serialization_failure: 0 }
      retriesOf.set(db, counts)
      counts[reason]++
      if (attempt >= attempts) throw error
    }
  }
}

/**
 * Runs `attempt` inside a savepoint of the open transaction `trx`. When it
 * returns undefined, all it did is rolled back to the savepoint, and with it
 * (on PostgreSQL) the row locks it took; otherwise the savepoint is released
 * and its result returned. A throw leaves the savepoint to the transaction,
 * which rolls back as a whole.
 */
export async function keptOrRolledBack<T> (trx: Db, attempt: () => Promise<T | undefined>): Promise<T | undefined> {
  await sql`savepoint gatehouse_attempt`.execute(trx)
  const result = await attempt()
  await (result === undefined ? sql`rollback to savepoint gatehouse_attempt` : sql`release savepoint gatehouse_attempt`).execute(trx)
  return result
}
