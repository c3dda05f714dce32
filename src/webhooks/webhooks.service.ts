import { randomBytes } from 'node:crypto'
import type { Config } from '../config.ts'
import { toBool, toIso, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { SYSTEM_CONTEXT, type RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { EVENT_TYPES } from '../events/events.schemas.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { decodeCursor, encodeCursor } from '../lib/paging.ts'
import {
  deleteEndpoint,
  deleteWebhookHistoryBefore,
  disableEndpoint,
  findDelivery,
  findEndpoint,
  insertEndpoint,
  listAttempts,
  listDeliveries,
  listEndpoints,
  requeueDelivery,
  requeueRange,
  updateEndpoint,
  type DeliveryListRow,
  type EndpointChanges,
  type WebhookAttemptRow,
  type WebhookEndpointRow
} from './webhooks.repository.ts'
import { MAX_WEBHOOKS } from './webhooks.schemas.ts'
import type {
  ListAttemptsQuery,
  ListDeliveriesQuery,
  Webhook,
  WebhookAttempt,
  WebhookCreate,
  WebhookDelivery,
  WebhookPatch,
  WebhookReplay,
  WebhookTestResult,
  WebhookWithSecret
} from './webhooks.schemas.ts'
import { signatureHeader, type Sender } from './webhooks.sender.ts'
import { checkDestination } from '../lib/ssrf-guard.ts'

export type WebhookSettings = Pick<Config, 'webhookAllowPrivate' | 'webhookRetryHorizonMs' | 'webhookSecretOverlapMs'>

/** Standard Webhooks secrets: `whsec_` and base64 of 24 to 64 random bytes; 32 here, as for HMAC-SHA256's block. */
export function generateWebhookSecret (): string {
  return `whsec_${randomBytes(32).toString('base64')}`
}

/** The filter as LIKE patterns: `*` any run of characters, `_` (in event types) literal. */
export function likePatternsOf (eventTypes: string[]): string[] {
  return eventTypes.map(t => t.replaceAll('_', '\\_').replaceAll('*', '%'))
}

export function toWebhook (row: WebhookEndpointRow): Webhook {
  return {
    id: row.id,
    url: row.url,
    description: row.description,
    event_types: toStringArray(row.event_types),
    enabled: toBool(row.enabled),
    disabled_reason: row.disabled_reason as Webhook['disabled_reason'],
    failing_since: toIso(row.failing_since),
    previous_secret_expires_at: row.previous_secret !== null ? toIso(row.previous_secret_expires_at) : null,
    created_at: toIso(row.created_at),
    updated_at: toIso(row.updated_at)
  }
}

function toDelivery (row: DeliveryListRow): WebhookDelivery {
  return {
    event_id: row.event_id,
    event_type: row.event_type,
    status: row.status,
    attempts: row.attempts,
    next_attempt_at: row.status === 'pending' ? toIso(row.next_attempt_at) : null,
    last_attempt_at: toIso(row.last_attempt_at),
    last_status_code: row.last_status_code,
    last_error: row.last_error,
    created_at: toIso(row.created_at),
    delivered_at: toIso(row.delivered_at)
  }
}

function toAttempt (row: WebhookAttemptRow & { event_type: string | null }): WebhookAttempt {
  return {
    id: row.id,
    event_id: row.event_id,
    event_type: row.event_type,
    attempted_at: toIso(row.attempted_at),
    succeeded: toBool(row.succeeded),
    status_code: row.status_code,
    latency_ms: row.latency_ms,
    error: row.error,
    next_attempt_at: toIso(row.next_attempt_at)
  }
}

function webhookNotFound (id: string): AppError {
  return new AppError('webhook_not_found', 404, `No webhook endpoint has the id ${id}.`)
}

/** Secrets that sign a delivery made at `now`: the current one, and the one before it during the overlap. */
export function signingSecrets (row: WebhookEndpointRow, now: number): string[] {
  const expires = row.previous_secret_expires_at
  return row.previous_secret !== null && expires !== null && new Date(expires).getTime() > now
    ? [row.secret, row.previous_secret]
    : [row.secret]
}

/** Refuses a URL that is not http(s), carries credentials, or leads to an internal address (SSRF). */
async function checkUrl (url: string, settings: WebhookSettings): Promise<void> {
  const refuse = (detail: string): AppError => new AppError('webhook_url_refused', 422, detail, {
    errors: [{ in: 'body', pointer: '/url', detail }]
  })
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    throw refuse('is not a URL')
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw refuse('must be an http or https URL')
  if (parsed.username !== '' || parsed.password !== '') throw refuse('must not carry a user name or password; authenticate receivers by the signature')
  try {
    await checkDestination(parsed, settings.webhookAllowPrivate)
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'EADDRREFUSED') throw refuse(`leads to an internal address (${(error as Error).message}); set WEBHOOK_ALLOW_PRIVATE to allow it`)
    throw refuse(`its host name does not resolve (${code ?? 'lookup failed'})`)
  }
}

/** Exact types must exist; a typo would otherwise silently match nothing. */
function checkEventTypes (types: string[]): void {
  const known = new Set<string>(EVENT_TYPES)
  const unknown = types.filter(t => !t.includes('*') && !known.has(t))
  if (unknown.length > 0) {
    throw new AppError('validation_failed', 422, `Unknown event type: ${unknown.join(', ')}. See docs/api.md#events.`, {
      errors: unknown.map(t => ({ in: 'body', pointer: `/event_types/${types.indexOf(t)}`, detail: 'is not an event type' }))
    })
  }
}

export async function createWebhook (db: Db, ctx: RequestContext, settings: WebhookSettings, input: WebhookCreate): Promise<WebhookWithSecret> {
  await checkUrl(input.url, settings)
  const eventTypes = input.event_types ?? ['*']
  checkEventTypes(eventTypes)
  const secret = generateWebhookSecret()
  const now = nowIso()
  const enabled = input.enabled ?? true
  const webhook = await db.transaction().execute(async trx => {
    if ((await listEndpoints(trx)).length >= MAX_WEBHOOKS) {
      throw new AppError('conflict', 409, `A deployment has at most ${MAX_WEBHOOKS} webhook endpoints; delete one first.`)
    }
    const row = await insertEndpoint(trx, {
      id: newId(),
      url: input.url,
      description: input.description ?? null,
      event_types: JSON.stringify(eventTypes),
      event_patterns: JSON.stringify(likePatternsOf(eventTypes)),
      enabled,
      disabled_reason: enabled ? null : 'manual',
      secret,
      previous_secret: null,
      previous_secret_expires_at: null,
      failing_since: null,
      created_at: now,
      updated_at: now
    })
    const webhook = toWebhook(row)
    await recordEvent(trx, ctx, 'webhook.created', { type: 'webhook', id: webhook.id }, {
      url: webhook.url, description: webhook.description, event_types: webhook.event_types, enabled: webhook.enabled
    })
    return webhook
  })
  return { ...webhook, secret }
}

export async function listWebhooks (db: Db): Promise<Webhook[]> {
  return (await listEndpoints(db)).map(toWebhook)
}

async function endpointOrThrow (db: Db, id: string): Promise<WebhookEndpointRow> {
  const row = await findEndpoint(db, id)
  if (row === undefined) throw webhookNotFound(id)
  return row
}

export async function getWebhook (db: Db, id: string): Promise<Webhook> {
  return toWebhook(await endpointOrThrow(db, id))
}

export async function updateWebhook (db: Db, ctx: RequestContext, settings: WebhookSettings, id: string, patch: WebhookPatch): Promise<Webhook> {
  if (patch.url !== undefined) await checkUrl(patch.url, settings)
  if (patch.event_types !== undefined) checkEventTypes(patch.event_types)
  return await db.transaction().execute(async trx => {
    const current = toWebhook(await endpointOrThrow(trx, id))
    const now = nowIso()
    const changes: EndpointChanges = { updated_at: now }
    const recorded: Record<string, { from: unknown, to: unknown }> = {}
    const note = (field: string, from: unknown, to: unknown): void => {
      if (JSON.stringify(from) !== JSON.stringify(to)) recorded[field] = { from, to }
    }
    if (patch.url !== undefined) { changes.url = patch.url; note('url', current.url, patch.url) }
    if (patch.description !== undefined) { changes.description = patch.description; note('description', current.description, patch.description) }
    if (patch.event_types !== undefined) {
      changes.event_types = JSON.stringify(patch.event_types)
      changes.event_patterns = JSON.stringify(likePatternsOf(patch.event_types))
      note('event_types', current.event_types, patch.event_types)
    }
    if (patch.enabled !== undefined && patch.enabled !== current.enabled) {
      changes.enabled = patch.enabled
      changes.disabled_reason = patch.enabled ? null : 'manual'
      // A re-enabled endpoint starts with a clean record; its failures before are in the attempts.
      if (patch.enabled) changes.failing_since = null
      note('enabled', current.enabled, patch.enabled)
    }
    const row = await updateEndpoint(trx, id, changes)
    if (row === undefined) throw webhookNotFound(id)
    if (Object.keys(recorded).length > 0) await recordEvent(trx, ctx, 'webhook.updated', { type: 'webhook', id }, { changes: recorded })
    return toWebhook(row)
  })
}

export async function deleteWebhook (db: Db, ctx: RequestContext, id: string): Promise<void> {
  await db.transaction().execute(async trx => {
    const row = await deleteEndpoint(trx, id)
    if (row === undefined) throw webhookNotFound(id)
    await recordEvent(trx, ctx, 'webhook.deleted', { type: 'webhook', id }, { url: row.url })
  })
}

/**
 * A new signing secret. The old one keeps signing too (a second signature in
 * `webhook-signature`) for the overlap, so receivers can switch without
 * losing a delivery; a rotation during an overlap ends the older one at once.
 */
export async function rotateWebhookSecret (db: Db, ctx: RequestContext, settings: WebhookSettings, id: string): Promise<WebhookWithSecret> {
  const secret = generateWebhookSecret()
  const webhook = await db.transaction().execute(async trx => {
    const current = await endpointOrThrow(trx, id)
    const now = Date.now()
    const previousUntil = new Date(now + settings.webhookSecretOverlapMs).toISOString()
    const row = await updateEndpoint(trx, id, {
      secret,
      previous_secret: settings.webhookSecretOverlapMs > 0 ? current.secret : null,
      previous_secret_expires_at: settings.webhookSecretOverlapMs > 0 ? previousUntil : null,
      updated_at: new Date(now).toISOString()
    })
    if (row === undefined) throw webhookNotFound(id)
    await recordEvent(trx, ctx, 'webhook.secret_rotated', { type: 'webhook', id }, {
      secret: '[redacted]', previous_secret_valid_until: toIso(row.previous_secret_expires_at)
    })
    return toWebhook(row)
  })
  return { ...webhook, secret }
}

/**
 * Disables an endpoint on the worker's behalf (410 Gone, or failing too long),
 * with a `webhook.disabled` event by the system. Its queued deliveries stay
 * queued and resume if it is enabled again.
 */
export async function disableWebhookRecorded (trx: Db, id: string, reason: 'gone' | 'failing', details: Record<string, unknown>): Promise<boolean> {
  const row = await disableEndpoint(trx, id, reason, nowIso())
  if (row === undefined) return false
  await recordEvent(trx, SYSTEM_CONTEXT, 'webhook.disabled', { type: 'webhook', id }, { reason, url: row.url, ...details })
  return true
}

function pageCursor (sort: string, cursor: string | undefined): string | undefined {
  return cursor !== undefined ? decodeCursor(cursor, sort, ['uuid'])[0] : undefined
}

export async function listWebhookDeliveries (db: Db, id: string, query: ListDeliveriesQuery): Promise<{ deliveries: WebhookDelivery[], nextCursor: string | undefined }> {
  await endpointOrThrow(db, id)
  const limit = query.limit ?? 100
  const before = pageCursor('webhook_deliveries', query.cursor)
  const rows = await listDeliveries(db, id, { ...(query.status !== undefined ? { status: query.status } : {}), limit, ...(before !== undefined ? { beforeEventId: before } : {}) })
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return { deliveries: page.map(toDelivery), nextCursor: rows.length > limit && last !== undefined ? encodeCursor('webhook_deliveries', [last.event_id]) : undefined }
}

export async function listWebhookAttempts (db: Db, id: string, query: ListAttemptsQuery): Promise<{ attempts: WebhookAttempt[], nextCursor: string | undefined }> {
  await endpointOrThrow(db, id)
  const limit = query.limit ?? 100
  const before = pageCursor('webhook_attempts', query.cursor)
  const rows = await listAttempts(db, id, { ...(query.event_id !== undefined ? { eventId: query.event_id } : {}), limit, ...(before !== undefined ? { beforeId: before } : {}) })
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return { attempts: page.map(toAttempt), nextCursor: rows.length > limit && last !== undefined ? encodeCursor('webhook_attempts', [last.id]) : undefined }
}

/** Makes one delivery due now (pending, delivered or failed alike), retried for a fresh horizon. Same webhook-id as before. */
export async function retryWebhookDelivery (db: Db, settings: WebhookSettings, id: string, eventId: string): Promise<WebhookDelivery> {
  await endpointOrThrow(db, id)
  const now = Date.now()
  const found = await requeueDelivery(db, id, eventId, new Date(now).toISOString(), new Date(now + settings.webhookRetryHorizonMs).toISOString())
  if (!found) throw new AppError('webhook_delivery_not_found', 404, `Endpoint ${id} has no delivery of event ${eventId}.`)
  return toDelivery((await findDelivery(db, id, eventId))!)
}

/** The smallest UUID v7 of an instant: ids compare as their time prefix does. */
function uuidV7Floor (ms: number): string {
  const hex = Math.max(0, Math.floor(ms)).toString(16).padStart(12, '0')
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-0000-0000-000000000000`
}

/**
 * Queues every event of the range that the endpoint's filter matches (also
 * events from before the endpoint existed), with the event id as webhook-id
 * as always: receivers that remember ids see a replayed event as a repeat.
 */
export async function replayWebhook (db: Db, ctx: RequestContext, settings: WebhookSettings, id: string, input: WebhookReplay): Promise<{ queued: number }> {
  const since = Date.parse(input.since)
  const until = input.until !== undefined ? Date.parse(input.until) : Date.now()
  if (!(until > since)) {
    throw new AppError('validation_failed', 422, 'until must be after since.', { errors: [{ in: 'body', pointer: '/until', detail: 'is not after since' }] })
  }
  return await db.transaction().execute(async trx => {
    const endpoint = await endpointOrThrow(trx, id)
    const now = Date.now()
    // An event's id and occurred_at are taken a moment apart; a second either side covers that.
    const queued = await requeueRange(trx, endpoint, {
      since: new Date(since).toISOString(),
      until: new Date(until).toISOString(),
      idFrom: uuidV7Floor(since - 1000),
      idTo: uuidV7Floor(until + 1000),
      at: new Date(now).toISOString(),
      giveUpAt: new Date(now + settings.webhookRetryHorizonMs).toISOString()
    })
    await recordEvent(trx, ctx, 'webhook.replayed', { type: 'webhook', id }, {
      since: new Date(since).toISOString(), until: new Date(until).toISOString(), queued
    })
    return { queued }
  })
}

/**
 * Sends a `webhook.ping` now, signed like every delivery, and reports the
 * answer. Not queued, not retried, not in the event log.
 */
export async function pingWebhook (db: Db, ctx: RequestContext, sender: Sender, id: string): Promise<WebhookTestResult> {
  const endpoint = await endpointOrThrow(db, id)
  const webhookId = newId()
  const now = new Date()
  const body = JSON.stringify({
    id: webhookId,
    type: 'webhook.ping',
    occurred_at: now.toISOString(),
    actor: { type: ctx.actorType, id: ctx.actorId },
    target: { type: 'webhook', id },
    request_id: ctx.requestId,
    client_ip: ctx.clientIp,
    data: {}
  })
  const result = await sender.send(endpoint.url, {
    'webhook-id': webhookId,
    'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
    'webhook-signature': signatureHeader(signingSecrets(endpoint, now.getTime()), webhookId, now, body)
  }, body)
  return { ok: result.ok, webhook_id: webhookId, status_code: result.statusCode, latency_ms: result.latencyMs, error: result.error }
}

/** Housekeeping, hourly: finished deliveries and attempts older than WEBHOOK_RETENTION_DAYS are forgotten. */
export async function purgeWebhookHistory (db: Db, config: Pick<Config, 'webhookRetentionMs'>, now = Date.now()): Promise<{ deliveries: number, attempts: number }> {
  return await deleteWebhookHistoryBefore(db, new Date(now - config.webhookRetentionMs).toISOString())
}
