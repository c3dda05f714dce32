import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * PostgreSQL: how common each trigram of the searched fields is, kept by
 * ANALYZE (and so by autovacuum), at no cost to any write.
 *
 * A search asks pg_trgm's GIN indexes (migration 0016) for the users that
 * hold every trigram of its needle, and GIN walks the posting list of each
 * one up to every candidate. A trigram nearly every user holds (`use`, `ser`,
 * `exa`, `com`, a company's domain) costs a walk of a million items per index
 * and narrows nothing. users.repository.ts (`selectivePart`) reads these
 * statistics and asks the indexes for only the needle's longest stretch of
 * uncommon trigrams; the whole needle's LIKE still decides.
 *
 * One expression statistics object over the four fields as one text, so a
 * trigram's frequency is the share of users who hold it in any of them (at
 * least its share in each index). `pg_stats_ext_exprs` shows it only to the
 * table's owner (the role that migrates); another role sees none, and the
 * search then asks with the whole needle, as before.
 *
 * Without pg_trgm (migration 0016 could not have it) there is nothing to
 * gather for; before PostgreSQL 14 there are no statistics on expressions. SQLite: nothing (FTS5 reads a trigram's list only up to the
 * candidates it needs; bench/README.md).
 */
export async function up (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  const trgm = (await sql<{ schema: string }>`
    select n.nspname as schema from pg_extension e join pg_namespace n on n.oid = e.extnamespace where e.extname = 'pg_trgm'`.execute(db)).rows[0]?.schema
  if (trgm === undefined) return
  // Statistics on an expression came with PostgreSQL 14; before it the search asks with the whole needle, as before.
  const version = (await sql<{ version: number }>`select current_setting('server_version_num')::int as version`.execute(db)).rows[0]?.version ?? 0
  if (version < 140000) return
  await sql`create statistics users_search_trigrams on (${sql.id(trgm)}.show_trgm(${SEARCH_TEXT})) from users`.execute(db)
  // Gathered now rather than at autovacuum's next analyze, which a table that changes little may not see for a long time.
  await sql`analyze users`.execute(db)
}

export async function down (db: Kysely<any>): Promise<void> {
  if (isPostgres(db)) await sql`drop statistics if exists users_search_trigrams`.execute(db)
}

/** The four searched fields as one text, separated by a space (which pg_trgm treats as a word boundary). */
const SEARCH_TEXT = sql`username_key || ' ' || coalesce(email_key, '') || ' ' || coalesce(lower(first_name), '') || ' ' || coalesce(lower(last_name), '')`
