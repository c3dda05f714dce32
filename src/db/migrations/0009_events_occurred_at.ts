import type { Kysely } from 'kysely'

export const phase = 'expand'

/**
 * The event log's time range (`since`, `until`; the console's From and To):
 * without this index a range far back in a long log reads every newer event
 * on its way there. With it, a range is read from the index and only its rows
 * are sorted by id for the page.
 */
export async function up (db: Kysely<any>): Promise<void> {
  await db.schema.createIndex('events_occurred_at_idx').on('events').columns(['occurred_at', 'id']).execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('events_occurred_at_idx').execute()
}
