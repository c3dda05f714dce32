import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * PostgreSQL: the change stamp of the users list pages (issue 20), a counter
 * that moves only with commits that can change a page, in place of
 * `pg_current_snapshot()`, which moves with a commit in any database of the
 * cluster: on a shared server (20 commits/s elsewhere) the page cache then
 * rarely hit, and the repeated page fell from 5,300–6,300 to 2,200–2,300
 * req/s.
 *
 * What a page reads: `users` (every column but the sign-in bookkeeping,
 * `failed_logins` and `locked_until`, and `password_hash`, none of which a
 * page shows), and for `group=` `group_members` and `groups`. Every
 * transaction that inserts, deletes or changes such a row adds 1 to
 * `users_page_stamp`, whoever runs it (any instance, the CLI, SQL by hand):
 * the triggers are on the tables, not in gatehouse's code. TRUNCATE, which
 * fires no row triggers, bumps by a statement trigger. The update trigger
 * leaves out the columns above by name, so a column added later moves the
 * stamp until someone decides it need not.
 *
 * Why the stamp is exact (users.repository.ts `readChangeStamp` reads
 * `sum(n)` in one statement, so in one snapshot):
 * - A bump is an UPDATE of a row, in the transaction that wrote the users:
 *   it becomes visible exactly when those writes do, atomically.
 * - Two bumps of the same row never lose one: the second UPDATE waits for
 *   the first transaction's row lock and, under READ COMMITTED, adds to the
 *   committed value. Under REPEATABLE READ or SERIALIZABLE the second fails
 *   with a serialization error (40001) instead, which such clients retry.
 * - So the sum a snapshot sees is the number of page-changing transactions
 *   visible to it, and grows by at least one with each that becomes visible.
 *   Commits in any order, even out of the order they bumped in, each add
 *   their own one: equal sums mean no page-changing commit became visible
 *   in between, which is the rule page-cache.ts needs.
 *
 * Why it costs writers little:
 * - The triggers are DEFERRABLE INITIALLY DEFERRED constraint triggers: the
 *   bump runs at COMMIT, after everything else the transaction does, so its
 *   row lock is the last lock taken (no lock-order cycle with the users and
 *   groups locks) and is held only for the commit itself.
 * - Once per transaction: the first firing records the schema in a
 *   transaction-local setting and the others return at once. A setting set
 *   in a savepoint that rolls back goes back with the bump it records.
 * - 16 rows, the backend's pid picking one, so concurrent writers from
 *   different connections rarely wait for each other's commit flush (with
 *   one row every page-changing commit in the cluster would flush one after
 *   another). Readers sum the 16.
 *
 * Each row's xmin is part of the stamp too: a restore or re-creation of the
 * table gives new xmins, so a sum repeated by a restored, older counter is
 * still a new stamp.
 *
 * The function names the counter through the trigger's schema, so it bumps
 * the right deployment's counter whatever the writer's search_path. It runs
 * with the writer's rights (SECURITY DEFINER would need a pinned search_path,
 * a cost on every row): a role that may write these tables needs UPDATE on
 * `users_page_stamp` too, or its commits fail, loudly, never unseen.
 *
 * SQLite keeps its stamp (`total_changes()` and `data_version`): one writer
 * at a time, and no other database shares the file.
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await sql`create table users_page_stamp (shard smallint primary key, n bigint not null)`.execute(db)
  await sql`insert into users_page_stamp (shard, n) select s, 0 from generate_series(0, ${sql.lit(SHARDS - 1)}) as s`.execute(db)
  await sql`
    create function gatehouse_users_page_changed() returns trigger language plpgsql as $$
    begin
      if current_setting('gatehouse.users_page_stamp_bumped', true) = tg_table_schema then
        return null;
      end if;
      execute format('update %I.users_page_stamp set n = n + 1 where shard = $1', tg_table_schema)
        using (pg_backend_pid() % ${sql.raw(String(SHARDS))})::smallint;
      perform set_config('gatehouse.users_page_stamp_bumped', tg_table_schema, true);
      return null;
    end
    $$`.execute(db)
  for (const table of WATCHED) {
    const ignored = IGNORED[table] ?? []
    const strip = sql.join(ignored.map(column => sql`- ${sql.lit(column)}`), sql` `)
    await sql`
      create constraint trigger ${sql.id(`${table}_page_changed`)} after insert or delete on ${sql.table(table)}
      deferrable initially deferred for each row execute function gatehouse_users_page_changed()`.execute(db)
    await sql`
      create constraint trigger ${sql.id(`${table}_page_changed_update`)} after update on ${sql.table(table)}
      deferrable initially deferred for each row
      when (${ignored.length > 0 ? sql`(to_jsonb(old) ${strip}) is distinct from (to_jsonb(new) ${strip})` : sql`old is distinct from new`})
      execute function gatehouse_users_page_changed()`.execute(db)
    await sql`
      create trigger ${sql.id(`${table}_page_changed_truncate`)} after truncate on ${sql.table(table)}
      for each statement execute function gatehouse_users_page_changed()`.execute(db)
  }
}

export async function down (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  for (const table of WATCHED) {
    for (const suffix of ['', '_update', '_truncate']) {
      await sql`drop trigger if exists ${sql.id(`${table}_page_changed${suffix}`)} on ${sql.table(table)}`.execute(db)
    }
  }
  await sql`drop function if exists gatehouse_users_page_changed()`.execute(db)
  await sql`drop table if exists users_page_stamp`.execute(db)
}

/**
 * Rows of the counter. pgbench, 20 connections updating one user each per
 * transaction for 8 s (2 cores, load 10–12, 24 November 2026): no trigger
 * 3,050 and 2,130 tps; one row 540 and 320 (each commit waits for the
 * previous one's flush); 16 rows 1,890 and 1,560; 64 rows 1,500 and 1,720,
 * no better. (bench/README.md, `npm run bench:stamp`, has the figures
 * through gatehouse.)
 */
const SHARDS = 16

/** The tables a users page reads (users.repository.ts `pageQuery`). */
const WATCHED = ['users', 'group_members', 'groups'] as const

/** Columns no page shows or filters by: a change to only these leaves the stamp alone (a failed sign-in, a rehash). */
const IGNORED: Partial<Record<typeof WATCHED[number], string[]>> = {
  users: ['failed_logins', 'locked_until', 'password_hash']
}
