import { CompiledQuery, sql, type Selectable } from 'kysely'
import { isPostgres, type Db, type WebhookAttemptsTable, type WebhookDeliveriesTable, type WebhookEndpointsTable } from '../db/database.ts'

export type WebhookEndpointRow = Selectable<WebhookEndpointsTable>
export type WebhookDeliveryRow = Selectable<WebhookDeliveriesTable>
export type WebhookAttemptRow = Selectable<WebhookAttemptsTable>

// ---------------------------------------------------------------- the outbox, on every event's path

/**
 * One statement per event, whatever the number of endpoints: a delivery row
 * for each enabled endpoint whose filter matches the type. Written as raw SQL
 * once per dialect, so the hot path pays no query building.
 */
const ENQUEUE_SQL = {
  postgres: `insert into webhook_deliveries (endpoint_id, event_id, status, attempts, next_attempt_at, created_at)
select e.id, $1, 'pending', 0, $2, $2 from webhook_endpoints e
where e.enabled and exists (select 1 from jsonb_array_elements_text(e.event_patterns) p(pattern) where $3::text like p.pattern escape '\\')`,
  sqlite: `insert into webhook_deliveries (endpoint_id, event_id, status, attempts, next_attempt_at, created_at)
select e.id, ?, 'pending', 0, ?, ? from webhook_endpoints e
where e.enabled = 1 and exists (select 1 from json_each(e.event_patterns) p where ? like p.value escape '\\')`
}

/** Queues the event for every matching endpoint, in the caller's transaction. Returns how many deliveries were queued. */
export async function enqueueDeliveries (trx: Db, event: { id: string, type: string, at: string }): Promise<number> {
  const postgres = isPostgres(trx)
  const parameters = postgres ? [event.id, event.at, event.type] : [event.id, event.at, event.at, event.type]
  const result = await trx.executeQuery(CompiledQuery.raw(postgres ? ENQUEUE_SQL.postgres : ENQUEUE_SQL.sqlite, parameters))
  return Number(result.numAffectedRows ?? 0n)
}

/** The same for many events at once (an import): one statement for all of them. */
const ENQUEUE_MANY_SQL = {
  postgres: `insert into webhook_deliveries (endpoint_id, event_id, status, attempts, next_attempt_at, created_at)
select e.id, (ev->>'id')::uuid, 'pending', 0, $1, $1 from webhook_endpoints e, jsonb_array_elements($2::jsonb) ev
where e.enabled and exists (select 1 from jsonb_array_elements_text(e.event_patterns) p(pattern) where ev->>'type' like p.pattern escape '\\')`,
  sqlite: `insert into webhook_deliveries (endpoint_id, event_id, status, attempts, next_attempt_at, created_at)
select e.id, json_extract(ev.value, '$.id'), 'pending', 0, ?, ? from webhook_endpoints e, json_each(?) ev
where e.enabled = 1 and exists (select 1 from json_each(e.event_patterns) p where json_extract(ev.value, '$.type') like p.value escape '\\')`
}

export async function enqueueDeliveriesMany (trx: Db, events: Array<{ id: string, type: string }>, at: string): Promise<number> {
  if (events.length === 0) return 0
  const list = JSON.stringify(events.map(e => ({ id: e.id, type: e.type })))
  const postgres = isPostgres(trx)
  const result = await trx.executeQuery(CompiledQuery.raw(postgres ? ENQUEUE_MANY_SQL.postgres : ENQUEUE_MANY_SQL.sqlite, postgres ? [at, list] : [at, at, list]))
  return Number(result.numAffectedRows ?? 0n)
}

// ---------------------------------------------------------------- endpoints

export interface NewEndpointRow {
  id: string
  url: string
  description: string | null
  event_types: string
  event_patterns: string
  enabled: boolean
  disabled_reason: string | null
  secret: string
  previous_secret: null
  previous_secret_expires_at: null
  failing_since: null
  created_at: string
  updated_at: string
}

export async function insertEndpoint (db: Db, row: NewEndpointRow): Promise<WebhookEndpointRow> {
  return await db.insertInto('webhook_endpoints').values(row).returningAll().executeTakeFirstOrThrow()
}

export async function findEndpoint (db: Db, id: string): Promise<WebhookEndpointRow | undefined> {
  return await db.selectFrom('webhook_endpoints').selectAll().where('id', '=', id).executeTakeFirst()
}

export async function findEndpoints (db: Db, ids: string[]): Promise<WebhookEndpointRow[]> {
  if (ids.length === 0) return []
  return await db.selectFrom('webhook_endpoints').selectAll().where('id', 'in', ids).execute()
}

export async function listEndpoints (db: Db): Promise<WebhookEndpointRow[]> {
  return await db.selectFrom('webhook_endpoints').selectAll().orderBy('id', 'asc').execute()
}

export type EndpointChanges = Partial<Pick<NewEndpointRow, 'url' | 'description' | 'event_types' | 'event_patterns' | 'enabled' | 'disabled_reason' | 'secret'>> & {
  previous_secret?: string | null
  previous_secret_expires_at?: string | null
  failing_since?: string | null
  updated_at: string
}

export async function updateEndpoint (db: Db, id: string, changes: EndpointChanges): Promise<WebhookEndpointRow | undefined> {
  return await db.updateTable('webhook_endpoints').set(changes).where('id', '=', id).returningAll().executeTakeFirst()
}

export async function deleteEndpoint (db: Db, id: string): Promise<WebhookEndpointRow | undefined> {
  return await db.deleteFrom('webhook_endpoints').where('id', '=', id).returningAll().executeTakeFirst()
}

/** Disables an enabled endpoint; undefined when it was already disabled (or is gone), so only one caller records it. */
export async function disableEndpoint (db: Db, id: string, reason: string, at: string): Promise<WebhookEndpointRow | undefined> {
  return await db.updateTable('webhook_endpoints').set({ enabled: false, disabled_reason: reason, updated_at: at })
    .where('id', '=', id).where('enabled', '=', true)
    .returningAll().executeTakeFirst()
}

/** Marks an endpoint failing since `since`, unless it already is; returns since when it has been failing. */
export async function markEndpointFailing (db: Db, id: string, since: string): Promise<string | null> {
  const row = await db.updateTable('webhook_endpoints')
    .set({ failing_since: sql`coalesce(failing_since, ${since})` })
    .where('id', '=', id).returning('failing_since').executeTakeFirst()
  return row?.failing_since == null ? null : new Date(row.failing_since).toISOString()
}

/** Only writes when the endpoint was failing, so a healthy endpoint's successes cost no write here. */
export async function clearEndpointFailing (db: Db, id: string): Promise<void> {
  await db.updateTable('webhook_endpoints').set({ failing_since: null }).where('id', '=', id).where('failing_since', 'is not', null).execute()
}

// ---------------------------------------------------------------- deliveries

/**
 * Claims up to `limit` due deliveries of enabled endpoints for `leaseUntil`.
 * PostgreSQL: FOR UPDATE SKIP LOCKED, so instances claiming at the same time
 * take disjoint rows without waiting for each other; a row claimed and
 * committed meanwhile is re-checked and skipped (its lease is live). SQLite
 * runs one writer at a time, which gives the same exclusivity.
 */
export async function claimDeliveries (db: Db, options: { now: string, leaseUntil: string, token: string, limit: number }): Promise<WebhookDeliveryRow[]> {
  const { now, leaseUntil, token, limit } = options
  if (isPostgres(db)) {
    const result = await sql<WebhookDeliveryRow>`
      update webhook_deliveries d set locked_until = ${leaseUntil}, lock_token = ${token}
      from (
        select wd.endpoint_id, wd.event_id from webhook_deliveries wd
        join webhook_endpoints e on e.id = wd.endpoint_id
        where wd.status = 'pending' and wd.next_attempt_at <= ${now}
          and (wd.locked_until is null or wd.locked_until <= ${now}) and e.enabled
        order by wd.next_attempt_at
        limit ${limit}
        for update of wd skip locked
      ) c
      where d.endpoint_id = c.endpoint_id and d.event_id = c.event_id
      returning d.*`.execute(db)
    return result.rows
  }
  const result = await sql<WebhookDeliveryRow>`
    update webhook_deliveries set locked_until = ${leaseUntil}, lock_token = ${token}
    where rowid in (
      select wd.rowid from webhook_deliveries wd
      join webhook_endpoints e on e.id = wd.endpoint_id
      where wd.status = 'pending' and wd.next_attempt_at <= ${now}
        and (wd.locked_until is null or wd.locked_until <= ${now}) and e.enabled = 1
      order by wd.next_attempt_at
      limit ${limit}
    )
    returning *`.execute(db)
  return result.rows
}

export interface AttemptOutcome {
  attemptId: string
  at: string
  succeeded: boolean
  statusCode: number | null
  latencyMs: number
  error: string | null
  /** The new state of the delivery. */
  status: 'pending' | 'delivered' | 'failed'
  nextAttemptAt: string
}

/**
 * A retry or replay that lands while the delivery is in flight must not be
 * swallowed by that attempt's result: it renames the lease (so no other worker
 * claims the row before the lease ends) and completeDelivery, seeing the
 * renamed token, records the attempt but leaves the delivery pending and due.
 */
const REQUEUED = 'requeued:'
// Qualified: in an upsert's DO UPDATE a bare column name is ambiguous with the proposed row on PostgreSQL.
const current = sql.ref('webhook_deliveries.lock_token')
const markRequeued = sql<string | null>`case when ${current} is null or ${current} like ${REQUEUED + '%'} then ${current} else ${REQUEUED} || ${current} end`

/**
 * Records an attempt's result and releases the claim, if the claim is still
 * ours (renamed or not by a requeue). Returns false when it is not (the lease
 * ran out and another worker took the row): then nothing is written.
 */
export async function completeDelivery (trx: Db, delivery: { endpoint_id: string, event_id: string }, token: string, outcome: AttemptOutcome): Promise<boolean> {
  const requeued = sql<boolean>`lock_token = ${REQUEUED + token}`
  const updated = await trx.updateTable('webhook_deliveries')
    .set({
      status: sql`case when ${requeued} then 'pending' else ${outcome.status} end`,
      attempts: sql`attempts + 1`,
      next_attempt_at: sql`case when ${requeued} then next_attempt_at else ${outcome.nextAttemptAt} end`,
      locked_until: null,
      lock_token: null,
      last_attempt_at: outcome.at,
      last_status_code: outcome.statusCode,
      last_error: outcome.error,
      ...(outcome.status === 'delivered' ? { delivered_at: outcome.at } : {})
    })
    .where('endpoint_id', '=', delivery.endpoint_id).where('event_id', '=', delivery.event_id)
    .where('lock_token', 'in', [token, REQUEUED + token])
    .returning(['status', 'next_attempt_at'])
    .executeTakeFirst()
  if (updated === undefined) return false
  await trx.insertInto('webhook_attempts').values({
    id: outcome.attemptId,
    endpoint_id: delivery.endpoint_id,
    event_id: delivery.event_id,
    attempted_at: outcome.at,
    succeeded: outcome.succeeded,
    status_code: outcome.statusCode,
    latency_ms: outcome.latencyMs,
    error: outcome.error,
    next_attempt_at: updated.status === 'pending' ? new Date(updated.next_attempt_at).toISOString() : null
  }).execute()
  return true
}

export interface DeliveryListRow extends WebhookDeliveryRow { event_type: string | null }

/** Newest event first; `beforeEventId` continues a page. One row more than asked, to tell whether more exist. */
export async function listDeliveries (db: Db, endpointId: string, options: { status?: string, limit: number, beforeEventId?: string }): Promise<DeliveryListRow[]> {
  return await db.selectFrom('webhook_deliveries as d')
    .leftJoin('events as ev', 'ev.id', 'd.event_id')
    .selectAll('d').select('ev.type as event_type')
    .where('d.endpoint_id', '=', endpointId)
    .$if(options.status !== undefined, q => q.where('d.status', '=', options.status as WebhookDeliveryRow['status']))
    .$if(options.beforeEventId !== undefined, q => q.where('d.event_id', '<', options.beforeEventId!))
    .orderBy('d.event_id', 'desc')
    .limit(options.limit + 1)
    .execute()
}

export async function findDelivery (db: Db, endpointId: string, eventId: string): Promise<DeliveryListRow | undefined> {
  return await db.selectFrom('webhook_deliveries as d')
    .leftJoin('events as ev', 'ev.id', 'd.event_id')
    .selectAll('d').select('ev.type as event_type')
    .where('d.endpoint_id', '=', endpointId).where('d.event_id', '=', eventId)
    .executeTakeFirst()
}

/** Due now and retried for a fresh horizon. A delivery in flight keeps its claim, renamed (markRequeued): its attempt is recorded, and it stays due. */
export async function requeueDelivery (db: Db, endpointId: string, eventId: string, at: string, giveUpAt: string): Promise<boolean> {
  const result = await db.updateTable('webhook_deliveries')
    .set({ status: 'pending', next_attempt_at: at, give_up_at: giveUpAt, lock_token: markRequeued })
    .where('endpoint_id', '=', endpointId).where('event_id', '=', eventId)
    .executeTakeFirst()
  return Number(result.numUpdatedRows) > 0
}

/**
 * Queues again every event of [since, until) that the endpoint's filter
 * matches: new deliveries for events it never had, and existing ones made
 * due again. Event ids are UUID v7, so the time range is first narrowed on the
 * primary key (`idFrom`/`idTo`, a little wider than the range), then matched
 * exactly on occurred_at.
 */
export async function requeueRange (db: Db, endpoint: WebhookEndpointRow, range: { since: string, until: string, idFrom: string, idTo: string, at: string, giveUpAt: string }): Promise<number> {
  const patterns = typeof endpoint.event_patterns === 'string' ? endpoint.event_patterns : JSON.stringify(endpoint.event_patterns)
  const match = isPostgres(db)
    ? sql`exists (select 1 from jsonb_array_elements_text(${patterns}::jsonb) p(pattern) where ev.type like p.pattern escape '\\')`
    : sql`exists (select 1 from json_each(${patterns}) p where ev.type like p.value escape '\\')`
  const result = await sql`
    insert into webhook_deliveries (endpoint_id, event_id, status, attempts, next_attempt_at, give_up_at, created_at)
    select ${endpoint.id}, ev.id, 'pending', 0, ${range.at}, ${range.giveUpAt}, ${range.at} from events ev
    where ev.id >= ${range.idFrom} and ev.id < ${range.idTo}
      and ev.occurred_at >= ${range.since} and ev.occurred_at < ${range.until} and ${match}
    on conflict (endpoint_id, event_id) do update set status = 'pending', next_attempt_at = excluded.next_attempt_at, give_up_at = excluded.give_up_at, lock_token = ${markRequeued}`.execute(db)
  return Number(result.numAffectedRows ?? 0n)
}

/** Newest first; `beforeId` continues a page. One row more than asked. */
export async function listAttempts (db: Db, endpointId: string, options: { eventId?: string, limit: number, beforeId?: string }): Promise<Array<WebhookAttemptRow & { event_type: string | null }>> {
  return await db.selectFrom('webhook_attempts as a')
    .leftJoin('events as ev', 'ev.id', 'a.event_id')
    .selectAll('a').select('ev.type as event_type')
    .where('a.endpoint_id', '=', endpointId)
    .$if(options.eventId !== undefined, q => q.where('a.event_id', '=', options.eventId!))
    .$if(options.beforeId !== undefined, q => q.where('a.id', '<', options.beforeId!))
    .orderBy('a.id', 'desc')
    .limit(options.limit + 1)
    .execute()
}

/** For /metrics: deliveries waiting and given up, across all instances. */
export async function countDeliveriesByStatus (db: Db): Promise<{ pending: number, failed: number }> {
  // One count per status, so each is answered from its partial index, not a scan of every delivery ever made.
  const count = async (status: 'pending' | 'failed'): Promise<number> => Number((await db.selectFrom('webhook_deliveries')
    .select(db.fn.countAll<string | number>().as('n')).where('status', '=', status).executeTakeFirstOrThrow()).n)
  const [pending, failed] = await Promise.all([count('pending'), count('failed')])
  return { pending, failed }
}

/**
 * Forgets finished deliveries (delivered, or given up) and attempts older
 * than `before`. Pending deliveries are never removed; the events stay in the
 * event log, so a replay can queue them again.
 */
export async function deleteWebhookHistoryBefore (db: Db, before: string): Promise<{ deliveries: number, attempts: number }> {
  const deliveries = await db.deleteFrom('webhook_deliveries')
    .where('status', 'in', ['delivered', 'failed'])
    .where(eb => eb(eb.fn.coalesce('delivered_at', 'last_attempt_at', 'created_at'), '<', before))
    .executeTakeFirst()
  const attempts = await db.deleteFrom('webhook_attempts').where('attempted_at', '<', before).executeTakeFirst()
  return { deliveries: Number(deliveries.numDeletedRows), attempts: Number(attempts.numDeletedRows) }
}
