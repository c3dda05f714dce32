import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * One row per account and sign-in throttle window that has refused an
 * attempt (sessions/throttle.ts): the first refusal inserts it and records
 * `user.login_throttled`; every later one in the window finds the key taken
 * and records nothing. The key decides the race between instances.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { ts } = columnTypes(db)
  await db.schema.createTable('login_throttle_windows')
    // `<account>|<budget key>|<window start, epoch ms>`
    .addColumn('key', 'text', c => c.primaryKey())
    .addColumn('ends_at', ts, c => c.notNull())
    .execute()
  // Rows of windows that have ended are deleted by the next window's first refusal.
  await db.schema.createIndex('login_throttle_windows_ends_at_idx').on('login_throttle_windows').column('ends_at').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('login_throttle_windows').execute()
}
