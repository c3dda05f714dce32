import { toIso, type Db } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { decodeCursor, encodeCursor } from '../lib/paging.ts'
import { insertEvent, listEvents } from './events.repository.ts'
import type { Event, EventType, ListEventsQuery } from './events.schemas.ts'

export const REDACTED = '[redacted]'

/**
 * Appends one event. Call it with the transaction that makes the change, so
 * the change and its record commit or roll back together.
 */
export async function recordEvent (
  trx: Db,
  ctx: RequestContext,
  type: EventType,
  target: { type: string, id: string } | null,
  data: Record<string, unknown>
): Promise<void> {
  await insertEvent(trx, {
    id: newId(),
    type,
    occurred_at: nowIso(),
    actor_type: ctx.actorType,
    actor_id: ctx.actorId,
    target_type: target?.type ?? null,
    target_id: target?.id ?? null,
    request_id: ctx.requestId,
    client_ip: ctx.clientIp,
    data: JSON.stringify(data)
  })
}

export async function listEventsPage (db: Db, query: ListEventsQuery): Promise<{ events: Event[], nextCursor: string | undefined }> {
  const limit = query.limit ?? 100
  const beforeId = query.cursor !== undefined ? decodeCursor(query.cursor, 'events', 1)[0] : undefined
  const rows = await listEvents(db, query, limit, beforeId)
  const page = rows.slice(0, limit)
  const events = page.map(row => ({
    id: row.id,
    type: row.type,
    occurred_at: toIso(row.occurred_at),
    actor: { type: row.actor_type as Event['actor']['type'], id: row.actor_id },
    target: row.target_type !== null && row.target_id !== null ? { type: row.target_type, id: row.target_id } : null,
    request_id: row.request_id,
    client_ip: row.client_ip,
    data: typeof row.data === 'string' ? JSON.parse(row.data) as Record<string, unknown> : row.data
  }))
  const last = page.at(-1)
  return { events, nextCursor: rows.length > limit && last !== undefined ? encodeCursor('events', [last.id]) : undefined }
}
