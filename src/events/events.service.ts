import { toIso, type Db } from '../db/database.ts'
import { decodeCursor, encodeCursor } from '../lib/paging.ts'
import { findPartyNames, findUserIdByUsername, listEvents, type EventRow, type EventsAfter } from './events.repository.ts'
import type { Event, ListEventsQuery } from './events.schemas.ts'

/** An event as the API shows it (GET /api/events, and the body of every webhook delivery). */
export function toEvent (row: EventRow): Event {
  return {
    id: row.id,
    type: row.type,
    occurred_at: toIso(row.occurred_at),
    actor: { type: row.actor_type as Event['actor']['type'], id: row.actor_id },
    target: row.target_type !== null && row.target_id !== null ? { type: row.target_type, id: row.target_id } : null,
    request_id: row.request_id,
    client_ip: row.client_ip,
    data: typeof row.data === 'string' ? JSON.parse(row.data) as Record<string, unknown> : row.data,
    ...(row.trace_id !== null ? { trace_id: row.trace_id } : {})
  }
}

export async function listEventsPage (db: Db, query: ListEventsQuery): Promise<{ events: Event[], nextCursor: string | undefined }> {
  const limit = query.limit ?? 100
  // A time range pages by (time, id), the order it is read in (see listEventsQuery); its cursors are of their own kind.
  const byTime = query.since !== undefined || query.until !== undefined
  let after: EventsAfter | undefined
  if (query.cursor !== undefined) {
    if (byTime) {
      const [at, id] = decodeCursor(query.cursor, 'events_by_time', ['timestamp', 'uuid'])
      after = { at: at!, id: id! }
    } else {
      after = { id: decodeCursor(query.cursor, 'events', ['uuid'])[0]! }
    }
  }
  const rows = await listEvents(db, query, limit, after)
  const page = rows.slice(0, limit)
  const events = page.map(toEvent)
  const last = page.at(-1)
  if (rows.length <= limit || last === undefined) return { events, nextCursor: undefined }
  return { events, nextCursor: byTime ? encodeCursor('events_by_time', [toIso(last.occurred_at), last.id]) : encodeCursor('events', [last.id]) }
}

/** The names of the users, API keys and webhook endpoints a page of events points at (see findPartyNames). */
export type PartyNames = Awaited<ReturnType<typeof findPartyNames>>

export async function partyNamesOf (db: Db, events: Event[]): Promise<PartyNames> {
  const ids = { users: new Set<string>(), apiKeys: new Set<string>(), webhooks: new Set<string>() }
  const add = (type: string, id: string | null): void => {
    if (id === null) return
    if (type === 'user') ids.users.add(id)
    else if (type === 'api_key') ids.apiKeys.add(id)
    else if (type === 'webhook') ids.webhooks.add(id)
  }
  for (const event of events) {
    add(event.actor.type, event.actor.id)
    if (event.target !== null) add(event.target.type, event.target.id)
  }
  return await findPartyNames(db, { users: [...ids.users], apiKeys: [...ids.apiKeys], webhooks: [...ids.webhooks] })
}

/** The id of the user with this username (ignoring case), for filtering events by a person. */
export async function userIdOfUsername (db: Db, username: string): Promise<string | undefined> {
  return await findUserIdByUsername(db, username)
}
