import { sql, type Kysely, type RawBuilder } from 'kysely'
import { isPostgres } from '../database.ts'
// Migration 0021's list and rendering: the column and its triggers hold the same text the user_json table did;
// its triggers are what `down` puts back.
import { createSqliteUserJsonTriggers, USER_FIELDS, userJsonSqlite } from './0021_user_json.ts'

// Contract: drops the user_json table that 0021 made (its rows move into users.user_json).
export const phase = 'contract'

/**
 * SQLite: each user's stored User JSON (migration 0021) moves from the
 * `user_json` table into a column of `users`, `users.user_json`, as
 * PostgreSQL's did in migration 0023, and the index of the default order
 * (`created_at`, `id`) carries it, so that a page of that order is one range
 * of one index.
 *
 * Before, an uncached page of 50 walked that index and looked each of its 51
 * users up in `user_json` by id: 51 descents of a second B-tree keyed by
 * text. Now the text is read from the index entry itself; the users row is
 * read only for a user without a stored text (the fallback rendering needs
 * its columns, and SQLite defers that seek until a column is read: EXPLAIN
 * shows `DeferredSeek`). The other orders read the text from the users row
 * they reach through their index by rowid. 5,000 uncached pages of 50 at
 * 20,000 users, CPU of the process per page, three interleaved rounds
 * (bench/README.md before 2 December 2026 (git history), "Issue 20: the uncached SQLite page, fourth pass"):
 * 58–68 µs before, 39–44 µs with the index carrying the text, 47–54 µs with
 * the text in the row but not in the index.
 *
 * Writers pay: a write of a listed field updates the users row a second time
 * (the trigger renders into it) and rewrites the index entry with the text.
 * SQLite has no size limit for an index entry (a long one spills to overflow
 * pages), unlike PostgreSQL's B-tree, which is why 0023 put no text in an
 * index.
 *
 * The trigger is AFTER (SQLite's BEFORE triggers cannot change NEW) and
 * updates only `user_json`, which no trigger on `users` listens to, so it
 * does not fire itself or the search and membership triggers (0016, 0018).
 * The text is re-rendered only when a field of the User changes, and readers
 * do not trust its presence (`coalesce` with a rendering from the columns,
 * users.repository.ts).
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) return
  for (const trigger of ['users_json_insert', 'users_json_update', 'users_json_delete']) await sql`drop trigger if exists ${sql.id(trigger)}`.execute(db)
  await renderIntoUsersColumn(db, sql`coalesce((select j.json from user_json j where j.user_id = users.id), ${userJsonSqlite('users.')})`)
  await sql`drop table user_json`.execute(db)
}

/**
 * The column, the index that carries it, its triggers and its first values (`fill`, an expression over `users`); also
 * what migration 0028's `down` puts back.
 */
export async function renderIntoUsersColumn (db: Kysely<any>, fill: RawBuilder<unknown>): Promise<void> {
  await sql`alter table users add column user_json text`.execute(db)
  await sql`update users set user_json = ${fill}`.execute(db)
  await sql`drop index users_created_at_idx`.execute(db)
  await sql`create index users_created_at_idx on users (created_at, id, user_json)`.execute(db)
  await sql`create trigger users_json_insert after insert on users begin
    update users set user_json = ${userJsonSqlite('new.')} where rowid = new.rowid;
  end`.execute(db)
  await sql`create trigger users_json_update after update of ${sql.join(USER_FIELDS.map(field => sql.id(field)))} on users begin
    update users set user_json = ${userJsonSqlite('new.')} where rowid = new.rowid;
  end`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) return
  for (const trigger of ['users_json_insert', 'users_json_update']) await sql`drop trigger if exists ${sql.id(trigger)}`.execute(db)
  await sql`drop index users_created_at_idx`.execute(db)
  // Through the schema builder, as 0001 made it: SQLite keeps an index's statement as written, so this puts back 0001's text and not just an equal index.
  await db.schema.createIndex('users_created_at_idx').on('users').columns(['created_at', 'id']).execute()
  await sql`create table user_json (user_id text primary key, json text not null) without rowid`.execute(db)
  await sql`insert into user_json (user_id, json) select id, coalesce(user_json, ${userJsonSqlite('users.')}) from users`.execute(db)
  await sql`alter table users drop column user_json`.execute(db)
  await createSqliteUserJsonTriggers(db)
}
