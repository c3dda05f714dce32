import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * PostgreSQL: every change that can end or narrow a credential (a key revoked,
 * rotated, deleted or re-scoped; a session ended; a user disabled, deleted,
 * renamed or given another role) sends NOTIFY gatehouse_credentials with the
 * table's schema, on commit, whoever made it (another instance, the CLI, SQL
 * by hand). Each instance listens and empties its credential cache
 * (auth/credential-cache.ts). Updates that only record use (last_used_at,
 * last_seen_at) or sign-in bookkeeping (failed_logins, locked_until) do not
 * notify: they happen on ordinary requests and change no answer.
 * SQLite has no cross-process notice; there the cache is kept per process
 * (see the cache's own notes).
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await sql`
    create function gatehouse_credentials_changed() returns trigger language plpgsql as $$
    begin
      perform pg_notify('gatehouse_credentials', tg_table_schema);
      return null;
    end
    $$`.execute(db)
  const watched: Array<[string, string[]]> = [
    ['api_keys', ['last_used_at']],
    ['sessions', ['last_seen_at']],
    ['users', ['failed_logins', 'locked_until']]
  ]
  for (const [table, ignored] of watched) {
    const strip = sql.join(ignored.map(column => sql`- ${sql.lit(column)}`), sql` `)
    await sql`
      create trigger ${sql.id(`${table}_credentials_changed_update`)} after update on ${sql.table(table)}
      for each row when ((to_jsonb(old) ${strip}) is distinct from (to_jsonb(new) ${strip}))
      execute function gatehouse_credentials_changed()`.execute(db)
    await sql`
      create trigger ${sql.id(`${table}_credentials_changed_delete`)} after delete on ${sql.table(table)}
      for each row execute function gatehouse_credentials_changed()`.execute(db)
  }
}

export async function down (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  for (const table of ['api_keys', 'sessions', 'users']) {
    await sql`drop trigger if exists ${sql.id(`${table}_credentials_changed_update`)} on ${sql.table(table)}`.execute(db)
    await sql`drop trigger if exists ${sql.id(`${table}_credentials_changed_delete`)} on ${sql.table(table)}`.execute(db)
  }
  await sql`drop function if exists gatehouse_credentials_changed()`.execute(db)
}
