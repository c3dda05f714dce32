import type { Selectable } from 'kysely'
import type { Db, IdempotencyKeysTable } from '../db/database.ts'

/** Which key: whose, sent to which operation, and the key itself. */
export interface IdempotencyKeyId {
  scope: string
  method: string
  path: string
  key: string
}

export type IdempotencyKeyRow = Pick<Selectable<IdempotencyKeysTable>, 'fingerprint' | 'state' | 'locked_until' | 'status_code' | 'response_headers' | 'response_body'>

/** The stored answer of a finished request. */
export interface StoredAnswer {
  statusCode: number
  headers: Record<string, string>
  body: Buffer
}

/**
 * Records a first request as in progress; false when a row for the key exists
 * already. The primary key decides between requests that arrive together.
 */
export async function insertInProgress (db: Db, id: IdempotencyKeyId, fingerprint: string, lockToken: string, lockedUntil: string, at: string): Promise<boolean> {
  const row = await db.insertInto('idempotency_keys')
    .values({ ...id, fingerprint, state: 'in_progress', lock_token: lockToken, locked_until: lockedUntil, created_at: at })
    .onConflict(oc => oc.columns(['scope', 'method', 'path', 'key']).doNothing())
    .returning('key')
    .executeTakeFirst()
  return row !== undefined
}

export async function findIdempotencyKey (db: Db, id: IdempotencyKeyId): Promise<IdempotencyKeyRow | undefined> {
  return await db.selectFrom('idempotency_keys')
    .select(['fingerprint', 'state', 'locked_until', 'status_code', 'response_headers', 'response_body'])
    .where('scope', '=', id.scope).where('method', '=', id.method).where('path', '=', id.path).where('key', '=', id.key)
    .executeTakeFirst()
}

/**
 * Takes over an in-progress key whose holder's lease ran out before `now`
 * (its instance stopped mid-request); false when another request holds it.
 */
export async function takeOverExpired (db: Db, id: IdempotencyKeyId, lockToken: string, lockedUntil: string, now: string): Promise<boolean> {
  const row = await db.updateTable('idempotency_keys')
    .set({ lock_token: lockToken, locked_until: lockedUntil })
    .where('scope', '=', id.scope).where('method', '=', id.method).where('path', '=', id.path).where('key', '=', id.key)
    .where('state', '=', 'in_progress').where('locked_until', '<', now)
    .returning('key')
    .executeTakeFirst()
  return row !== undefined
}

/** Stores the answer of the request that holds the key; false when it no longer holds it. */
export async function storeAnswer (db: Db, id: IdempotencyKeyId, lockToken: string, answer: StoredAnswer): Promise<boolean> {
  const row = await db.updateTable('idempotency_keys')
    .set({
      state: 'done',
      lock_token: null,
      locked_until: null,
      status_code: answer.statusCode,
      response_headers: JSON.stringify(answer.headers),
      response_body: answer.body
    })
    .where('scope', '=', id.scope).where('method', '=', id.method).where('path', '=', id.path).where('key', '=', id.key)
    .where('lock_token', '=', lockToken)
    .returning('key')
    .executeTakeFirst()
  return row !== undefined
}

/** Frees a key whose request was not answered for good (5xx, 429): the client may retry with it. */
export async function deleteInProgress (db: Db, id: IdempotencyKeyId, lockToken: string): Promise<void> {
  await db.deleteFrom('idempotency_keys')
    .where('scope', '=', id.scope).where('method', '=', id.method).where('path', '=', id.path).where('key', '=', id.key)
    .where('lock_token', '=', lockToken)
    .execute()
}

export async function deleteIdempotencyKeysBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('idempotency_keys').where('created_at', '<', before).executeTakeFirst()
  return Number(result.numDeletedRows)
}
