import { sql, type Selectable } from 'kysely'
import { isPostgres, type ApiKeysTable, type Db } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { nowIso } from '../lib/ids.ts'

export type ApiKeyRow = Selectable<ApiKeysTable>

export interface NewApiKeyRow {
  id: string
  name: string
  prefix: string
  digest: string
  scopes: string
  user_id: string | null
  created_by_type: string
  created_by_id: string | null
  created_at: string
  expires_at: string | null
  last_used_at: null
  revoked_at: null
}

export async function insertApiKey (db: Db, row: NewApiKeyRow): Promise<ApiKeyRow> {
  return await db.insertInto('api_keys').values(row).returningAll().executeTakeFirstOrThrow()
}

/** How many keys of this owner (null: keys no user owns) are live at `now`: not revoked, not expired. */
export async function countLiveApiKeysOf (db: Db, userId: string | null, now: string): Promise<number> {
  const row = await db.selectFrom('api_keys').select(eb => eb.fn.countAll<number | string>().as('n'))
    .where('user_id', userId === null ? 'is' : '=', userId)
    .where('revoked_at', 'is', null)
    .where(eb => eb.or([eb('expires_at', 'is', null), eb('expires_at', '>', now)]))
    .executeTakeFirstOrThrow()
  return Number(row.n)
}

/**
 * Holds, until the transaction ends, the right to add a key for this owner
 * (null: no user), so that concurrent creates are counted one after another.
 * PostgreSQL only: SQLite runs one transaction at a time. The lock is the
 * database's, not the schema's: two deployments sharing a database at most
 * wait for each other's keyless creates, a few milliseconds.
 */
export async function lockApiKeysOf (db: Db, userId: string | null): Promise<void> {
  if (!isPostgres(db)) return
  await sql`select pg_advisory_xact_lock(hashtextextended(${`gatehouse.api_keys:${userId ?? ''}`}, 0))`.execute(db)
}

export async function findApiKeyById (db: Db, id: string): Promise<ApiKeyRow | undefined> {
  return await db.selectFrom('api_keys').selectAll().where('id', '=', id).executeTakeFirst()
}

/** The credential check on every request: one indexed lookup, with the owner's state joined in. */
export async function findApiKeyByDigest (db: Db, digest: string) {
  return await db.selectFrom('api_keys')
    .leftJoin('users', 'users.id', 'api_keys.user_id')
    .select([
      'api_keys.id', 'api_keys.scopes', 'api_keys.user_id', 'api_keys.expires_at', 'api_keys.revoked_at',
      'api_keys.last_used_at', 'users.role as owner_role', 'users.disabled as owner_disabled',
      'users.username as owner_username', 'users.groups as owner_groups'
    ])
    .where('api_keys.digest', '=', digest)
    .executeTakeFirst()
}

export async function listApiKeys (db: Db, options: { includeRevoked: boolean }): Promise<ApiKeyRow[]> {
  return await db.selectFrom('api_keys').selectAll()
    .$if(!options.includeRevoked, q => q.where('revoked_at', 'is', null))
    .orderBy('id', 'asc')
    .execute()
}

export async function revokeApiKey (db: Db, id: string, at: string): Promise<ApiKeyRow | undefined> {
  return await db.updateTable('api_keys').set({ revoked_at: at })
    .where('id', '=', id).where('revoked_at', 'is', null)
    .returningAll().executeTakeFirst()
}

/** Revokes every live key of a user; returns their ids for the event log. */
export async function revokeKeysOfUser (db: Db, userId: string, at: string): Promise<string[]> {
  const rows = await db.updateTable('api_keys').set({ revoked_at: at })
    .where('user_id', '=', userId).where('revoked_at', 'is', null)
    .returning('id').execute()
  return rows.map(r => r.id)
}

export async function replaceApiKeySecret (db: Db, id: string, secret: { prefix: string, digest: string }): Promise<ApiKeyRow | undefined> {
  return await db.updateTable('api_keys').set(secret)
    .where('id', '=', id).where('revoked_at', 'is', null)
    .returningAll().executeTakeFirst()
}

export async function touchApiKey (db: Db, id: string, at: string): Promise<void> {
  await db.updateTable('api_keys').set({ last_used_at: at }).where('id', '=', id).execute()
}

/** Revokes every live key of a user, with an `api_key.revoked` event each; in the transaction of what caused it. */
export async function revokeKeysRecorded (trx: Db, ctx: RequestContext, userId: string, reason: 'user_disabled' | 'user_deleted' | 'password_changed'): Promise<void> {
  for (const keyId of await revokeKeysOfUser(trx, userId, nowIso())) {
    await recordEvent(trx, ctx, 'api_key.revoked', { type: 'api_key', id: keyId }, { reason, user_id: userId })
  }
}
