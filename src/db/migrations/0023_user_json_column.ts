import { sql, type Kysely, type RawBuilder } from 'kysely'
import { isPostgres } from '../database.ts'
import { USER_FIELDS } from './0021_user_json.ts'

// Contract: drops the user_json table that 0021 made (its rows move into users.user_json).
export const phase = 'contract'

/**
 * PostgreSQL: each user's stored User JSON (migration 0021) moves from the
 * `user_json` table into a column of `users`, `users.user_json`, written by a
 * BEFORE trigger from the row being written.
 *
 * An uncached page of 50 walked the sort's index and, for each of its 51
 * users, fetched the users row (the fallback rendering needs it) and then
 * looked the text up in `user_json` by primary key: 51 more index descents
 * and heap fetches. With the text in the row the page is the index range and
 * the rows it already fetched. One connection, 3,000 uncached pages of 50 at
 * 20,000 users, backend CPU per page, three rounds: 157–170 µs before,
 * 90–97 µs with the column; through the server, interleaved rounds, the
 * backends' CPU per page fell from 204–242 to 130–149 µs (bench/README.md before 2 December 2026 (git history),
 * "Issue 20: the uncached page on PostgreSQL", `npm run bench` with
 * BENCH_ONLY=uncached). A write now renders into the row it writes instead
 * of upserting a second table (what writers pay was not measured).
 *
 * Not an index that carries the text (INCLUDE, for index-only pages): a
 * B-tree entry holds at most about 2.7 kB, and a user with many groups
 * renders longer, so such an index would refuse that user's write.
 *
 * As before, the text is re-rendered only when a field of the User changes,
 * and readers do not trust its presence (`coalesce` with a rendering from
 * the columns, users.repository.ts). Migration 0020's credential trigger
 * ignores the column, as it ignores last_login_at: otherwise every sign-in,
 * which re-renders the user, would empty every instance's credential cache
 * again. Migration 0019's page stamp does not ignore it: the column is what
 * a page shows.
 *
 * SQLite keeps the `user_json` table (its page reads it by primary key in a
 * join, where the lookups cost little); nothing changes there.
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await sql`drop trigger if exists users_json_insert on users`.execute(db)
  await sql`drop trigger if exists users_json_update on users`.execute(db)
  await sql`drop function if exists gatehouse_user_json_write()`.execute(db)
  await renderIntoUsersColumn(db, sql`coalesce((select j.json from user_json j where j.user_id = users.id), gatehouse_user_json(users))`)
  await sql`drop table user_json`.execute(db)
}

/**
 * The column, its trigger and its first values (`fill`, an expression over `users`); also what migration 0028's `down`
 * puts back.
 */
export async function renderIntoUsersColumn (db: Kysely<any>, fill: RawBuilder<unknown>): Promise<void> {
  await sql`alter table users add column user_json text`.execute(db)
  await sql`
    create function gatehouse_user_json_render () returns trigger language plpgsql set search_path from current as $$
    begin
      new.user_json := gatehouse_user_json(new);
      return new;
    end
    $$`.execute(db)
  // Before the backfill, so that filling the column sends no NOTIFY per user.
  await recreateCredentialTrigger(db, ['failed_logins', 'locked_until', 'last_login_at', 'user_json'])
  await sql`update users set user_json = ${fill}`.execute(db)
  await sql`
    create trigger users_json_render before insert or update of ${sql.join(USER_FIELDS.map(field => sql.id(field)))} on users
    for each row execute function gatehouse_user_json_render()`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await recreateCredentialTrigger(db, ['failed_logins', 'locked_until', 'last_login_at'])
  await sql`drop trigger if exists users_json_render on users`.execute(db)
  await sql`drop function if exists gatehouse_user_json_render()`.execute(db)
  await sql`create table user_json (user_id uuid primary key references users (id) on delete cascade, json text not null)`.execute(db)
  await sql`insert into user_json (user_id, json) select u.id, coalesce(u.user_json, gatehouse_user_json(u)) from users u`.execute(db)
  await sql`alter table users drop column user_json`.execute(db)
  await sql`create function gatehouse_user_json_write () returns trigger language plpgsql as $$
      begin
        insert into user_json (user_id, json) values (new.id, gatehouse_user_json(new))
          on conflict (user_id) do update set json = excluded.json;
        return null;
      end
    $$`.execute(db)
  await sql`create trigger users_json_insert after insert on users for each row execute function gatehouse_user_json_write()`.execute(db)
  await sql`create trigger users_json_update after update of ${sql.join(USER_FIELDS.map(field => sql.id(field)))} on users for each row execute function gatehouse_user_json_write()`.execute(db)
}

/** Migration 0020's trigger, with these columns ignored. */
export async function recreateCredentialTrigger (db: Kysely<any>, ignored: string[]): Promise<void> {
  await sql`drop trigger if exists users_credentials_changed_update on users`.execute(db)
  const strip = sql.join(ignored.map(column => sql`- ${sql.lit(column)}`), sql` `)
  await sql`
    create trigger users_credentials_changed_update after update on users
    for each row when ((to_jsonb(old) ${strip}) is distinct from (to_jsonb(new) ${strip}))
    execute function gatehouse_credentials_changed()`.execute(db)
}
