import type { Selectable } from 'kysely'
import type { Db, EventsTable } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { activeTrace } from '../lib/tracing.ts'
import { queueNotices } from '../mail/mail.outbox.ts'
import { queueDeliveries } from '../webhooks/webhooks.outbox.ts'
import type { EventType, ListEventsQuery } from './events.schemas.ts'

export interface NewEventRow {
  id: string
  type: string
  occurred_at: string
  actor_type: string
  actor_id: string | null
  target_type: string | null
  target_id: string | null
  request_id: string | null
  client_ip: string | null
  data: string
  trace_id: string | null
  span_id: string | null
}

export type EventRow = Selectable<EventsTable>

export async function findEventsByIds (db: Db, ids: string[]): Promise<EventRow[]> {
  if (ids.length === 0) return []
  return await db.selectFrom('events').selectAll().where('id', 'in', ids).execute()
}

const EVENT_COLUMNS = ['id', 'type', 'occurred_at', 'actor_type', 'actor_id', 'target_type', 'target_id', 'request_id', 'client_ip', 'data', 'trace_id', 'span_id'] as const

export async function insertEvent (db: Db, event: NewEventRow): Promise<void> {
  await db.insertInto('events').values(Object.fromEntries(EVENT_COLUMNS.map(column => [column, event[column]])) as unknown as NewEventRow).execute()
}

/** Where a page continues: before this event (and, in a time range, before its time). */
export interface EventsAfter { id: string, at?: string }

/** Newest first; `after` continues a page. Returns one row more than asked, to tell whether more exist. */
export async function listEvents (db: Db, filter: Omit<ListEventsQuery, 'cursor' | 'limit'>, limit: number, after: EventsAfter | undefined) {
  return await listEventsQuery(db, filter, limit, after).execute()
}

/**
 * The query of listEvents, unrun (its plan is checked by the tests). Without
 * a time range the order is the id's, which is time-ordered (UUID v7). With
 * one it is (occurred_at, id), the key of events_occurred_at_idx, so a range
 * anywhere in the log is read from that index in order: ordered by id, the
 * PostgreSQL planner scans the primary key from the newest event back to an
 * old range, as it cannot know that ids follow time.
 */
export function listEventsQuery (db: Db, filter: Omit<ListEventsQuery, 'cursor' | 'limit'>, limit: number, after: EventsAfter | undefined) {
  const byTime = filter.since !== undefined || filter.until !== undefined
  return db.selectFrom('events').selectAll()
    .$if(filter.type !== undefined, q => q.where('type', '=', filter.type!))
    .$if(filter.actor_id !== undefined, q => q.where('actor_id', '=', filter.actor_id!))
    .$if(filter.target_id !== undefined, q => q.where('target_id', '=', filter.target_id!))
    .$if(filter.since !== undefined, q => q.where('occurred_at', '>=', new Date(filter.since!).toISOString()))
    .$if(filter.until !== undefined, q => q.where('occurred_at', '<', new Date(filter.until!).toISOString()))
    .$if(after !== undefined && !byTime, q => q.where('id', '<', after!.id))
    .$if(after?.at !== undefined && byTime, q => q.where(({ eb, refTuple, tuple }) => eb(refTuple('occurred_at', 'id'), '<', tuple(after!.at!, after!.id))))
    .$if(byTime, q => q.orderBy('occurred_at', 'desc'))
    .orderBy('id', 'desc')
    .limit(limit + 1)
}

/** What events point at, by id, as people know them: usernames, key names, endpoint URLs. Ids not found are left out. */
export async function findPartyNames (db: Db, ids: { users: string[], apiKeys: string[], webhooks: string[] }): Promise<{ users: Map<string, string>, apiKeys: Map<string, string>, webhooks: Map<string, string> }> {
  const [users, apiKeys, webhooks] = await Promise.all([
    ids.users.length === 0 ? [] : db.selectFrom('users').select(['id', 'username as name']).where('id', 'in', ids.users).execute(),
    ids.apiKeys.length === 0 ? [] : db.selectFrom('api_keys').select(['id', 'name']).where('id', 'in', ids.apiKeys).execute(),
    ids.webhooks.length === 0 ? [] : db.selectFrom('webhook_endpoints').select(['id', 'url as name']).where('id', 'in', ids.webhooks).execute()
  ])
  const byId = (rows: Array<{ id: string, name: string }>): Map<string, string> => new Map(rows.map(row => [row.id, row.name]))
  return { users: byId(users), apiKeys: byId(apiKeys), webhooks: byId(webhooks) }
}

/** Usernames are unique ignoring case, through `username_key`. */
export async function findUserIdByUsername (db: Db, username: string): Promise<string | undefined> {
  const row = await db.selectFrom('users').select('id').where('username_key', '=', username.toLowerCase()).executeTakeFirst()
  return row?.id
}

export const REDACTED = '[redacted]'

/**
 * Appends one event, and queues its webhook deliveries (the outbox). Call it with the transaction that makes the change, so
 * the change and its record commit or roll back together. Returns the event's id.
 */
export async function recordEvent (
  trx: Db,
  ctx: RequestContext,
  type: EventType,
  target: { type: string, id: string } | null,
  data: Record<string, unknown>
): Promise<string> {
  const id = newId()
  const occurredAt = nowIso()
  // The request's trace when traces are exported: the event names it, and its webhook deliveries continue it.
  const trace = activeTrace()
  await insertEvent(trx, {
    id,
    type,
    occurred_at: occurredAt,
    actor_type: ctx.actorType,
    actor_id: ctx.actorId,
    target_type: target?.type ?? null,
    target_id: target?.id ?? null,
    request_id: ctx.requestId,
    client_ip: ctx.clientIp,
    data: JSON.stringify(data),
    trace_id: trace?.traceId ?? null,
    span_id: trace?.spanId ?? null
  })
  // The webhook outbox, in the same transaction: one statement, whatever the number of endpoints.
  await queueDeliveries(trx, { id, type, at: occurredAt })
  // The security notices it calls for, mailed later from the same outbox pattern (mail/mail.outbox.ts).
  await queueNotices(trx, { type, occurredAt, target, data, clientIp: ctx.clientIp })
  return id
}
