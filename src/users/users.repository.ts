import { sql, type RawBuilder, type Selectable, type SelectQueryBuilder, type Updateable } from 'kysely'
import { isPostgres, toBool, toIso, toStringArray, type Database, type Db, type UsersTable } from '../db/database.ts'
import { executePrepared } from '../db/prepared.ts'
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

/** The columns a User is made of: never the password hash. */
export const PUBLIC_COLUMNS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'password_sign_in',
  'email_verified', 'invitation_pending', 'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'
] as const
export type PublicUserRow = Pick<UserRow, typeof PUBLIC_COLUMNS[number]>
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

/** A page's JSON text: a string (PostgreSQL) or its UTF-8 bytes (SQLite), sent as it is either way. */
export type PageText = string | Buffer

/** The text of a page, for the few readers that parse it (the console). */
export function pageString (json: PageText): string {
  return typeof json === 'string' ? json : json.toString('utf8')
}

/** One page of users already rendered as a JSON array, and the keyset position after its last user. */
export interface UserPageJson {
  json: PageText
  /** [sort value, id] of the last user on the page, when more users follow. */
  next: [string, string] | undefined
}

interface PageShape {
  column: 'created_at' | 'username_key' | 'updated_at'
  direction: 'asc' | 'desc'
  shape: string
  values: Record<string, unknown>
  /** Builds the page query: parameters named, so the statement text is built once per shape (executePrepared). */
  page: (db: Db, param: (name: string) => any) => ReturnType<typeof pageQuery>
}

function pageQuery (db: Db, param: (name: string) => any, has: Record<string, boolean>, column: PageShape['column'], direction: PageShape['direction'], fixedLimit: number | undefined) {
  const cmp = direction === 'asc' ? '>' : '<'
  // A group's page walks its memberships in page order (each carries its
  // user's sort keys, migration 0018) and stops once the page is full: at
  // 1,000,000 users, `users.id in (the members)` cost a group of 10,000 a read
  // and sort of all of them on both databases (p50 75-85 ms), and a group of 10
  // a walk of every user on PostgreSQL (p50 1.6 s); `npm run bench:search`.
  // A cross join with the condition in WHERE is an inner join on PostgreSQL,
  // and on SQLite it fixes the memberships (on its left) as the outer loop: as
  // an inner join, SQLite's planner walked every user and probed memberships.
  const [keyColumn, idColumn] = has.group === true ? [`group_members.${column}`, 'group_members.user_id'] : [`users.${column}`, 'users.id']
  // Typed as both tables in either case: the memberships are only named (by sql.ref) when they are joined.
  const from = has.group === true
    ? db.selectFrom('group_members').crossJoin('users')
    : db.selectFrom('users') as unknown as SelectQueryBuilder<Database, 'group_members' | 'users', object>
  return from
    .$if(has.group === true, q => q.where(sql<boolean>`users.id = group_members.user_id and group_members.group_id = (select groups.id from groups where groups.display_name = ${param('group')})`))
    .select([sql.ref<string>('users.id').as('id'), sql.ref<string>(`users.${column}`).as(column)])
    // The User as stored by triggers in the row itself (migrations 0023 and 0024; on SQLite the index of the default
    // order carries it too, so that page reads no users row); rendered here from the columns should a user have no
    // stored text. Only evaluated for the rows of the page (PostgreSQL projects after the LIMIT; SQLite's coalesce
    // stops at the first value, and seeks the users row only when it reads a column the index lacks).
    .select(isPostgres(db)
      ? sql<string>`coalesce(users.user_json, gatehouse_user_json(users))`.as('user_json')
      : sql<string>`coalesce(users.user_json, ${USER_JSON_SQLITE})`.as('user_json'))
    // SQLite: candidates from the trigram index first, then the LIKE decides,
    // so the result is exactly what the scan returned (migration 0016).
    .$if(has.trigrams === true, q => q.where(sql<boolean>`users.rowid in (select users_search.rowid from users_search where users_search match ${param('phrase')})`))
    .$if(has.q === true, q => q.where(eb => eb.or([
      eb(sql`users.username_key`, 'like', sql`${param('needle')} escape '\\'`),
      eb(sql`users.email_key`, 'like', sql`${param('needle')} escape '\\'`),
      eb(sql`lower(users.first_name)`, 'like', sql`${param('needle')} escape '\\'`),
      eb(sql`lower(users.last_name)`, 'like', sql`${param('needle')} escape '\\'`)
    ])))
    .$if(has.username === true, q => q.where('users.username_key', '=', param('username_key')))
    .$if(has.email === true, q => q.where('users.email_key', '=', param('email_key')))
    .$if(has.role === true, q => q.where('users.role', '=', param('role')))
    .$if(has.disabled === true, q => q.where('users.disabled', '=', param('disabled')))
    // A row-value comparison, not `a > x OR (a = x AND id > y)`: both engines
    // answer it with an index range search; the OR form scans from the start
    // of the index on every page, which made the full list quadratic.
    .$if(has.after === true, q => q.where(sql<boolean>`(${sql.ref(keyColumn)}, ${sql.ref(idColumn)}) ${sql.raw(cmp)} (${param('after_key')}, ${param('after_id')})`))
    .orderBy(sql.ref(keyColumn), direction)
    .orderBy(sql.ref(idColumn), direction)
    // One more than the page, to know whether another page follows.
    .limit(fixedLimit !== undefined ? sql.lit(fixedLimit) : param('limit_plus_one'))
}

/**
 * Page sizes written into the statement's text rather than bound. PostgreSQL
 * plans a named statement once for all values only when that plan looks no
 * dearer than planning for each, and with `LIMIT $n` it assumes a tenth of the
 * table: so every page was planned anew, 0.3 ms of its backend's CPU. With the
 * limit in the text the plan is made once. Measured on one connection, 3,000
 * uncached pages of 50 (20,000 users, CPU of the backend per page, three
 * rounds): 377–443 µs bound, 183–207 µs written. Only these sizes, so that
 * the statements each connection keeps stay few; any other size is bound.
 */
const FIXED_LIMITS = new Set([1, 10, 20, 25, 50, 100, 200, 250, 500, 1000])
/** A page's filters and keyset position as both page statements (pageQuery, searchPageQuery) bind them, and what each statement's shape has. */
function pageBindings (filter: UserFilter, limit: number, after: [string, string] | undefined) {
  return {
    fixedLimit: FIXED_LIMITS.has(limit) ? limit + 1 : undefined,
    has: {
      username: filter.username !== undefined,
      email: filter.email !== undefined,
      role: filter.role !== undefined,
      disabled: filter.disabled !== undefined,
      group: filter.group !== undefined,
      after: after !== undefined
    },
    values: {
      username_key: filter.username?.toLowerCase(),
      email_key: filter.email?.toLowerCase(),
      role: filter.role,
      disabled: filter.disabled,
      group: filter.group,
      after_key: after?.[0],
      after_id: after?.[1],
      limit_plus_one: limit + 1
    }
  }
}

/** A statement's name: what it has, so each combination is prepared once. */
function shapeName (prefix: string, sort: Sort, has: Record<string, boolean>, fixedLimit: number | undefined): string {
  return `${prefix}:${sort}:${Object.entries(has).filter(([, present]) => present).map(([name]) => name).join(',')}:${fixedLimit ?? 'limit'}`
}

function pageShape (filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined, trigrams = false): PageShape {
  const bindings = pageBindings(filter, limit, after)
  const { fixedLimit } = bindings
  const [column, direction] = SORT_COLUMNS[sort]
  const needle = filter.q?.toLowerCase()
  const has = { q: needle !== undefined, trigrams, ...bindings.has }
  return {
    column,
    direction,
    shape: shapeName('users_page', sort, has, fixedLimit),
    values: {
      needle: needle !== undefined ? `%${escapeLike(needle)}%` : undefined,
      phrase: needle !== undefined ? ftsPhrase(needle) : undefined,
      ...bindings.values
    },
    page: (db, param) => pageQuery(db, param, has, column, direction, fixedLimit)
  }
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
  const [row] = await executePrepared(db, 'users_search_candidates', param =>
    db.selectFrom(sql<{ rowid: number }>`(select rowid from users_search where users_search match ${param('phrase')} limit ${param('max')})`.as('c'))
      .select(sql<number>`count(*)`.as('n')), { phrase: ftsPhrase(needle), max: TRIGRAM_CANDIDATES_MAX })
  return Number(row?.n ?? 0) < TRIGRAM_CANDIDATES_MAX
}

/**
 * PostgreSQL: a page of a search in one statement, when fewer than
 * TRIGRAM_CANDIDATES_MAX users match it; undefined otherwise (or for a needle
 * too short for a trigram, or one whose trigrams are all common, below), and
 * the page is then planned with the needle as any other (listUsersJson).
 *
 * The candidates come from pg_trgm's indexes, asked with the needle's
 * selective part only (selectivePart): a bitmap heap scan, which visits the
 * users' rows in heap order and keeps of each only its id, the sort's key and
 * the fields the filters test (step `c`). The whole needle's LIKE and the
 * other filters keep the matches (step `m`, at most TRIGRAM_CANDIDATES_MAX of
 * them); those are sorted by the key they carry, and only the page's users
 * are read again, by primary key, for their stored JSON. Both steps are
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
 * shapes unchanged (bench/README.md, "Issue 20: PostgreSQL q=, fourth pass").
 */
async function searchPagePostgres (db: Db, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPageJson | undefined> {
  if (filter.q === undefined) return undefined
  const needle = filter.q.toLowerCase()
  if ([...needle].length < 3) return undefined
  const part = selectivePart(needle, await trigramFrequencies(db))
  // Every trigram of the needle is common: it is held by thousands of users, so the page is planned with it
  // (walking the sort's index, which stops once the page is full) without reading its candidates first, which
  // for `q=hopper` (one user in eight) took a sequential read of 16,000 users, 25-37 ms at 1,000,000 users
  // (EXPLAIN ANALYZE; the page itself 0.7 ms).
  if (part === undefined) return undefined
  const { fixedLimit, has, values } = pageBindings(filter, limit, after)
  const [column, direction] = SORT_COLUMNS[sort]
  const [row] = await executePrepared(db, shapeName('users_search_page', sort, has, fixedLimit), param => searchPageQuery(db, param, has, column, direction, fixedLimit), {
    part: `%${escapeLike(part)}%`,
    needle: `%${escapeLike(needle)}%`,
    max: TRIGRAM_CANDIDATES_MAX,
    ...values
  }, { serverPrepared: false })
  if (row === undefined) throw new Error('an aggregate query returned no row')
  if (Number(row.matches) >= TRIGRAM_CANDIDATES_MAX) return undefined
  return cutPage(row.json ?? '[]', Number(row.n), limit, column)
}

function searchPageQuery (db: Db, param: (name: string) => any, has: Record<string, boolean>, column: PageShape['column'], direction: PageShape['direction'], fixedLimit: number | undefined) {
  const cmp = direction === 'asc' ? '>' : '<'
  // The four searched expressions exactly as migration 0016 indexes them.
  const containing = (pattern: unknown) => sql<boolean>`(username_key like ${pattern} escape '\\' or email_key like ${pattern} escape '\\'
    or lower(first_name) like ${pattern} escape '\\' or lower(last_name) like ${pattern} escape '\\')`
  return db
    .with(wb => wb('c').materialized(), qb => qb.selectFrom('users')
      .select(['id', 'username_key', 'email_key', 'first_name', 'last_name', 'role', 'disabled', sql.ref<string>(column).as('sort_key')])
      .where(containing(param('part'))))
    .with(wb => wb('m').materialized(), qb => qb.selectFrom('c').select(['id', 'sort_key'])
      .where(containing(param('needle')))
      .$if(has.username === true, q => q.where('username_key', '=', param('username_key')))
      .$if(has.email === true, q => q.where('email_key', '=', param('email_key')))
      .$if(has.role === true, q => q.where('role', '=', param('role')))
      .$if(has.disabled === true, q => q.where('disabled', '=', param('disabled')))
      // A member's keys in group_members are copies of the user's (migration 0018, by trigger), so ordering a
      // group's matches by the user's own key is the order of a group's page.
      .$if(has.group === true, q => q.where(sql<boolean>`exists (select 1 from group_members where group_members.user_id = c.id
        and group_members.group_id = (select groups.id from groups where groups.display_name = ${param('group')}))`))
      .$if(has.after === true, q => q.where(sql<boolean>`(c.sort_key, c.id) ${sql.raw(cmp)} (${param('after_key')}, ${param('after_id')})`))
      .limit(param('max')))
    .selectFrom(qb => qb.selectFrom('m').select(['id', 'sort_key'])
      .orderBy('sort_key', direction).orderBy('id', direction)
      // One more than the page, to know whether another page follows.
      .limit(fixedLimit !== undefined ? sql.lit(fixedLimit) : param('limit_plus_one')).as('k'))
    .innerJoin('users', 'users.id', 'k.id')
    .select([
      sql<number | string>`(select count(*) from m)`.as('matches'),
      sql<string | null>`'[' || string_agg(coalesce(users.user_json, gatehouse_user_json(users)), ',' order by k.sort_key ${sql.raw(direction)}, k.id ${sql.raw(direction)}) || ']'`.as('json'),
      sql<number | string>`count(*)`.as('n')
    ])
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
  const [view] = await executePrepared(db, 'users_search_trigram_statistics_view', () =>
    db.selectNoFrom(sql<boolean>`to_regclass('pg_catalog.pg_stats_ext_exprs') is not null`.as('present')), {})
  if (view?.present !== true) return new Map()
  const [row] = await executePrepared(db, 'users_search_trigram_statistics', () => db.selectNoFrom(
    sql<{ trigram: string, frequency: number }[]>`(select coalesce(json_agg(json_build_array(t.trigram, t.frequency)), '[]'::json)
      from pg_stats_ext_exprs s, unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) as t(trigram, frequency)
      where s.statistics_schemaname = current_schema() and s.statistics_name = 'users_search_trigrams' and t.trigram is not null)`.as('pairs')), {})
  return new Map((row?.pairs ?? []) as unknown as Array<[string, number]>)
}

/**
 * One keyset page, already rendered as a JSON array in the User shape, and the
 * keyset position after it: users strictly after `after` = [sort value, id] in
 * the requested order (the id breaks ties, so every user is seen exactly once).
 *
 * The database concatenates each user's stored rendering (`users.user_json`,
 * migrations 0021, 0023 and 0024), so no row of the page is decoded or
 * serialized here. Issue 20, uncached pages of 50 on 100,000 users: on SQLite
 * the query cost 96–133 µs of CPU with each user built by `json_object` on
 * every read and 50–72 µs with the stored texts (same process, interleaved
 * rounds); since 0024 the default order's page is one range of the index
 * that carries the text (39–44 µs against 58–68 at 20,000 users); on PostgreSQL the
 * rows (17 columns each) cost the server 330–450 µs to decode, map and
 * serialize per page, against one text column now (`npm run bench`,
 * bench/README.md has the in-server figures).
 *
 * One user more than the page is read, to know whether another page follows;
 * it is cut from the text below.
 */
export async function listUsersJson (db: Db, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPageJson> {
  const pg = isPostgres(db)
  if (pg) {
    const searched = await searchPagePostgres(db, filter, sort, limit, after)
    if (searched !== undefined) return searched
  }
  const { column, direction, shape, values, page } = pg
    ? pageShape(filter, sort, limit, after)
    : pageShape(filter, sort, limit, after, await fewTrigramCandidates(db, filter.q))
  // SQLite aggregates a FROM subquery with ORDER BY and LIMIT in the
  // subquery's order (it runs it as a co-routine and cannot flatten it into
  // an aggregate); PostgreSQL is told the order.
  // SQLite hands the page over as its UTF-8 bytes (a blob), which go out as
  // they are: as a string it was decoded here, then measured (Buffer.byteLength,
  // for Content-Length) and encoded again for the socket, some 20 µs a page of
  // 50 (measured beside it: bench/README.md, "Issue 20: the request pipeline").
  const joined: RawBuilder<PageText | null> = pg
    ? sql<string | null>`'[' || string_agg(p.user_json, ',' order by ${sql.ref(`p.${column}`)} ${sql.raw(direction)}, p.id ${sql.raw(direction)}) || ']'`
    : sql<Buffer | null>`cast('[' || group_concat(p.user_json, ',') || ']' as blob)`
  // A search is planned with its needle on PostgreSQL, so that pg_trgm's indexes are used when the needle is rare
  // (db/prepared.ts). A role's page too: the generic plan takes `role = $1` for half the users (two values) and
  // walked users_username_key_unique filtering on the role for `role=admin&sort=username`, 50,949 rows for a page
  // (53 ms), where planned with the role it is a range of users_role_username_idx (0.3 ms, planning 0.4 ms; EXPLAIN
  // ANALYZE at 1,000,000 users, `npm run bench:search`'s seed, where this shape had p50 17.7 ms once the bench's
  // requests missed the page cache).
  const [row] = await executePrepared(db, shape, param =>
    db.selectFrom(page(db, param).as('p')).select([joined.as('json'), sql<number | string>`count(*)`.as('n')]), values,
  { serverPrepared: filter.q === undefined && filter.role === undefined })
  if (row === undefined) throw new Error('an aggregate query returned no row')
  return cutPage(row.json ?? '[]', Number(row.n), limit, column)
}

/** The page without the extra user read to know whether another page follows, and the keyset position after it. */
function cutPage (json: PageText, n: number, limit: number, column: PageShape['column']): UserPageJson {
  if (n <= limit) return { json, next: undefined }
  // Each element starts with ELEMENT_START, which cannot occur inside one: quotes in strings are escaped.
  // Both ends are found in the text as read: searching the cut text instead flattened it, a copy of the whole page.
  const cut = json.lastIndexOf(ELEMENT_START)
  const lastStart = json.lastIndexOf(ELEMENT_START, cut - 1)
  const from = lastStart === -1 ? 1 : lastStart + 1
  let trimmed: PageText
  let lastText: string
  if (typeof json === 'string') {
    trimmed = json.slice(0, cut) + ']'
    lastText = json.slice(from, cut)
  } else {
    // The blob is this read's own copy: the comma before the extra user becomes the closing bracket, nothing is copied.
    lastText = json.toString('utf8', from, cut)
    json[cut] = CLOSING_BRACKET
    trimmed = json.subarray(0, cut + 1)
  }
  const last = JSON.parse(lastText) as { id: string, username: string, created_at: string, updated_at: string }
  const key = column === 'username_key' ? last.username.toLowerCase() : last[column]
  return { json: trimmed, next: [key, last.id] }
}

const ELEMENT_START = ',{"id":"'
const CLOSING_BRACKET = 0x5d

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
    const [row] = await executePrepared(db, 'change_stamp', () => db.selectNoFrom(
      sql<string | null>`(select sum(n)::text || ':' || string_agg(xmin::text, ',' order by shard) from users_page_stamp)`.as('stamp')), {})
    if (row?.stamp == null) throw new Error('users_page_stamp is empty: migration 0019 makes its rows')
    return row.stamp
  }
  const [row] = await executePrepared(db, 'change_stamp', () =>
    db.selectNoFrom([sql<number>`total_changes()`.as('changes'), sql<number>`(select data_version from pragma_data_version())`.as('version')]), {})
  if (row === undefined) throw new Error('a select without FROM returned no row')
  return `${row.changes}:${row.version}`
}

/** The User representation, field for field as the User schema orders it (users.schemas.ts); qualified, since a group's page joins the memberships, which carry created_at, updated_at and username_key too (migration 0018). */
const USER_JSON_SQLITE = sql<string>`json_object(
  'id', users.id, 'username', users.username, 'email', users.email, 'first_name', users.first_name, 'last_name', users.last_name,
  'role', users.role, 'groups', json(users.groups), 'disabled', json(case when users.disabled then 'true' else 'false' end),
  'password_sign_in', json(case when users.password_sign_in then 'true' else 'false' end),
  'email_verified', json(case when users.email_verified then 'true' else 'false' end),
  'invitation_pending', json(case when users.invitation_pending then 'true' else 'false' end),
  'created_at', users.created_at, 'updated_at', users.updated_at, 'last_login_at', users.last_login_at,
  'password_changed_at', users.password_changed_at)`

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

type Defaulted = 'password_sign_in' | 'email_verified' | 'invitation_pending'

/** A row not yet written may leave out the columns with defaults (`password_sign_in` true, the others false): those are what they will be. */
export function toUser (row: Omit<PublicUserRow, Defaulted> & Partial<Pick<PublicUserRow, Defaulted>>): User {
  return {
    id: row.id,
    username: row.username,
    email: row.email,
    first_name: row.first_name,
    last_name: row.last_name,
    role: row.role,
    groups: toStringArray(row.groups),
    disabled: toBool(row.disabled),
    password_sign_in: toBool(row.password_sign_in ?? true),
    email_verified: toBool(row.email_verified ?? false),
    invitation_pending: toBool(row.invitation_pending ?? false),
    created_at: toIso(row.created_at),
    updated_at: toIso(row.updated_at),
    last_login_at: toIso(row.last_login_at),
    password_changed_at: toIso(row.password_changed_at)
  }
}
