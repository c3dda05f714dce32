import { sql, type RawBuilder, type Selectable } from 'kysely'
import { isPostgres, type Db, type GroupsTable, type UsersTable } from '../db/database.ts'
import { InvalidFilter, type Filter } from '../lib/scim-filter.ts'
import { ownValue } from '../lib/object-keys.ts'

/** Every column a SCIM User is made of: never the password hash. */
export const SCIM_USER_COLUMNS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'version',
  'created_at', 'updated_at', 'external_id', 'display_name', 'formatted_name', 'scim_emails', 'provisioned_at',
  'employee_number', 'cost_center', 'organization', 'division', 'department', 'manager_id'
] as const
export type ScimUserRow = Pick<Selectable<UsersTable>, typeof SCIM_USER_COLUMNS[number]>

export async function findScimUserById (db: Db, id: string): Promise<ScimUserRow | undefined> {
  if (!UUID.test(id)) return undefined
  return await db.selectFrom('users').select(SCIM_USER_COLUMNS).where('id', '=', id).executeTakeFirst()
}

/** What SCIM's enterprise extension keeps about a user, as the console shows it (names as SCIM spells them). */
export interface EnterpriseFacts {
  employeeNumber: string | null
  costCenter: string | null
  organization: string | null
  division: string | null
  department: string | null
  manager: { id: string, username: string } | null
}

/**
 * Whether SCIM manages a user, as the console shows it: the provider's id for
 * them, the last change a SCIM client made, and the enterprise extension.
 */
export async function findProvisioningOf (db: Db, id: string): Promise<{ externalId: string | null, provisionedAt: string | null, enterprise: EnterpriseFacts } | undefined> {
  const row = await db.selectFrom('users')
    .select(['external_id', 'provisioned_at', 'employee_number', 'cost_center', 'organization', 'division', 'department', 'manager_id'])
    .where('id', '=', id).executeTakeFirst()
  if (row === undefined) return undefined
  const manager = row.manager_id === null ? undefined : await db.selectFrom('users').select(['id', 'username']).where('id', '=', row.manager_id).executeTakeFirst()
  return {
    externalId: row.external_id,
    provisionedAt: row.provisioned_at === null ? null : row.provisioned_at instanceof Date ? row.provisioned_at.toISOString() : row.provisioned_at,
    enterprise: {
      employeeNumber: row.employee_number,
      costCenter: row.cost_center,
      organization: row.organization,
      division: row.division,
      department: row.department,
      manager: manager ?? null
    }
  }
}

/**
 * The name of the SCIM key (so: the identity provider, as whoever made the key
 * named it) that last changed the user: only a key with the `scim` scope
 * reaches SCIM, and each SCIM change is an event with that key as actor.
 * Undefined when none of the user's recent events came through one.
 */
export async function findProvisionerName (db: Db, userId: string): Promise<string | undefined> {
  const events = await db.selectFrom('events').select('actor_id')
    .where('target_type', '=', 'user').where('target_id', '=', userId).where('actor_type', '=', 'api_key')
    .orderBy('occurred_at', 'desc').orderBy('id', 'desc').limit(20).execute()
  const keyIds = [...new Set(events.map(event => event.actor_id).filter((id): id is string => id !== null))]
  if (keyIds.length === 0) return undefined
  const keys = await db.selectFrom('api_keys').select(['id', 'name', 'scopes']).where('id', 'in', keyIds).execute()
  const scimKeys = new Map(keys.filter(key => scopesOf(key.scopes).includes('scim')).map(key => [key.id, key.name]))
  return keyIds.map(id => scimKeys.get(id)).find(name => name !== undefined)
}

function scopesOf (stored: unknown): unknown[] {
  const value: unknown = typeof stored === 'string' ? JSON.parse(stored) : stored
  return Array.isArray(value) ? value : []
}

/** The id of the user holding this address as their `email`, if any (addresses are unique ignoring case). */
export async function findUserIdByEmail (db: Db, email: string): Promise<string | undefined> {
  const row = await db.selectFrom('users').select('id').where('email_key', '=', email.toLowerCase()).executeTakeFirst()
  return row?.id
}

/**
 * The user a SCIM `manager.value` names, if it is one of ours. On PostgreSQL
 * the row is held (FOR KEY SHARE) until the transaction ends, before the
 * report's own row is locked: a concurrent delete of the manager then waits
 * for this change, or this change finds the manager gone, and neither
 * waits on the other in a cycle.
 */
export async function findReferableUserId (db: Db, id: string): Promise<string | undefined> {
  if (!UUID.test(id)) return undefined
  const row = await db.selectFrom('users').select('id').where('id', '=', id.toLowerCase())
    .$if(isPostgres(db), q => q.forKeyShare())
    .executeTakeFirst()
  return row?.id
}

/** What a manager shows as in their reports' `manager.displayName`: their displayName, else their userName. */
export async function findManagerNames (db: Db, ids: readonly string[]): Promise<Map<string, string>> {
  const unique = [...new Set(ids)]
  if (unique.length === 0) return new Map()
  const rows = await db.selectFrom('users').select(['id', 'username', 'display_name']).where('id', 'in', unique).execute()
  return new Map(rows.map(row => [row.id, row.display_name ?? row.username]))
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
  | { kind: 'members' }
  | { kind: 'manager' }

const column = (name: string) => () => sql.ref(name)

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
  'emails.display': { kind: 'emails', sub: 'display' },
  // The enterprise extension (RFC 7643 §4.3), by `enterprise:` and the lower-cased name (attributeOf).
  // employeeNumber and department are indexed on their lower case (migration 0017): `eq` is an index lookup.
  'enterprise:employeenumber': { kind: 'text', expression: column('employee_number'), caseExact: false },
  'enterprise:costcenter': { kind: 'text', expression: column('cost_center'), caseExact: false },
  'enterprise:organization': { kind: 'text', expression: column('organization'), caseExact: false },
  'enterprise:division': { kind: 'text', expression: column('division'), caseExact: false },
  'enterprise:department': { kind: 'text', expression: column('department'), caseExact: false },
  'enterprise:manager': { kind: 'manager' },
  'enterprise:manager.value': { kind: 'manager' }
}

/** The enterprise extension's URN as a filter path's prefix, lower-cased. */
export const ENTERPRISE_USER_URN = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:user:'
const ENTERPRISE_NAMES = new Set(['employeenumber', 'costcenter', 'organization', 'division', 'department', 'manager', 'manager.value', 'manager.displayname', 'manager.$ref'])

const CORE_GROUP_URN = 'urn:ietf:params:scim:schemas:core:2.0:group:'

/** The Group attributes a filter may name: `displayName eq` and `externalId eq` are index lookups, `members[value eq "…"]` one on group_members. */
const GROUP_ATTRIBUTES: Record<string, Attribute> = {
  id: { kind: 'id' },
  displayname: { kind: 'text', expression: column('name_key'), caseExact: false, folded: true },
  externalid: { kind: 'text', expression: column('external_id'), caseExact: true },
  members: { kind: 'members' },
  'members.value': { kind: 'members' },
  'meta.created': { kind: 'time', column: 'created_at' },
  'meta.lastmodified': { kind: 'time', column: 'updated_at' }
}

/** Which resource a filter is on: its table, its attributes and the URN prefix its paths may carry. */
export interface Resource { table: 'users' | 'groups', attributes: Record<string, Attribute>, urn: string, name: string }
export const USERS: Resource = { table: 'users', attributes: USER_ATTRIBUTES, urn: CORE_USER_URN, name: 'Users' }
export const GROUPS: Resource = { table: 'groups', attributes: GROUP_ATTRIBUTES, urn: CORE_GROUP_URN, name: 'Groups' }

function attributeOf (resource: Resource, path: string): Attribute {
  let name = path.toLowerCase()
  if (name.startsWith(resource.urn)) name = name.slice(resource.urn.length)
  // An enterprise attribute with its URN, or by its bare name, which no core attribute shares.
  else if (resource === USERS && name.startsWith(ENTERPRISE_USER_URN)) name = `enterprise:${name.slice(ENTERPRISE_USER_URN.length)}`
  else if (resource === USERS && ENTERPRISE_NAMES.has(name)) name = `enterprise:${name}`
  const attribute = ownValue(resource.attributes, name)
  if (attribute === undefined) throw new InvalidFilter(`${resource.name} cannot be filtered on "${path}"; see /Schemas and docs/scim.md for the attributes that can.`)
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
export function filterCondition (db: Db, resource: Resource, filter: Filter): Condition {
  const table = resource.table
  switch (filter.op) {
    case 'and': return sql<boolean>`(${sql.join(filter.filters.map(f => filterCondition(db, resource, f)), sql` and `)})`
    case 'or': return sql<boolean>`(${sql.join(filter.filters.map(f => filterCondition(db, resource, f)), sql` or `)})`
    case 'not': return sql<boolean>`not coalesce(${filterCondition(db, resource, filter.filter)}, false)`
    case '[]': {
      const attribute = attributeOf(resource, filter.attrPath)
      if (attribute.kind === 'emails') return emailsExist(db, elementCondition(db, filter.valFilter))
      if (attribute.kind === 'members') {
        const inner = filter.valFilter
        if (inner.op !== 'eq' || inner.attrPath.toLowerCase() !== 'value') throw new InvalidFilter('members[...] takes value eq "<user id>".')
        return memberCondition('eq', inner.compValue)
      }
      throw new InvalidFilter(`"${filter.attrPath}" is not multi-valued; value filters ([...]) apply to emails and members.`)
    }
  }
  const attribute = attributeOf(resource, filter.attrPath)
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
      const id = sql.ref(`${table}.id`)
      if (op === 'eq') return known ? sql<boolean>`${id} = ${value.toLowerCase()}` : sql<boolean>`1 = 0`
      return known ? sql<boolean>`${id} <> ${value.toLowerCase()}` : sql<boolean>`1 = 1`
    }
    case 'active': {
      if (op === 'pr') return sql<boolean>`1 = 1`
      if (typeof value !== 'boolean' || (op !== 'eq' && op !== 'ne')) throw new InvalidFilter('active takes eq or ne with true or false.')
      return sql<boolean>`users.disabled = ${op === 'eq' ? !value : value}`
    }
    case 'members': {
      if (op === 'pr') return sql<boolean>`exists (select 1 from group_members m where m.group_id = groups.id)`
      return memberCondition(op, value)
    }
    case 'manager': {
      if (op === 'pr') return sql<boolean>`users.manager_id is not null`
      if (op !== 'eq' && op !== 'ne') throw new InvalidFilter('manager.value takes eq, ne or pr with a user id.')
      const known = typeof value === 'string' && UUID.test(value)
      if (op === 'eq') return known ? sql<boolean>`users.manager_id = ${value.toLowerCase()}` : sql<boolean>`1 = 0`
      return known ? sql<boolean>`(users.manager_id is null or users.manager_id <> ${value.toLowerCase()})` : sql<boolean>`1 = 1`
    }
    case 'time': {
      const ref = sql.ref(`${table}.${attribute.column}`)
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

/** The group has this user as a member (an index lookup on group_members' primary key). */
function memberCondition (op: string, value: Value): Condition {
  if (op !== 'eq') throw new InvalidFilter('members takes eq "<user id>" or pr.')
  if (typeof value !== 'string' || !UUID.test(value)) return sql<boolean>`1 = 0`
  return sql<boolean>`exists (select 1 from group_members m where m.group_id = groups.id and m.user_id = ${value.toLowerCase()})`
}

/** How a list may be ordered (`sortBy`): the column, by lower-cased attribute path. */
const SORT_COLUMNS: Record<string, 'username_key' | 'external_id' | 'display_name' | 'first_name' | 'last_name' | 'created_at' | 'updated_at' | 'id' | 'employee_number' | 'department'> = {
  id: 'id',
  username: 'username_key',
  externalid: 'external_id',
  displayname: 'display_name',
  'name.givenname': 'first_name',
  'name.familyname': 'last_name',
  'meta.created': 'created_at',
  'meta.lastmodified': 'updated_at',
  'enterprise:employeenumber': 'employee_number',
  'enterprise:department': 'department'
}

export function sortColumnOf (path: string): typeof SORT_COLUMNS[string] | undefined {
  let name = path.toLowerCase()
  if (name.startsWith(CORE_USER_URN)) name = name.slice(CORE_USER_URN.length)
  else if (name.startsWith(ENTERPRISE_USER_URN)) name = `enterprise:${name.slice(ENTERPRISE_USER_URN.length)}`
  else if (ENTERPRISE_NAMES.has(name)) name = `enterprise:${name}`
  return ownValue(SORT_COLUMNS, name)
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
  const condition = query.filter !== undefined ? filterCondition(db, USERS, query.filter) : undefined
  const base = db.selectFrom('users').$if(condition !== undefined, q => q.where(condition!))
  const { total } = await base.select(sql<number | string>`count(*)`.as('total')).executeTakeFirstOrThrow()
  const direction = query.descending ? 'desc' : 'asc'
  const rows = query.limit === 0
    ? []
    : await base.select(SCIM_USER_COLUMNS)
      .orderBy(query.sortColumn, direction).orderBy('id', direction)
      .limit(query.limit).offset(query.offset).execute()
  return { rows, total: Number(total) }
}

/** The groups of each of these users, for their `groups` attribute (one query for a page of users). */
export async function findGroupsOfUsers (db: Db, userIds: readonly string[]): Promise<Map<string, Array<{ id: string, display_name: string }>>> {
  const byUser = new Map<string, Array<{ id: string, display_name: string }>>()
  if (userIds.length === 0) return byUser
  const rows = await db.selectFrom('group_members')
    .innerJoin('groups', 'groups.id', 'group_members.group_id')
    .select(['group_members.user_id', 'groups.id', 'groups.display_name'])
    .where('group_members.user_id', 'in', [...userIds])
    .orderBy('groups.display_name')
    .execute()
  for (const row of rows) {
    const list = byUser.get(row.user_id) ?? []
    list.push({ id: row.id, display_name: row.display_name })
    byUser.set(row.user_id, list)
  }
  return byUser
}

export type ScimGroupRow = Selectable<GroupsTable>

/** The members of each of these groups, as id and username, for their `members` attribute. */
export async function findMembersOfGroups (db: Db, groupIds: readonly string[]): Promise<Map<string, Array<{ id: string, username: string }>>> {
  const byGroup = new Map<string, Array<{ id: string, username: string }>>()
  if (groupIds.length === 0) return byGroup
  const rows = await db.selectFrom('group_members')
    .innerJoin('users', 'users.id', 'group_members.user_id')
    .select(['group_members.group_id', 'users.id', 'users.username'])
    .where('group_members.group_id', 'in', [...groupIds])
    .orderBy('users.username_key')
    .execute()
  for (const row of rows) {
    const list = byGroup.get(row.group_id) ?? []
    list.push({ id: row.id, username: row.username })
    byGroup.set(row.group_id, list)
  }
  return byGroup
}

export async function findScimGroupById (db: Db, id: string): Promise<ScimGroupRow | undefined> {
  if (!UUID.test(id)) return undefined
  return await db.selectFrom('groups').selectAll().where('id', '=', id).executeTakeFirst()
}

/** Which of these ids are users: members a client names that are not are passed over (docs/scim.md). */
export async function findExistingUserIds (db: Db, ids: readonly string[]): Promise<string[]> {
  const candidates = ids.filter(id => UUID.test(id)).map(id => id.toLowerCase())
  if (candidates.length === 0) return []
  const rows = await db.selectFrom('users').select('id').where('id', 'in', candidates).execute()
  return rows.map(row => row.id)
}

const GROUP_SORT_COLUMNS: Record<string, 'display_name' | 'external_id' | 'created_at' | 'updated_at' | 'id'> = {
  id: 'id',
  displayname: 'display_name',
  externalid: 'external_id',
  'meta.created': 'created_at',
  'meta.lastmodified': 'updated_at'
}

export function groupSortColumnOf (path: string): typeof GROUP_SORT_COLUMNS[string] | undefined {
  let name = path.toLowerCase()
  if (name.startsWith(CORE_GROUP_URN)) name = name.slice(CORE_GROUP_URN.length)
  return ownValue(GROUP_SORT_COLUMNS, name)
}

/** One page of groups matching a filter, and how many match in all. */
export async function listScimGroups (db: Db, query: Omit<ScimListQuery, 'sortColumn'> & { sortColumn: typeof GROUP_SORT_COLUMNS[string] }): Promise<{ rows: ScimGroupRow[], total: number }> {
  const condition = query.filter !== undefined ? filterCondition(db, GROUPS, query.filter) : undefined
  const base = db.selectFrom('groups').$if(condition !== undefined, q => q.where(condition!))
  const { total } = await base.select(sql<number | string>`count(*)`.as('total')).executeTakeFirstOrThrow()
  const direction = query.descending ? 'desc' : 'asc'
  const rows = query.limit === 0
    ? []
    : await base.selectAll().orderBy(query.sortColumn, direction).orderBy('id', direction).limit(query.limit).offset(query.offset).execute()
  return { rows, total: Number(total) }
}
