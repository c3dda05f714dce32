import type { Kysely } from 'kysely'

export const phase = 'expand'

/**
 * The trace each event was recorded in, when traces are exported
 * (docs/operations.md#traces): `trace_id` is the event's `trace_id`, and the
 * span, with it, is what the event's webhook deliveries continue, so they
 * appear in the trace of the request that made the change. Null without
 * tracing, and for every event recorded before this migration.
 */
export async function up (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('events').addColumn('trace_id', 'text').execute()
  await db.schema.alterTable('events').addColumn('span_id', 'text').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('events').dropColumn('span_id').execute()
  await db.schema.alterTable('events').dropColumn('trace_id').execute()
}
