import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * Each user's User representation, kept rendered as JSON text in
 * `user_json`, so that a page of the users list is the concatenation of 50
 * stored texts instead of 50 objects built field by field on every read
 * (issue 20: the uncached page; users.repository.ts has the figures).
 *
 * Triggers keep it in step with `users`, whoever writes: the lifecycle, the
 * sign-in bookkeeping, the CLI on the file, a migration, an operator's SQL.
 * A row is rendered again only when one of the User's fields changes (a
 * failed sign-in, which writes `failed_logins`, does not). Readers never trust
 * its presence: a user without a row is rendered from its columns, as before.
 *
 * The text is exactly what Get User answers (JSON.stringify of toUser):
 * fields in the User schema's order, no spaces, timestamps as toISOString().
 * On PostgreSQL the session's TimeZone does not matter (`at time zone 'UTC'`),
 * and `groups` (jsonb, whose text has ", " separators) is written compactly.
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) {
    await sql`create table user_json (user_id uuid primary key references users (id) on delete cascade, json text not null)`.execute(db)
    await createPgUserJsonFunction(db)
    await sql`create function gatehouse_user_json_write () returns trigger language plpgsql as $$
      begin
        insert into user_json (user_id, json) values (new.id, gatehouse_user_json(new))
          on conflict (user_id) do update set json = excluded.json;
        return null;
      end
    $$`.execute(db)
    await sql`create trigger users_json_insert after insert on users for each row execute function gatehouse_user_json_write()`.execute(db)
    await sql`create trigger users_json_update after update of ${sql.join(USER_FIELDS.map(field => sql.id(field)))} on users for each row execute function gatehouse_user_json_write()`.execute(db)
    await sql`insert into user_json (user_id, json) select u.id, gatehouse_user_json(u) from users u`.execute(db)
    return
  }
  await sql`create table user_json (user_id text primary key, json text not null) without rowid`.execute(db)
  await sql`insert into user_json (user_id, json) select id, ${userJsonSqlite('')} from users`.execute(db)
  await createSqliteUserJsonTriggers(db)
}

/** PostgreSQL: the User rendered from a users row; also what migration 0028's `down` puts back. */
export async function createPgUserJsonFunction (db: Kysely<any>): Promise<void> {
  await sql`create function gatehouse_user_json (u users) returns text language sql stable as $$
    select '{"id":"' || u.id::text
      || '","username":' || to_json(u.username)::text
      || ',"email":' || coalesce(to_json(u.email)::text, 'null')
      || ',"first_name":' || coalesce(to_json(u.first_name)::text, 'null')
      || ',"last_name":' || coalesce(to_json(u.last_name)::text, 'null')
      || ',"role":' || to_json(u.role)::text
      || ',"groups":[' || coalesce((select string_agg(to_json(g.value)::text, ',' order by g.ordinality) from jsonb_array_elements_text(u.groups) with ordinality as g), '') || ']'
      || ',"disabled":' || u.disabled::text
      || ',"password_sign_in":' || u.password_sign_in::text
      || ',"email_verified":' || u.email_verified::text
      || ',"invitation_pending":' || u.invitation_pending::text
      || ',"created_at":' || to_json(to_char(u.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))::text
      || ',"updated_at":' || to_json(to_char(u.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))::text
      || ',"last_login_at":' || coalesce(to_json(to_char(u.last_login_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))::text, 'null')
      || ',"password_changed_at":' || coalesce(to_json(to_char(u.password_changed_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))::text, 'null')
      || '}'
  $$`.execute(db)
}

/** SQLite: the triggers that keep `user_json` in step with `users`; also what migration 0024's `down` puts back. */
export async function createSqliteUserJsonTriggers (db: Kysely<any>): Promise<void> {
  // INSERT OR REPLACE: an update also mends a row that is missing.
  await sql`create trigger users_json_insert after insert on users begin
    insert or replace into user_json (user_id, json) values (new.id, ${userJsonSqlite('new.')});
  end`.execute(db)
  await sql`create trigger users_json_update after update of ${sql.join(USER_FIELDS.map(field => sql.id(field)))} on users begin
    insert or replace into user_json (user_id, json) values (new.id, ${userJsonSqlite('new.')});
  end`.execute(db)
  await sql`create trigger users_json_delete after delete on users begin
    delete from user_json where user_id = old.id;
  end`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) {
    await sql`drop trigger if exists users_json_insert on users`.execute(db)
    await sql`drop trigger if exists users_json_update on users`.execute(db)
    await sql`drop function if exists gatehouse_user_json_write()`.execute(db)
    await sql`drop function if exists gatehouse_user_json(users)`.execute(db)
  } else {
    for (const trigger of ['users_json_insert', 'users_json_update', 'users_json_delete']) await sql`drop trigger if exists ${sql.id(trigger)}`.execute(db)
  }
  await sql`drop table if exists user_json`.execute(db)
}

/** The columns a User is rendered from (users.repository.ts PUBLIC_COLUMNS, without `version`, which the User does not show); migrations 0023 and 0024 keep their triggers on the same list. */
export const USER_FIELDS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'password_sign_in',
  'email_verified', 'invitation_pending', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'
]

/** The User as SQLite's JSON functions render it (the same text as users.repository.ts USER_JSON_SQLITE; migration 0024 renders with it too); `@` stands for the columns' prefix. */
const USER_JSON_SQLITE = `json_object(
  'id', @id, 'username', @username, 'email', @email, 'first_name', @first_name, 'last_name', @last_name,
  'role', @role, 'groups', json(@groups), 'disabled', json(case when @disabled then 'true' else 'false' end),
  'password_sign_in', json(case when @password_sign_in then 'true' else 'false' end),
  'email_verified', json(case when @email_verified then 'true' else 'false' end),
  'invitation_pending', json(case when @invitation_pending then 'true' else 'false' end),
  'created_at', @created_at, 'updated_at', @updated_at, 'last_login_at', @last_login_at,
  'password_changed_at', @password_changed_at)`

export function userJsonSqlite (prefix: '' | 'new.' | 'users.'): ReturnType<typeof sql.raw> {
  return sql.raw(USER_JSON_SQLITE.replaceAll('@', prefix))
}
