import { sql, type Selectable, type Updateable } from 'kysely'
import { isPostgres, type Db, type UsersTable } from '../db/database.ts'
import type { ListUsersQuery, Sort } from './users.schemas.ts'

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
  password_hash: string | null
  version: number
  created_at: string
  updated_at: string
  last_login_at: null
  password_changed_at: string | null
}

/** The columns a User is made of: never the password hash. */
const PUBLIC_COLUMNS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled',
  'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'
] as const
export type PublicUserRow = Pick<UserRow, typeof PUBLIC_COLUMNS[number]>

export async function insertUser (db: Db, row: NewUserRow): Promise<PublicUserRow> {
  return await db.insertInto('users').values(row).returning(PUBLIC_COLUMNS).executeTakeFirstOrThrow()
}

export async function findUserById (db: Db, id: string, options: { forUpdate?: boolean } = {}): Promise<UserRow | undefined> {
  return await db.selectFrom('users').selectAll().where('id', '=', id)
    .$if(options.forUpdate === true && isPostgres(db), q => q.forUpdate())
    .executeTakeFirst()
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

export async function deleteUser (db: Db, id: string): Promise<boolean> {
  const result = await db.deleteFrom('users').where('id', '=', id).executeTakeFirst()
  return result.numDeletedRows > 0n
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

/** One page of users already rendered as a JSON array, and the keyset position after its last user. */
export interface UserPageJson {
  json: string
  /** [sort value, id] of the last user on the page, when more users follow. */
  next: [string, string] | undefined
}

/**
 * One keyset page: rows strictly after `after` = [sort value, id] in the
 * requested order (the id breaks ties, so every row is seen exactly once).
 *
 * The database renders the page as JSON, in the User shape, and finds the
 * next position in the same statement: building 50 row objects in JS and
 * serializing them again cost four times as much as the whole query.
 */
export async function listUsersJson (db: Db, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPageJson> {
  const [column, direction] = SORT_COLUMNS[sort]
  const pg = isPostgres(db)
  const cmp = direction === 'asc' ? '>' : '<'
  const needle = filter.q !== undefined ? `%${escapeLike(filter.q.toLowerCase())}%` : undefined
  const order = sql`${sql.ref(column)} ${sql.raw(direction)}, id ${sql.raw(direction)}`
  const page = db.selectFrom('users')
    .select([
      (pg ? USER_JSON_PG : USER_JSON_SQLITE).as('doc'),
      (pg && column !== 'username_key' ? sql<string>`${sql.raw(isoText(column))}` : sql<string>`${sql.ref(column)}`).as('k'),
      (pg ? sql<string>`id::text` : sql<string>`id`).as('kid'),
      sql<number>`row_number() over (order by ${order})`.as('rn')
    ])
    .$if(needle !== undefined, q => q.where(eb => eb.or([
      eb(sql`username_key`, 'like', sql`${needle} escape '\\'`),
      eb(sql`email_key`, 'like', sql`${needle} escape '\\'`),
      eb(sql`lower(first_name)`, 'like', sql`${needle} escape '\\'`),
      eb(sql`lower(last_name)`, 'like', sql`${needle} escape '\\'`)
    ])))
    .$if(filter.username !== undefined, q => q.where('username_key', '=', filter.username!.toLowerCase()))
    .$if(filter.email !== undefined, q => q.where('email_key', '=', filter.email!.toLowerCase()))
    .$if(filter.role !== undefined, q => q.where('role', '=', filter.role!))
    .$if(filter.disabled !== undefined, q => q.where('disabled', '=', filter.disabled!))
    .$if(filter.group !== undefined, q => q.where(pg
      ? sql<boolean>`groups ? ${filter.group}`
      : sql<boolean>`exists (select 1 from json_each(users.groups) where json_each.value = ${filter.group})`))
    // A row-value comparison, not `a > x OR (a = x AND id > y)`: both engines
    // answer it with an index range search; the OR form scans from the start
    // of the index on every page, which made the full list quadratic.
    .$if(after !== undefined, q => q.where(({ eb, refTuple, tuple }) => eb(refTuple(column, 'id'), cmp, tuple(after![0], after![1]))))
    .orderBy(column, direction)
    .orderBy('id', direction)
    // One more than the page, to know whether another page follows.
    .limit(limit + 1)
  const row = await db.selectFrom(page.as('p'))
    .select([
      (pg
        ? sql<string | null>`(json_agg(doc order by rn) filter (where rn <= ${limit}))::text`
        : sql<string | null>`json_group_array(json(doc) order by rn) filter (where rn <= ${limit})`).as('json'),
      sql<number | string>`count(*)`.as('n'),
      sql<string | null>`max(case when rn = ${limit} then k end)`.as('last_k'),
      sql<string | null>`max(case when rn = ${limit} then kid end)`.as('last_id')
    ])
    .executeTakeFirstOrThrow()
  const more = Number(row.n) > limit && row.last_k !== null && row.last_id !== null
  return { json: row.json ?? '[]', next: more ? [row.last_k!, row.last_id!] : undefined }
}

/** The User representation, field for field as the User schema orders it (users.schemas.ts). */
const USER_JSON_SQLITE = sql<string>`json_object(
  'id', id, 'username', username, 'email', email, 'first_name', first_name, 'last_name', last_name,
  'role', role, 'groups', json(groups), 'disabled', json(case when disabled then 'true' else 'false' end),
  'created_at', created_at, 'updated_at', updated_at, 'last_login_at', last_login_at,
  'password_changed_at', password_changed_at)`

const USER_JSON_PG = sql<string>`json_build_object(
  'id', id, 'username', username, 'email', email, 'first_name', first_name, 'last_name', last_name,
  'role', role, 'groups', groups, 'disabled', disabled,
  'created_at', ${sql.raw(isoText('created_at'))}, 'updated_at', ${sql.raw(isoText('updated_at'))},
  'last_login_at', ${sql.raw(isoText('last_login_at'))}, 'password_changed_at', ${sql.raw(isoText('password_changed_at'))})`

/** A timestamptz as the RFC 3339 UTC text the API uses everywhere (`toISOString()` form). */
function isoText (column: string): string {
  return `to_char(${column} at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`
}

function escapeLike (value: string): string {
  return value.replace(/[\\%_]/g, c => `\\${c}`)
}
