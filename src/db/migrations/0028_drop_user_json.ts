import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'
import { createPgUserJsonFunction, userJsonSqlite } from './0021_user_json.ts'
import { recreateCredentialTrigger, renderIntoUsersColumn as renderIntoPgColumn } from './0023_user_json_column.ts'
import { renderIntoUsersColumn as renderIntoSqliteColumn } from './0024_user_json_sqlite_column.ts'

// Contract: drops users.user_json, which the release before this one no longer reads (docs/operations.md,
// "Expand and contract"); the release before that one read it, so an upgrade must come from the previous release.
export const phase = 'contract'

/**
 * Each user's stored User JSON (migrations 0021, 0023, 0024) goes: the
 * column, the triggers that rendered it at every write and PostgreSQL's
 * rendering functions. Users are read from their columns (`USER_COLUMNS` in
 * users.repository.ts), so a field added to the User is a nullable column
 * and one line there, not a migration that rewrites every row.
 *
 * On PostgreSQL dropping a column changes only the catalogue. On SQLite
 * `drop column` rewrites the table once, a few seconds at 1,000,000 users, at
 * the start that migrates (SQLite is one instance: it has no rolling upgrade).
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) {
    await sql`drop trigger if exists users_json_render on users`.execute(db)
    await sql`drop function if exists gatehouse_user_json_render()`.execute(db)
    await sql`drop function if exists gatehouse_user_json(users)`.execute(db)
    // Migration 0020's credential trigger, as it was before 0023 added user_json to its ignored columns.
    await recreateCredentialTrigger(db, ['failed_logins', 'locked_until', 'last_login_at'])
    await sql`alter table users drop column user_json`.execute(db)
    return
  }
  for (const trigger of ['users_json_insert', 'users_json_update']) await sql`drop trigger if exists ${sql.id(trigger)}`.execute(db)
  await sql`drop index users_created_at_idx`.execute(db)
  // Through the schema builder, as 0001 made it: SQLite keeps an index's statement as written.
  await db.schema.createIndex('users_created_at_idx').on('users').columns(['created_at', 'id']).execute()
  await sql`alter table users drop column user_json`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) {
    await createPgUserJsonFunction(db)
    await renderIntoPgColumn(db, sql`gatehouse_user_json(users)`)
    return
  }
  await renderIntoSqliteColumn(db, userJsonSqlite('users.'))
}
