import { sql, type Selectable, type SelectQueryBuilder, type Updateable } from 'kysely'
import { isPostgres, toBool, toIso, toStringArray, type Database, type Db, type UsersTable } from '../db/database.ts'
import type { NewEventRow } from '../events/events.repository.ts'
import { queueDeliveriesMany } from '../webhooks/webhooks.outbox.ts'
import type { ListUsersQuery, Sort, User } from './users.schemas.ts'

export type UserRow = Selectable<UsersTable>
export type UserRowUpdate = Updateable<UsersTable>

export interface NewUserRow {
  id: string
  username: string
  username_key: string
  email: string | null
  email_key: string | null
  first_name: string | null
  last_name: string | null
  role: 'admin' | 'user'
  groups: string
  disabled: boolean
  /** Default true (the column's default). */
  password_sign_in?: boolean
  password_hash: string | null
  version: number
  created_at: string
  updated_at: string
  last_login_at: null
  password_changed_at: string | null
  email_verified?: boolean
  invitation_pending?: boolean
  /** What a SCIM client keeps about the user (migration 0013); absent for every other door. */
  external_id?: string | null
  display_name?: string | null
  formatted_name?: string | null
  scim_emails?: string | null
  provisioned_at?: string | null
}

/** One field of the User: the column it is read from, how a stored value becomes the field's, and its value in a row not yet written (the column's default). */
interface UserField<C extends keyof UsersTable, T> { column: C, read: (value: UserRow[C]) => T, unwritten: T }

const iso = (value: Date | string): string => toIso(value)

function field<C extends keyof UsersTable> (column: C): UserField<C, UserRow[C]>
function field<C extends keyof UsersTable, T> (column: C, read: (value: UserRow[C]) => T, unwritten: T): UserField<C, T>
function field<C extends keyof UsersTable, T> (column: C, read?: (value: UserRow[C]) => T, unwritten?: T): UserField<C, T> {
  return { column, read: read ?? (value => value as T), unwritten: (unwritten ?? null) as T }
}

/**
 * The User of the API (users.schemas.ts), field by field in its order, and
 * the column of `users` each is read from: the one place the two meet. Get
 * User, the list's pages, sign-in answers, SCIM's mapping and the console all
 * read users through it, and Fastify serializes the result by the schema.
 * A new field is a nullable column (an additive migration), a property of
 * the schema and a line here; `satisfies` fails the build while a field of
 * the schema has no line, or a line no field.
 */
export const USER_COLUMNS = {
  id: field('id'),
  username: field('username'),
  email: field('email'),
  first_name: field('first_name'),
  last_name: field('last_name'),
  role: field('role'),
  groups: field('groups', toStringArray, []),
  disabled: field('disabled', toBool, false),
  password_sign_in: field('password_sign_in', toBool, true),
  email_verified: field('email_verified', toBool, false),
  invitation_pending: field('invitation_pending', toBool, false),
  created_at: field('created_at', iso, ''),
  updated_at: field('updated_at', iso, ''),
  last_login_at: field('last_login_at', toIso, null),
  password_changed_at: field('password_changed_at', toIso, null)
} satisfies { [F in keyof User]-?: { column: keyof UsersTable, read: (value: never) => User[F], unwritten: User[F] } }

type UserColumn = typeof USER_COLUMNS[keyof typeof USER_COLUMNS]['column']
const USER_FIELDS = Object.keys(USER_COLUMNS) as Array<keyof typeof USER_COLUMNS>

/** The columns a User is made of, and its version (the ETag): never the password hash. */
export const PUBLIC_COLUMNS: ReadonlyArray<UserColumn | 'version'> = [...USER_FIELDS.map(name => USER_COLUMNS[name].column), 'version']
export type PublicUserRow = Pick<UserRow, UserColumn | 'version'>
/** The same columns, qualified, for a query that joins users to another table. */
export const PUBLIC_USER_COLUMNS = PUBLIC_COLUMNS.map(column => `users.${column}` as const)

export async function insertUser (db: Db, row: NewUserRow): Promise<PublicUserRow> {
  return await db.insertInto('users').values(row).returning(PUBLIC_COLUMNS).executeTakeFirstOrThrow()
}

/** Rows per INSERT statement: well under SQLite's and PostgreSQL's limits on bound parameters. */
const INSERT_CHUNK = 500

/** Many users in as few statements as possible (an import); the caller supplies the transaction. */
export async function insertUsers (db: Db, rows: NewUserRow[]): Promise<void> {
  for (let i = 0; i < rows.length; i += INSERT_CHUNK) {
    await db.insertInto('users').values(rows.slice(i, i + INSERT_CHUNK)).execute()
  }
}

/** The events of an import, written with its users, in the same transaction. */
export async function insertEventRows (db: Db, rows: NewEventRow[]): Promise<void> {
  for (let i = 0; i < rows.length; i += INSERT_CHUNK) {
    await db.insertInto('events').values(rows.slice(i, i + INSERT_CHUNK)).execute()
  }
  // Their webhook deliveries, as recordEvent queues them for one event.
  await queueDeliveriesMany(db, rows, rows[0]?.occurred_at ?? new Date().toISOString())
}

/** Which of these case-folded usernames and emails existing users already have. */
export async function findTakenKeys (db: Db, usernameKeys: string[], emailKeys: string[]): Promise<{ usernames: Set<string>, emails: Set<string> }> {
  const usernames = new Set<string>()
  const emails = new Set<string>()
  for (let i = 0; i < usernameKeys.length; i += INSERT_CHUNK) {
    const rows = await db.selectFrom('users').select('username_key').where('username_key', 'in', usernameKeys.slice(i, i + INSERT_CHUNK)).execute()
    for (const row of rows) usernames.add(row.username_key)
  }
  for (let i = 0; i < emailKeys.length; i += INSERT_CHUNK) {
    const rows = await db.selectFrom('users').select('email_key').where('email_key', 'in', emailKeys.slice(i, i + INSERT_CHUNK)).execute()
    for (const row of rows) if (row.email_key !== null) emails.add(row.email_key)
  }
  return { usernames, emails }
}

export async function findUserById (db: Db, id: string, options: { forUpdate?: boolean } = {}): Promise<UserRow | undefined> {
  return await db.selectFrom('users').selectAll().where('id', '=', id)
    .$if(options.forUpdate === true && isPostgres(db), q => q.forUpdate())
    .executeTakeFirst()
}

/**
 * A user's stored password hash, the row locked until the transaction ends on
 * PostgreSQL (SQLite runs one transaction at a time); undefined without the user.
 */
export async function findPasswordHashForUpdate (db: Db, id: string): Promise<{ password_hash: string | null } | undefined> {
  return await db.selectFrom('users').select('password_hash').where('id', '=', id)
    .$if(isPostgres(db), q => q.forUpdate())
    .executeTakeFirst()
}

/** The user an address belongs to (addresses are unique ignoring case). */
export async function findUserByEmail (db: Db, email: string): Promise<UserRow | undefined> {
  return await db.selectFrom('users').selectAll().where('email_key', '=', email.toLowerCase()).executeTakeFirst()
}

export async function findPublicUserById (db: Db, id: string): Promise<PublicUserRow | undefined> {
  return await db.selectFrom('users').select(PUBLIC_COLUMNS).where('id', '=', id).executeTakeFirst()
}

/** Applies a change only if the row is still at `expectedVersion`; undefined when it is not. */
export async function updateUser (db: Db, id: string, expectedVersion: number, changes: UserRowUpdate): Promise<PublicUserRow | undefined> {
  return await db.updateTable('users').set(changes)
    .where('id', '=', id).where('version', '=', expectedVersion)
    .returning(PUBLIC_COLUMNS).executeTakeFirst()
}

/** The users whose SCIM manager (`manager_id`, migration 0017) is this user, by the index on it. */
export async function listReportIds (db: Db, managerId: string): Promise<string[]> {
  const rows = await db.selectFrom('users').select('id').where('manager_id', '=', managerId).orderBy('id').execute()
  return rows.map(row => row.id)
}

export async function deleteUser (db: Db, id: string): Promise<boolean> {
  const result = await db.deleteFrom('users').where('id', '=', id).executeTakeFirst()
  return result.numDeletedRows > 0n
}

/**
 * Locks these users' rows on PostgreSQL, in id order, so that two
 * transactions that each lock several users never wait on each other in a
 * cycle (the group lifecycle locks the members it changes before their
 * group). SQLite runs one write transaction at a time.
 */
export async function lockUserRows (db: Db, ids: readonly string[]): Promise<void> {
  if (!isPostgres(db)) return
  const sorted = [...new Set(ids)].sort()
  for (let i = 0; i < sorted.length; i += INSERT_CHUNK) {
    await db.selectFrom('users').select('id').where('id', 'in', sorted.slice(i, i + INSERT_CHUNK)).orderBy('id').forUpdate().execute()
  }
}

/**
 * Ids of the enabled admins, locked on PostgreSQL (in id order, so lockers
 * never wait on each other in a cycle) so that two requests that each remove a
 * different admin cannot both see the other as the remaining one.
 * SQLite runs one write transaction at a time, which gives the same guarantee.
 */
export async function lockEnabledAdminIds (db: Db): Promise<string[]> {
  const rows = await db.selectFrom('users').select('id')
    .where('role', '=', 'admin').where('disabled', '=', false)
    .orderBy('id')
    .$if(isPostgres(db), q => q.forUpdate())
    .execute()
  return rows.map(r => r.id)
}

const SORT_COLUMNS: Record<Sort, ['created_at' | 'username_key' | 'updated_at', 'asc' | 'desc']> = {
  created_at: ['created_at', 'asc'],
  '-created_at': ['created_at', 'desc'],
  username: ['username_key', 'asc'],
  '-username': ['username_key', 'desc'],
  updated_at: ['updated_at', 'asc'],
  '-updated_at': ['updated_at', 'desc']
}

export type UserFilter = Omit<ListUsersQuery, 'limit' | 'cursor' | 'sort'>

/** One page of users, and the keyset position after its last user. */
export interface UserPage {
  users: User[]
  /** [sort value, id] of the last user on the page, when more users follow. */
  next: [string, string] | undefined
}

type SortColumn = 'created_at' | 'username_key' | 'updated_at'
type Direction = 'asc' | 'desc'

/** A page's row: the User's columns, and the case-folded username a page sorted by it continues from. */
type PageRow = PublicUserRow & { username_key: string }

function pageQuery (db: Db, filter: UserFilter, column: SortColumn, direction: Direction, limit: number, after: [string, string] | undefined, trigrams: boolean) {
  const cmp = direction === 'asc' ? '>' : '<'
  const needle = filter.q?.toLowerCase()
  const pattern = needle !== undefined ? `%${escapeLike(needle)}%` : undefined
  const group = filter.group
  // A group's page walks its memberships in page order (each carries its
  // user's sort keys, migration 0018) and stops once the page is full: at
  // 1,000,000 users, `users.id in (the members)` cost a group of 10,000 a read
  // and sort of all of them on both databases (p50 75-85 ms), and a group of 10
  // a walk of every user on PostgreSQL (p50 1.6 s); `npm run bench:search`.
  // A cross join with the condition in WHERE is an inner join on PostgreSQL,
  // and on SQLite it fixes the memberships (on its left) as the outer loop: as
  // an inner join, SQLite's planner walked every user and probed memberships.
  const [keyColumn, idColumn] = group !== undefined ? [`group_members.${column}`, 'group_members.user_id'] : [`users.${column}`, 'users.id']
  // Typed as both tables in either case: the memberships are only named (by sql.ref) when they are joined.
  const from = group !== undefined
    ? db.selectFrom('group_members').crossJoin('users')
    : db.selectFrom('users') as unknown as SelectQueryBuilder<Database, 'group_members' | 'users', object>
  return from
    .$if(group !== undefined, q => q.where(sql<boolean>`users.id = group_members.user_id and group_members.group_id = (select groups.id from groups where groups.display_name = ${group})`))
    .select([...PUBLIC_USER_COLUMNS, 'users.username_key'])
    // SQLite: candidates from the trigram index first, then the LIKE decides,
    // so the result is exactly what the scan returned (migration 0016).
    .$if(trigrams && needle !== undefined, q => q.where(sql<boolean>`users.rowid in (select users_search.rowid from users_search where users_search match ${ftsPhrase(needle ?? '')})`))
    .$if(pattern !== undefined, q => q.where(eb => eb.or([
      eb(sql`users.username_key`, 'like', sql`${pattern} escape '\\'`),
      eb(sql`users.email_key`, 'like', sql`${pattern} escape '\\'`),
      eb(sql`lower(users.first_name)`, 'like', sql`${pattern} escape '\\'`),
      eb(sql`lower(users.last_name)`, 'like', sql`${pattern} escape '\\'`)
    ])))
    .$if(filter.username !== undefined, q => q.where('users.username_key', '=', filter.username?.toLowerCase() ?? ''))
    .$if(filter.email !== undefined, q => q.where('users.email_key', '=', filter.email?.toLowerCase() ?? ''))
    .$if(filter.role !== undefined, q => q.where('users.role', '=', filter.role ?? 'user'))
    .$if(filter.disabled !== undefined, q => q.where('users.disabled', '=', filter.disabled ?? false))
    // A row-value comparison, not `a > x OR (a = x AND id > y)`: both engines
    // answer it with an index range search; the OR form scans from the start
    // of the index on every page, which made the full list quadratic.
    .$if(after !== undefined, q => q.where(sql<boolean>`(${sql.ref(keyColumn)}, ${sql.ref(idColumn)}) ${sql.raw(cmp)} (${after?.[0]}, ${after?.[1]})`))
    .orderBy(sql.ref(keyColumn), direction)
    .orderBy(sql.ref(idColumn), direction)
    // One more than the page, to know whether another page follows.
    .limit(limit + 1)
}

/** The page's users without the extra one read to know whether another page follows, and the keyset position after them. */
function pageOf (rows: PageRow[], limit: number, column: SortColumn): UserPage {
  if (rows.length <= limit) return { users: rows.map(toUser), next: undefined }
  const kept = rows.slice(0, limit)
  const last = kept[kept.length - 1]!
  return { users: kept.map(toUser), next: [column === 'username_key' ? last.username_key : toIso(last[column]), last.id] }
}

/**
 * Up to this many users matching a search, a page is read from the trigram
 * index's candidates (migration 0016; on PostgreSQL see searchPagePostgres), sorted; beyond, by walking the
 * sort's index and testing each user, which stops after the page is full:
 * at 1,000,000 users, the candidates of a name one user in eight holds took
 * 716 ms p99 to sort, against a few ms to walk.
 */
const TRIGRAM_CANDIDATES_MAX = 2000

/** Whether a search on SQLite should start from the trigram index: its needle has a trigram, and few users hold it. */
async function fewTrigramCandidates (db: Db, q: string | undefined): Promise<boolean> {
  if (q === undefined) return false
  const needle = q.toLowerCase()
  // Trigrams need three characters; a shorter needle is answered by the scan alone.
  if ([...needle].length < 3) return false
  const row = await db.selectFrom(sql<{ rowid: number }>`(select rowid from users_search where users_search match ${ftsPhrase(needle)} limit ${TRIGRAM_CANDIDATES_MAX})`.as('c'))
    .select(sql<number>`count(*)`.as('n')).executeTakeFirst()
  return Number(row?.n ?? 0) < TRIGRAM_CANDIDATES_MAX
}

/**
 * PostgreSQL: a page of a search in one statement, when fewer than
 * TRIGRAM_CANDIDATES_MAX users match it; undefined otherwise (or for a needle
 * too short for a trigram, or one whose trigrams are all common, below), and
 * the page is then planned with the needle as any other (listUsers).
 *
 * The candidates come from pg_trgm's indexes, asked with the needle's
 * selective part only (selectivePart): a bitmap heap scan, which visits the
 * users' rows in heap order and keeps of each only its id, the sort's key and
 * the fields the filters test (step `c`). The whole needle's LIKE and the
 * other filters keep the matches (step `m`, at most TRIGRAM_CANDIDATES_MAX of
 * them); those are sorted by the key they carry, and only the page's users
 * are read again, by primary key. Both steps are
 * MATERIALIZED, so that the planner can neither pick the whole needle's
 * LIKEs, which are indexable too, for the scan, nor walk the sort's index
 * with the LIKE as a filter: by its estimate of the matches (a fixed guess for
 * `LIKE '%…%'`) it once chose that walk for a needle 1,000 users hold,
 * clustered late in the order (`er0999`), 0.7 to 3 s at 1,000,000 users
 * against 8 to 15 ms through the indexes (EXPLAIN ANALYZE, 52 needles, `npm
 * run bench:search`'s seed). `m` counts the matches after the cursor, so a
 * page past the first of a needle thousands hold may come this way too.
 *
 * Before, the matches' ids went back to the server and then the page was
 * those users by primary key, sorted: a second round trip, 1,000 uuids each
 * way, and 1,000 index descents and fetches of rows some 600 bytes wide
 * (3,078 buffers for `q=er0012`, against 266 for the bitmap scan and 204 for
 * the page's 51 rows now). Single requests of `q=er0012` at 1,000,000 users,
 * the two builds alternating on one seeded schema, 200 each: p50 12.5 ms
 * before, 8.9 ms after (load 3.9; at load 10, 24.3 and 17.0 ms); the other
 * shapes unchanged (bench/README.md before 2 December 2026 (git history), "Issue 20: PostgreSQL q=, fourth pass").
 */
async function searchPagePostgres (db: Db, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPage | undefined> {
  if (filter.q === undefined) return undefined
  const needle = filter.q.toLowerCase()
  if ([...needle].length < 3) return undefined
  const part = selectivePart(needle, await trigramFrequencies(db))
  // Every trigram of the needle is common: it is held by thousands of users, so the page is planned with it
  // (walking the sort's index, which stops once the page is full) without reading its candidates first, which
  // for `q=hopper` (one user in eight) took a sequential read of 16,000 users, 25-37 ms at 1,000,000 users
  // (EXPLAIN ANALYZE; the page itself 0.7 ms).
  if (part === undefined) return undefined
  const [column, direction] = SORT_COLUMNS[sort]
  const rows = await searchPageQuery(db, filter, column, direction, limit, after, { part: `%${escapeLike(part)}%`, needle: `%${escapeLike(needle)}%` }).execute()
  // No row: no match at all (the page takes at least one of the matches).
  if (Number(rows[0]?.matches ?? 0) >= TRIGRAM_CANDIDATES_MAX) return undefined
  return pageOf(rows, limit, column)
}

function searchPageQuery (db: Db, filter: UserFilter, column: SortColumn, direction: Direction, limit: number, after: [string, string] | undefined, patterns: { part: string, needle: string }) {
  const cmp = direction === 'asc' ? '>' : '<'
  const group = filter.group
  // The four searched expressions exactly as migration 0016 indexes them.
  const containing = (pattern: string) => sql<boolean>`(username_key like ${pattern} escape '\\' or email_key like ${pattern} escape '\\'
    or lower(first_name) like ${pattern} escape '\\' or lower(last_name) like ${pattern} escape '\\')`
  return db
    .with(wb => wb('c').materialized(), qb => qb.selectFrom('users')
      .select(['id', 'username_key', 'email_key', 'first_name', 'last_name', 'role', 'disabled', sql.ref<string>(column).as('sort_key')])
      .where(containing(patterns.part)))
    .with(wb => wb('m').materialized(), qb => qb.selectFrom('c').select(['id', 'sort_key'])
      .where(containing(patterns.needle))
      .$if(filter.username !== undefined, q => q.where('username_key', '=', filter.username?.toLowerCase() ?? ''))
      .$if(filter.email !== undefined, q => q.where('email_key', '=', filter.email?.toLowerCase() ?? ''))
      .$if(filter.role !== undefined, q => q.where('role', '=', filter.role ?? 'user'))
      .$if(filter.disabled !== undefined, q => q.where('disabled', '=', filter.disabled ?? false))
      // A member's keys in group_members are copies of the user's (migration 0018, by trigger), so ordering a
      // group's matches by the user's own key is the order of a group's page.
      .$if(group !== undefined, q => q.where(sql<boolean>`exists (select 1 from group_members where group_members.user_id = c.id
        and group_members.group_id = (select groups.id from groups where groups.display_name = ${group}))`))
      .$if(after !== undefined, q => q.where(sql<boolean>`(c.sort_key, c.id) ${sql.raw(cmp)} (${after?.[0]}, ${after?.[1]})`))
      .limit(TRIGRAM_CANDIDATES_MAX))
    .selectFrom(qb => qb.selectFrom('m').select(['id', 'sort_key'])
      .orderBy('sort_key', direction).orderBy('id', direction)
      // One more than the page, to know whether another page follows.
      .limit(limit + 1).as('k'))
    .innerJoin('users', 'users.id', 'k.id')
    .select([...PUBLIC_USER_COLUMNS, 'users.username_key', sql<number | string>`(select count(*) from m)`.as('matches')])
    .orderBy('k.sort_key', direction)
    .orderBy('k.id', direction)
}

/**
 * A trigram at least this share of users hold is left out of what the
 * indexes are asked. GIN walks each trigram's posting list up to every
 * candidate of the rarest: at 1,000,000 users, `q=user012345` (`use`, `ser`,
 * `er0` in every user, `r01` in one in ten) cost 45-50 ms in the two indexes
 * that hold it, and its part `012345` (trigrams in 0.4% to 1.3% of users)
 * about 1 ms (EXPLAIN ANALYZE, `npm run bench:search`'s seed).
 */
const COMMON_TRIGRAM = 0.05

/**
 * The part of the needle to ask the trigram indexes with: its longest stretch
 * of characters whose trigrams are all of word characters (pg_trgm splits
 * words elsewhere) and none of them common, by the statistics of migration
 * 0022; the stretch whose trigrams are rarer in sum on a tie. Undefined when
 * the needle has trigrams of word characters and every one is common. The
 * whole needle when it has none, or when no statistics are known. Any part
 * is a substring of the needle, so every user the needle matches holds it:
 * the part only widens the candidates, never loses one.
 */
function selectivePart (needle: string, frequencies: ReadonlyMap<string, number>): string | undefined {
  if (frequencies.size === 0) return needle
  const chars = [...needle]
  let best: { start: number, end: number, sum: number } | undefined
  let start = -1
  let sum = 0
  let common = 0
  for (let i = 0; i + 3 <= chars.length; i++) {
    const trigram = chars.slice(i, i + 3)
    const frequency = frequencies.get(trigram.join('')) ?? 0
    const words = trigram.every(c => WORD_CHARACTER.test(c))
    if (words && frequency >= COMMON_TRIGRAM) common += 1
    if (!words || frequency >= COMMON_TRIGRAM) {
      start = -1
      continue
    }
    if (start === -1) {
      start = i
      sum = 0
    }
    sum += frequency
    const candidate = { start, end: i + 3, sum }
    if (best === undefined || candidate.end - candidate.start > best.end - best.start ||
      (candidate.end - candidate.start === best.end - best.start && candidate.sum < best.sum)) best = candidate
  }
  if (best !== undefined) return chars.slice(best.start, best.end).join('')
  return common > 0 ? undefined : needle
}

const WORD_CHARACTER = /^[\p{L}\p{N}]$/u

/** How long the trigram statistics are used before they are read again: ANALYZE renews them far less often. */
const TRIGRAM_STATISTICS_TTL_MS = 60_000

const trigramStatistics = new WeakMap<Db, { readAt: number, frequencies: Promise<Map<string, number>> }>()

/**
 * The share of users holding each common trigram of the searched fields, as
 * PostgreSQL's last ANALYZE found it (migration 0022's statistics: its most
 * common elements, about a thousand); empty when there are none (no pg_trgm,
 * not yet analyzed, or a role that does not own the table and may not see
 * them). Read once a minute per database handle, not per search.
 */
async function trigramFrequencies (db: Db): Promise<Map<string, number>> {
  const now = Date.now()
  const kept = trigramStatistics.get(db)
  if (kept !== undefined && now - kept.readAt < TRIGRAM_STATISTICS_TTL_MS) return await kept.frequencies
  const frequencies = readTrigramFrequencies(db)
  trigramStatistics.set(db, { readAt: now, frequencies })
  try {
    return await frequencies
  } catch (error) {
    trigramStatistics.delete(db)
    throw error
  }
}

async function readTrigramFrequencies (db: Db): Promise<Map<string, number>> {
  // The view is PostgreSQL 14's; naming it on an older server would fail the search.
  const view = await db.selectNoFrom(sql<boolean>`to_regclass('pg_catalog.pg_stats_ext_exprs') is not null`.as('present')).executeTakeFirst()
  if (view?.present !== true) return new Map()
  const row = await db.selectNoFrom(
    sql<{ trigram: string, frequency: number }[]>`(select coalesce(json_agg(json_build_array(t.trigram, t.frequency)), '[]'::json)
      from pg_stats_ext_exprs s, unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) as t(trigram, frequency)
      where s.statistics_schemaname = current_schema() and s.statistics_name = 'users_search_trigrams' and t.trigram is not null)`.as('pairs')).executeTakeFirst()
  return new Map((row?.pairs ?? []) as unknown as Array<[string, number]>)
}

/**
 * One keyset page: users strictly after `after` = [sort value, id] in the
 * requested order (the id breaks ties, so every user is seen exactly once),
 * read as the User's columns (USER_COLUMNS), and the keyset position after
 * the page. One user more than the page is read, to know whether another
 * page follows.
 */
export async function listUsers (db: Db, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPage> {
  const pg = isPostgres(db)
  if (pg) {
    const searched = await searchPagePostgres(db, filter, sort, limit, after)
    if (searched !== undefined) return searched
  }
  const [column, direction] = SORT_COLUMNS[sort]
  const trigrams = !pg && await fewTrigramCandidates(db, filter.q)
  const rows = await pageQuery(db, filter, column, direction, limit, after, trigrams).execute()
  return pageOf(rows, limit, column)
}

/**
 * A text that changes whenever a write that may change a users page has been
 * committed since it was last read; two equal stamps mean no such write came
 * in between, from this process or any other.
 *
 * SQLite: `total_changes()` counts the rows this connection has inserted,
 * updated or deleted, and `data_version` moves when another connection (the
 * CLI, another process on the same file) commits.
 *
 * PostgreSQL: the sum of `users_page_stamp`, which every committed
 * transaction that changes users, group memberships or groups adds one to,
 * by trigger, whoever runs it, and the rows' xmins (migration 0019 argues
 * why it never misses such a commit). Commits in other databases of the
 * cluster, and to other tables, leave it alone (`pg_current_snapshot()`,
 * the stamp before, moved with every commit in the cluster).
 *
 * Read in a statement of its own, before the page, under READ COMMITTED:
 * the page's statement then has a snapshot at least as new as the stamp's,
 * since a snapshot taken later sees every commit an earlier one saw. A
 * commit in between makes the page newer than its stamp, which costs a miss
 * later and is never served stale: the next stamp read sees that commit too,
 * and differs. Neither one statement nor a REPEATABLE READ transaction is
 * needed for that, and both would cost the list a round trip or a plan.
 */
export async function readChangeStamp (db: Db): Promise<string> {
  if (isPostgres(db)) {
    const row = await db.selectNoFrom(
      sql<string | null>`(select sum(n)::text || ':' || string_agg(xmin::text, ',' order by shard) from users_page_stamp)`.as('stamp')).executeTakeFirst()
    if (row?.stamp == null) throw new Error('users_page_stamp is empty: migration 0019 makes its rows')
    return row.stamp
  }
  const row = await db.selectNoFrom([sql<number>`total_changes()`.as('changes'), sql<number>`(select data_version from pragma_data_version())`.as('version')]).executeTakeFirst()
  if (row === undefined) throw new Error('a select without FROM returned no row')
  return `${row.changes}:${row.version}`
}

/** The needle as one FTS5 phrase: every character literal, quotes doubled. */
function ftsPhrase (value: string): string {
  return `"${value.replaceAll('"', '""')}"`
}

function escapeLike (value: string): string {
  return value.replace(/[\\%_]/g, c => `\\${c}`)
}

/** The sign-in lock state, which is not part of the User resource. */
export async function findSignInState (db: Db, id: string): Promise<{ failed_logins: number, locked_until: Date | string | null } | undefined> {
  return await db.selectFrom('users').select(['failed_logins', 'locked_until']).where('id', '=', id).executeTakeFirst()
}

/**
 * Clears the failure count and the lock, returning what they were; undefined
 * when there was nothing to clear (or no such user), so a repeated reset
 * records nothing.
 */
export async function clearSignInLock (db: Db, id: string): Promise<{ failed_logins: number, locked_until: Date | string | null } | undefined> {
  const before = await db.selectFrom('users').select(['failed_logins', 'locked_until']).where('id', '=', id)
    .$if(isPostgres(db), q => q.forUpdate())
    .executeTakeFirst()
  if (before === undefined || (before.failed_logins === 0 && before.locked_until === null)) return undefined
  await db.updateTable('users').set({ failed_logins: 0, locked_until: null }).where('id', '=', id).execute()
  return before
}

/**
 * A row as the User (USER_COLUMNS). A row not yet written may leave out the
 * columns with defaults: those are what they will be.
 */
export function toUser (row: Partial<Pick<UserRow, UserColumn>>): User {
  const user: Record<string, unknown> = {}
  for (const name of USER_FIELDS) {
    const { column, read, unwritten } = USER_COLUMNS[name] as UserField<UserColumn, unknown>
    const value = row[column]
    user[name] = value === undefined ? unwritten : read(value as never)
  }
  return user as User
}
