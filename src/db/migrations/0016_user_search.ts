import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * Substring search (`q=` on the users list) by trigram index, and the
 * filters of that list by index (issue 20), among a million users.
 *
 * The search itself stays what it was: a case-insensitive `LIKE '%…%'` over
 * username_key, email_key, lower(first_name) and lower(last_name). The
 * indexes only find the candidates faster (users.repository.ts).
 *
 * PostgreSQL: `pg_trgm` GIN indexes on the four expressions, which answer
 * `LIKE '%…%'` directly (and recheck every candidate). The extension is
 * created in `public` when missing, so that it outlives any one deployment's
 * schema (a schema dropped with CASCADE would take an extension made in it,
 * and every other schema's trigram index with it). A role that may not
 * create it (CREATE on the database is needed since PostgreSQL 13, where
 * pg_trgm is a trusted extension; superuser before) or a server without the
 * contrib package leaves the search as it was, a scan: the migration still
 * succeeds, and `CREATE EXTENSION pg_trgm` by an administrator followed by
 * the statements below (docs/operations.md) adds the indexes later.
 *
 * SQLite: an FTS5 table with the trigram tokenizer (SQLite >= 3.34; the
 * better-sqlite3 builds bundle newer) over the same four columns, an
 * external-content table keyed on the users' rowid and kept in step by
 * triggers. Its tokenizer folds case, which only widens the candidates; the
 * LIKE decides. Users have no INTEGER PRIMARY KEY, so a VACUUM may renumber
 * their rowids: after one, `INSERT INTO users_search(users_search)
 * VALUES('rebuild')` makes the index again (gatehouse never vacuums).
 *
 * Both: `role` with each sort key, so that `role=` walks the rows in page
 * order instead of sorting every admin or user.
 */
export async function up (db: Kysely<any>): Promise<void> {
  for (const [column, name] of [['created_at', 'created'], ['updated_at', 'updated'], ['username_key', 'username']] as const) {
    await db.schema.createIndex(`users_role_${name}_idx`).on('users').columns(['role', column, 'id']).execute()
  }
  if (isPostgres(db)) {
    const trgm = await trigramSchema(db)
    if (trgm === undefined) return
    for (const [name, expression] of SEARCHED_PG) {
      // fastupdate off: new rows go into the index at once, not into a pending list that every
      // search reads through until a vacuum. With it on, 100,000 users inserted after the index
      // made the planner prefer a scan (23 ms against 0.2 ms once vacuumed).
      await sql`create index ${sql.id(`users_search_${name}_trgm`)} on users using gin ((${sql.raw(expression)}) ${sql.id(trgm)}.gin_trgm_ops) with (fastupdate = off)`.execute(db)
    }
    return
  }
  await sql`create virtual table users_search using fts5(
    username_key, email_key, first_name, last_name,
    content='users', content_rowid='rowid', tokenize='trigram')`.execute(db)
  await sql`insert into users_search(users_search) values ('rebuild')`.execute(db)
  await sql`create trigger users_search_insert after insert on users begin
    insert into users_search(rowid, username_key, email_key, first_name, last_name)
      values (new.rowid, new.username_key, new.email_key, new.first_name, new.last_name);
  end`.execute(db)
  await sql`create trigger users_search_delete after delete on users begin
    insert into users_search(users_search, rowid, username_key, email_key, first_name, last_name)
      values ('delete', old.rowid, old.username_key, old.email_key, old.first_name, old.last_name);
  end`.execute(db)
  // Only when a searched column changes: a sign-in updates the row too, and need not touch the index.
  await sql`create trigger users_search_update after update of username_key, email_key, first_name, last_name on users begin
    insert into users_search(users_search, rowid, username_key, email_key, first_name, last_name)
      values ('delete', old.rowid, old.username_key, old.email_key, old.first_name, old.last_name);
    insert into users_search(rowid, username_key, email_key, first_name, last_name)
      values (new.rowid, new.username_key, new.email_key, new.first_name, new.last_name);
  end`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) {
    for (const [name] of SEARCHED_PG) await sql`drop index if exists ${sql.id(`users_search_${name}_trgm`)}`.execute(db)
  } else {
    for (const trigger of ['users_search_insert', 'users_search_delete', 'users_search_update']) await sql`drop trigger if exists ${sql.id(trigger)}`.execute(db)
    await sql`drop table if exists users_search`.execute(db)
  }
  for (const name of ['created', 'updated', 'username']) await db.schema.dropIndex(`users_role_${name}_idx`).ifExists().execute()
}

/** The expressions the search compares, exactly as users.repository.ts writes them. */
const SEARCHED_PG = [
  ['username', 'username_key'],
  ['email', 'email_key'],
  ['first_name', 'lower(first_name)'],
  ['last_name', 'lower(last_name)']
] as const

/**
 * The schema pg_trgm is installed in, creating it in `public` when it is
 * missing; undefined when it cannot be had. The migration runs in a
 * transaction, so a refused CREATE EXTENSION is undone to a savepoint.
 */
async function trigramSchema (db: Kysely<any>): Promise<string | undefined> {
  const installed = async (): Promise<string | undefined> => (await sql<{ schema: string }>`
    select n.nspname as schema from pg_extension e join pg_namespace n on n.oid = e.extnamespace where e.extname = 'pg_trgm'`.execute(db)).rows[0]?.schema
  const found = await installed()
  if (found !== undefined) return found
  await sql`savepoint gatehouse_pg_trgm`.execute(db)
  try {
    await sql`create extension if not exists pg_trgm schema public`.execute(db)
  } catch {
    await sql`rollback to savepoint gatehouse_pg_trgm`.execute(db)
    return undefined
  }
  await sql`release savepoint gatehouse_pg_trgm`.execute(db)
  return await installed()
}
