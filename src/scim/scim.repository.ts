import { sql, type RawBuilder, type Selectable } from 'kysely'
import { isPostgres, type Db, type UsersTable } from '../db/database.ts'
import { InvalidFilter, type Filter } from '../lib/scim-filter.ts'

/** Every column a SCIM User is made of: never the password hash. */
export const SCIM_USER_COLUMNS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'version',
  'created_at', 'updated_at', 'external_id', 'display_name', 'formatted_name', 'scim_emails', 'provisioned_at'
] as const
export type ScimUserRow = Pick<Selectable<UsersTable>, typeof SCIM_USER_COLUMNS[number]>

export async function findScimUserById (db: Db, id: string): Promise<ScimUserRow | undefined> {
  if (!UUID.test(id)) return undefined
  return await db.selectFrom('users').select(SCIM_USER_COLUMNS).where('id', '=', id).executeTakeFirst()
}

/** The id of the user holding this address as their `email`, if any (addresses are unique ignoring case). */
export async function findUserIdByEmail (db: Db, email: string): Promise<string | undefined> {
  const row = await db.selectFrom('users').select('id').where('email_key', '=', email.toLowerCase()).executeTakeFirst()
  return row?.id
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
const CORE_USER_URN = 'urn:ietf:params:scim:schemas:core:2.0:user:'

type Condition = RawBuilder<boolean>
type Value = boolean | null | number | string

/** How an attribute is compared: text (folded to lower case unless `caseExact`), a timestamp, `active` (the negation of `disabled`), or the id. */
type Attribute =
  | { kind: 'text', expression: (db: Db) => RawBuilder<unknown>, caseExact: boolean, folded?: boolean }
  | { kind: 'time', column: 'created_at' | 'updated_at' }
  | { kind: 'active' }
  | { kind: 'id' }
  | { kind: 'emails', sub: 'value' | 'type' | 'primary' | 'display' }

const column = (name: string) => () => sql.ref(`users.${name}`)

/**
 * The User attributes a filter may name, by lower-cased path (attribute names
 * are case-insensitive, RFC 7643 §2.1). `username_key` is the case-folded
 * username with its unique index, so `userName eq` is an index lookup; so is
 * `externalId eq` (users_external_id_idx) and `id eq`.
 */
const USER_ATTRIBUTES: Record<string, Attribute> = {
  id: { kind: 'id' },
  username: { kind: 'text', expression: column('username_key'), caseExact: false, folded: true },
  externalid: { kind: 'text', expression: column('external_id'), caseExact: true },
  displayname: { kind: 'text', expression: column('display_name'), caseExact: false },
  'name.givenname': { kind: 'text', expression: column('first_name'), caseExact: false },
  'name.familyname': { kind: 'text', expression: column('last_name'), caseExact: false },
  'name.formatted': { kind: 'text', expression: column('formatted_name'), caseExact: false },
  active: { kind: 'active' },
  'meta.created': { kind: 'time', column: 'created_at' },
  'meta.lastmodified': { kind: 'time', column: 'updated_at' },
  emails: { kind: 'emails', sub: 'value' },
  'emails.value': { kind: 'emails', sub: 'value' },
  'emails.type': { kind: 'emails', sub: 'type' },
  'emails.primary': { kind: 'emails', sub: 'primary' },
  'emails.display': { kind: 'emails', sub: 'display' }
}

function attributeOf (path: string): Attribute {
  let name = path.toLowerCase()
  if (name.startsWith(CORE_USER_URN)) name = name.slice(CORE_USER_URN.length)
  const attribute = USER_ATTRIBUTES[name]
  if (attribute === undefined) throw new InvalidFilter(`Users cannot be filtered on "${path}"; see /Schemas and docs/scim.md for the attributes that can.`)
  return attribute
}

function escapeLike (value: string): string {
  return value.replace(/[\\%_]/g, c => `\\${c}`)
}

/** `left <op> value` for text; `value` already folded when `left` is. */
function compareText (left: RawBuilder<unknown>, op: string, value: Value): Condition {
  if (op === 'pr') return sql<boolean>`(${left} is not null and ${left} <> '')`
  if (typeof value !== 'string') throw new InvalidFilter(`"${op}" on a string attribute needs a quoted string value.`)
  switch (op) {
    case 'eq': return sql<boolean>`${left} = ${value}`
    case 'ne': return sql<boolean>`(${left} is null or ${left} <> ${value})`
    case 'co': return sql<boolean>`${left} like ${`%${escapeLike(value)}%`} escape '\\'`
    case 'sw': return sql<boolean>`${left} like ${`${escapeLike(value)}%`} escape '\\'`
    case 'ew': return sql<boolean>`${left} like ${`%${escapeLike(value)}`} escape '\\'`
    case 'gt': return sql<boolean>`${left} > ${value}`
    case 'ge': return sql<boolean>`${left} >= ${value}`
    case 'lt': return sql<boolean>`${left} < ${value}`
    case 'le': return sql<boolean>`${left} <= ${value}`
  }
  throw new InvalidFilter(`Unknown operator "${op}".`)
}

function foldedText (db: Db, attribute: Extract<Attribute, { kind: 'text' }>): RawBuilder<unknown> {
  const expression = attribute.expression(db)
  return attribute.caseExact || attribute.folded === true ? expression : sql`lower(${expression})`
}

function foldValue (value: Value, caseExact: boolean): Value {
  return typeof value === 'string' && !caseExact ? value.toLowerCase() : value
}

/** One field of an element of `scim_emails`, in the subquery `emailsExist` makes. */
function emailField (db: Db, field: string): RawBuilder<unknown> {
  return isPostgres(db) ? sql`(e.v->>${field})` : sql`json_extract(e.value, ${`$.${field}`})`
}

function emailCondition (db: Db, sub: string, op: string, value: Value): Condition {
  if (sub === 'primary') {
    if (op === 'pr') return isPostgres(db) ? sql<boolean>`(e.v ? 'primary')` : sql<boolean>`json_type(e.value, '$.primary') is not null`
    if (typeof value !== 'boolean' || (op !== 'eq' && op !== 'ne')) throw new InvalidFilter('emails.primary takes eq or ne with true or false.')
    const wanted = op === 'eq' ? value : !value
    return isPostgres(db)
      ? sql<boolean>`coalesce((e.v->'primary') = ${sql.lit(wanted ? 'true' : 'false')}::jsonb, false)`
      : sql<boolean>`coalesce(json_extract(e.value, '$.primary') = ${wanted ? 1 : 0}, 0)`
  }
  return compareText(sql`lower(${emailField(db, sub)})`, op, foldValue(value, false))
}

/** Some element of the user's `scim_emails` satisfies `inner` (built over the element `e`). */
function emailsExist (db: Db, inner: Condition): Condition {
  return isPostgres(db)
    ? sql<boolean>`exists (select 1 from jsonb_array_elements(users.scim_emails) as e(v) where ${inner})`
    : sql<boolean>`exists (select 1 from json_each(users.scim_emails) as e where ${inner})`
}

/** A filter inside `emails[...]`: its attributes are the sub-attributes of one element. */
function elementCondition (db: Db, filter: Filter): Condition {
  switch (filter.op) {
    case 'and': return sql<boolean>`(${sql.join(filter.filters.map(f => elementCondition(db, f)), sql` and `)})`
    case 'or': return sql<boolean>`(${sql.join(filter.filters.map(f => elementCondition(db, f)), sql` or `)})`
    case 'not': return sql<boolean>`not coalesce(${elementCondition(db, filter.filter)}, false)`
    case '[]': throw new InvalidFilter('A value filter cannot hold another.')
    default: {
      const sub = filter.attrPath.toLowerCase()
      if (!['value', 'type', 'primary', 'display'].includes(sub)) throw new InvalidFilter(`emails has no sub-attribute "${filter.attrPath}".`)
      return emailCondition(db, sub, filter.op, filter.op === 'pr' ? null : filter.compValue)
    }
  }
}

function instantOf (value: Value): string {
  const time = typeof value === 'string' ? Date.parse(value) : Number.NaN
  if (Number.isNaN(time)) throw new InvalidFilter('meta.created and meta.lastModified compare with a date-time (RFC 3339).')
  return new Date(time).toISOString()
}

/**
 * A SCIM filter as a condition on `users`, run in the database on either
 * engine. Values are bound parameters; column names come from
 * USER_ATTRIBUTES only. A `not` treats an unknown (null) comparison as
 * false, so `not (displayName eq "x")` also finds users without one.
 */
export function userFilterCondition (db: Db, filter: Filter): Condition {
  switch (filter.op) {
    case 'and': return sql<boolean>`(${sql.join(filter.filters.map(f => userFilterCondition(db, f)), sql` and `)})`
    case 'or': return sql<boolean>`(${sql.join(filter.filters.map(f => userFilterCondition(db, f)), sql` or `)})`
    case 'not': return sql<boolean>`not coalesce(${userFilterCondition(db, filter.filter)}, false)`
    case '[]': {
      const attribute = attributeOf(filter.attrPath)
      if (attribute.kind !== 'emails') throw new InvalidFilter(`"${filter.attrPath}" is not multi-valued; value filters ([...]) apply to emails.`)
      return emailsExist(db, elementCondition(db, filter.valFilter))
    }
  }
  const attribute = attributeOf(filter.attrPath)
  const op = filter.op
  const value = op === 'pr' ? null : filter.compValue
  switch (attribute.kind) {
    case 'text':
      return compareText(foldedText(db, attribute), op, foldValue(value, attribute.caseExact))
    case 'id': {
      if (op === 'pr') return sql<boolean>`1 = 1`
      if (op !== 'eq' && op !== 'ne') throw new InvalidFilter('id takes eq, ne or pr.')
      // A value that is no uuid matches no user (PostgreSQL would refuse to compare it).
      const known = typeof value === 'string' && UUID.test(value)
      if (op === 'eq') return known ? sql<boolean>`users.id = ${value.toLowerCase()}` : sql<boolean>`1 = 0`
      return known ? sql<boolean>`users.id <> ${value.toLowerCase()}` : sql<boolean>`1 = 1`
    }
    case 'active': {
      if (op === 'pr') return sql<boolean>`1 = 1`
      if (typeof value !== 'boolean' || (op !== 'eq' && op !== 'ne')) throw new InvalidFilter('active takes eq or ne with true or false.')
      return sql<boolean>`users.disabled = ${op === 'eq' ? !value : value}`
    }
    case 'time': {
      const ref = sql.ref(`users.${attribute.column}`)
      if (op === 'pr') return sql<boolean>`1 = 1`
      const at = instantOf(value)
      const cast = isPostgres(db) ? sql`${at}::timestamptz` : sql`${at}`
      const symbol = { eq: '=', ne: '<>', gt: '>', ge: '>=', lt: '<', le: '<=' }[op as string]
      if (symbol === undefined) throw new InvalidFilter(`"${op}" does not apply to a date-time.`)
      return sql<boolean>`${ref} ${sql.raw(symbol)} ${cast}`
    }
    case 'emails': {
      // The user's `email` is also one of their emails (a REST client may have set it without a SCIM list).
      const inList = emailsExist(db, emailCondition(db, attribute.sub, op, value))
      if (attribute.sub !== 'value') return inList
      if (op === 'ne') return sql<boolean>`(${compareText(sql`users.email_key`, op, foldValue(value, false))} and not ${emailsExist(db, emailCondition(db, 'value', 'eq', value))})`
      return sql<boolean>`(${compareText(sql`users.email_key`, op, foldValue(value, false))} or ${inList})`
    }
  }
}

/** How a list may be ordered (`sortBy`): the column, by lower-cased attribute path. */
const SORT_COLUMNS: Record<string, 'username_key' | 'external_id' | 'display_name' | 'first_name' | 'last_name' | 'created_at' | 'updated_at' | 'id'> = {
  id: 'id',
  username: 'username_key',
  externalid: 'external_id',
  displayname: 'display_name',
  'name.givenname': 'first_name',
  'name.familyname': 'last_name',
  'meta.created': 'created_at',
  'meta.lastmodified': 'updated_at'
}

export function sortColumnOf (path: string): typeof SORT_COLUMNS[string] | undefined {
  let name = path.toLowerCase()
  if (name.startsWith(CORE_USER_URN)) name = name.slice(CORE_USER_URN.length)
  return SORT_COLUMNS[name]
}

export interface ScimListQuery {
  filter: Filter | undefined
  sortColumn: typeof SORT_COLUMNS[string]
  descending: boolean
  /** 0-based: SCIM's startIndex less one. */
  offset: number
  limit: number
}

/** One page of users matching a filter, and how many match in all. */
export async function listScimUsers (db: Db, query: ScimListQuery): Promise<{ rows: ScimUserRow[], total: number }> {
  const condition = query.filter !== undefined ? userFilterCondition(db, query.filter) : undefined
  const base = db.selectFrom('users').$if(condition !== undefined, q => q.where(condition!))
  const [{ total }] = [await base.select(sql<number | string>`count(*)`.as('total')).executeTakeFirstOrThrow()]
  const direction = query.descending ? 'desc' : 'asc'
  const rows = query.limit === 0
    ? []
    : await base.select(SCIM_USER_COLUMNS)
      .orderBy(query.sortColumn, direction).orderBy('id', direction)
      .limit(query.limit).offset(query.offset).execute()
  return { rows, total: Number(total) }
}
