import { toIso, toBool, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { Principal, RequestContext, Scope } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'
import {
  countLiveApiKeysOf,
  findApiKeyByDigest,
  findApiKeyById,
  insertApiKey,
  lockApiKeysOf,
  listApiKeys,
  replaceApiKeySecret,
  revokeApiKey,
  touchApiKey,
  type ApiKeyRow
} from './api-keys.repository.ts'
import type { ApiKey, ApiKeyCreate, ApiKeyWithSecret } from './api-keys.schemas.ts'

/** Marks our secrets so secret scanners and people can tell what leaked. */
export const KEY_PREFIX = 'gatehouse_'
/** How stale `last_used_at` may get: writing it on every request would make reads cost a write. */
const TOUCH_INTERVAL_MS = 60_000

export function generateApiKeySecret (): string {
  return randomSecret(KEY_PREFIX)
}

/** What may be shown of a secret: our marker plus six characters, or the first eight of a foreign key. */
export function visiblePrefixOf (secret: string): string {
  return secret.startsWith(KEY_PREFIX) ? secret.slice(0, KEY_PREFIX.length + 6) : secret.slice(0, 8)
}

export function toApiKey (row: ApiKeyRow): ApiKey {
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    scopes: toStringArray(row.scopes) as Scope[],
    user_id: row.user_id,
    created_at: toIso(row.created_at),
    expires_at: toIso(row.expires_at),
    last_used_at: toIso(row.last_used_at),
    revoked_at: toIso(row.revoked_at)
  }
}

function keyNotFound (id: string): AppError {
  return new AppError('api_key_not_found', 404, `No API key has the id ${id}.`)
}

/** Inserts a key for a known secret. The secret is hashed here and goes no further. */
export async function insertKeyForSecret (
  trx: Db,
  ctx: RequestContext,
  secret: string,
  fields: { name: string, scopes: Scope[], userId: string | null, expiresAt: string | null }
): Promise<ApiKey> {
  const row = await insertApiKey(trx, {
    id: newId(),
    name: fields.name,
    prefix: visiblePrefixOf(secret),
    digest: digestOf(secret),
    scopes: JSON.stringify(fields.scopes),
    user_id: fields.userId,
    created_by_type: ctx.actorType,
    created_by_id: ctx.actorId,
    created_at: nowIso(),
    expires_at: fields.expiresAt,
    last_used_at: null,
    revoked_at: null
  })
  const key = toApiKey(row)
  await recordEvent(trx, ctx, 'api_key.created', { type: 'api_key', id: key.id }, {
    name: key.name, prefix: key.prefix, scopes: key.scopes, user_id: key.user_id, expires_at: key.expires_at
  })
  return key
}

/**
 * A new key for the caller, owned by their user (or by no user, when the
 * caller is a key no user owns). One owner holds at most `limit` live keys:
 * a leaked admin credential cannot mint keys without end (ASVS 8.3.2), and a
 * script creating a key per run without revoking it is told so.
 */
export async function createApiKey (db: Db, principal: Principal, ctx: RequestContext, input: ApiKeyCreate, limit: number): Promise<ApiKeyWithSecret> {
  const expiresAt = input.expires_at != null ? new Date(input.expires_at).toISOString() : null
  if (expiresAt !== null && Date.parse(expiresAt) <= Date.now()) {
    throw new AppError('validation_failed', 422, 'expires_at must be in the future.', {
      errors: [{ in: 'body', pointer: '/expires_at', detail: 'is not in the future' }]
    })
  }
  if (input.scopes !== undefined && input.scopes.includes('scim') && input.scopes.length > 1) {
    throw new AppError('validation_failed', 422, 'A SCIM key has the scim scope only: it reaches /scim/v2 and nothing else.', {
      errors: [{ in: 'body', pointer: '/scopes', detail: 'scim cannot be combined with another scope' }]
    })
  }
  const secret = generateApiKeySecret()
  const key = await db.transaction().execute(async trx => {
    await lockApiKeysOf(trx, principal.userId)
    const live = await countLiveApiKeysOf(trx, principal.userId, nowIso())
    if (live >= limit) {
      throw new AppError('too_many_api_keys', 409, `${principal.userId === null ? 'Keys that no user owns' : 'You'} hold ${live} live API keys; at most ${limit} may be live at once (API_KEYS_PER_OWNER). Revoke one you no longer use.`)
    }
    return await insertKeyForSecret(trx, ctx, secret, {
      name: input.name,
      scopes: input.scopes ?? ['admin'],
      userId: principal.userId,
      expiresAt
    })
  })
  return { ...key, key: secret }
}

export async function listApiKeysOf (db: Db, includeRevoked: boolean): Promise<ApiKey[]> {
  return (await listApiKeys(db, { includeRevoked })).map(toApiKey)
}

export async function getApiKey (db: Db, id: string): Promise<ApiKey> {
  const row = await findApiKeyById(db, id)
  if (row === undefined) throw keyNotFound(id)
  return toApiKey(row)
}

/** Revoking twice is not an error: the key is revoked either way, and only the first time is an event. */
export async function revokeApiKeyById (db: Db, ctx: RequestContext, id: string): Promise<void> {
  await db.transaction().execute(async trx => {
    const row = await findApiKeyById(trx, id)
    if (row === undefined) throw keyNotFound(id)
    const revoked = await revokeApiKey(trx, id, nowIso())
    if (revoked !== undefined) {
      await recordEvent(trx, ctx, 'api_key.revoked', { type: 'api_key', id }, { name: row.name, prefix: row.prefix })
    }
  })
}

/** A new secret for the same key (same id, name, scopes, expiry); the old secret stops working at once. */
export async function rotateApiKey (db: Db, ctx: RequestContext, id: string): Promise<ApiKeyWithSecret> {
  const secret = generateApiKeySecret()
  const key = await db.transaction().execute(async trx => {
    const row = await findApiKeyById(trx, id)
    if (row === undefined) throw keyNotFound(id)
    const rotated = await replaceApiKeySecret(trx, id, { prefix: visiblePrefixOf(secret), digest: digestOf(secret) })
    if (rotated === undefined) throw new AppError('conflict', 409, 'A revoked key cannot be rotated; create a new one.')
    await recordEvent(trx, ctx, 'api_key.rotated', { type: 'api_key', id }, { old_prefix: row.prefix, new_prefix: rotated.prefix })
    return toApiKey(rotated)
  })
  return { ...key, key: secret }
}

/**
 * The principal a secret stands for, or undefined when it is unknown,
 * revoked, expired, or its owner is disabled. A key owned by a user acts with
 * that user's powers at most: if the owner is no longer an admin, the key keeps
 * none of its scopes (it cannot keep powers its user has lost).
 */
export async function authenticateApiKey (db: Db, secret: string): Promise<Principal | undefined> {
  const row = await findApiKeyByDigest(db, digestOf(secret))
  if (row === undefined || row.revoked_at !== null) return undefined
  const now = Date.now()
  if (row.expires_at !== null && new Date(row.expires_at).getTime() <= now) return undefined
  if (row.user_id !== null && (row.owner_disabled === null || toBool(row.owner_disabled))) return undefined
  const scopes = toStringArray(row.scopes) as Scope[]
  const effective = row.user_id !== null && row.owner_role !== 'admin' ? [] : scopes
  if (row.last_used_at === null || now - new Date(row.last_used_at).getTime() > TOUCH_INTERVAL_MS) {
    await touchApiKey(db, row.id, new Date(now).toISOString())
  }
  const user = row.user_id !== null
    ? { id: row.user_id, username: row.owner_username!, role: row.owner_role!, groups: toStringArray(row.owner_groups!) }
    : null
  return { type: 'api_key', id: row.id, userId: row.user_id, user, scopes: new Set(effective), ...(row.expires_at !== null ? { validUntil: new Date(row.expires_at).getTime() } : {}) }
}
