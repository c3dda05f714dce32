import { sql, type Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/** Webhooks: endpoints, the delivery outbox (written with each event) and the attempt history. */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts, json, bool } = columnTypes(db)

  await db.schema.createTable('webhook_endpoints')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('url', 'text', c => c.notNull())
    .addColumn('description', 'text')
    .addColumn('event_types', json, c => c.notNull())
    .addColumn('event_patterns', json, c => c.notNull())
    .addColumn('enabled', bool, c => c.notNull())
    .addColumn('disabled_reason', 'text')
    .addColumn('secret', 'text', c => c.notNull())
    .addColumn('previous_secret', 'text')
    .addColumn('previous_secret_expires_at', ts)
    .addColumn('failing_since', ts)
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('updated_at', ts, c => c.notNull())
    .execute()

  await db.schema.createTable('webhook_deliveries')
    .addColumn('endpoint_id', uuid, c => c.notNull().references('webhook_endpoints.id').onDelete('cascade'))
    .addColumn('event_id', uuid, c => c.notNull())
    .addColumn('status', 'text', c => c.notNull().check(sql`status in ('pending', 'delivered', 'failed')`))
    .addColumn('attempts', 'integer', c => c.notNull())
    .addColumn('next_attempt_at', ts, c => c.notNull())
    .addColumn('give_up_at', ts)
    .addColumn('locked_until', ts)
    .addColumn('lock_token', 'text')
    .addColumn('last_attempt_at', ts)
    .addColumn('last_status_code', 'integer')
    .addColumn('last_error', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('delivered_at', ts)
    // Newest first per endpoint is event_id descending: event ids are time-ordered.
    .addPrimaryKeyConstraint('webhook_deliveries_pk', ['endpoint_id', 'event_id'])
    .execute()
  // What the workers' claim scans: only pending rows, soonest first.
  await db.schema.createIndex('webhook_deliveries_due_idx').on('webhook_deliveries')
    .column('next_attempt_at').where(sql.ref('status'), '=', 'pending').execute()
  // For /metrics; partial, so the outbox insert on every event's path maintains no further index.
  await db.schema.createIndex('webhook_deliveries_failed_idx').on('webhook_deliveries')
    .column('endpoint_id').where(sql.ref('status'), '=', 'failed').execute()

  await db.schema.createTable('webhook_attempts')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('endpoint_id', uuid, c => c.notNull().references('webhook_endpoints.id').onDelete('cascade'))
    .addColumn('event_id', uuid, c => c.notNull())
    .addColumn('attempted_at', ts, c => c.notNull())
    .addColumn('succeeded', bool, c => c.notNull())
    .addColumn('status_code', 'integer')
    .addColumn('latency_ms', 'integer', c => c.notNull())
    .addColumn('error', 'text')
    .addColumn('next_attempt_at', ts)
    .execute()
  await db.schema.createIndex('webhook_attempts_endpoint_idx').on('webhook_attempts').columns(['endpoint_id', 'id']).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  for (const table of ['webhook_attempts', 'webhook_deliveries', 'webhook_endpoints']) {
    await db.schema.dropTable(table).execute()
  }
}
