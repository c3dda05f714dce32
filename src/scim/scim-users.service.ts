import { toBool, toIso, type Db, type ScimEmail } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { nowIso } from '../lib/ids.ts'
import { changeUserRecorded, createUserRecorded, deleteUserRecorded, newUserRow, type UserChanges } from '../users/users.lifecycle.ts'
import type { UserRow } from '../users/users.repository.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'
import {
  findGroupsOfUsers,
  findManagerNames,
  findReferableUserId,
  findScimUserById,
  findUserIdByEmail,
  listScimUsers,
  sortColumnOf,
  type ScimUserRow
} from './scim.repository.ts'
import {
  attr,
  booleanOf,
  etagOf,
  filtered,
  invalidValue,
  isObject,
  listQueryOf,
  managerValueOf,
  optionalString,
  project,
  type Resource,
  type ScimAnswer,
  type ScimContext,
  type ScimListAnswer
} from './scim.resources.ts'
import { URN, type ScimListQuery, type ScimPatchBody, type ScimResourceBody } from './scim.schemas.ts'
import { passwordOf, patchedResource, splitPassword, withoutPassword } from './scim-user-patch.ts'

/** What every SCIM change adds to its `user.updated` / `user.created` event. */
const SOURCE = { source: 'scim' }

/** RFC 9110 If-Match against the user's version: `*`, or any of the tags, weak or strong (SCIM clients send W/"n"). */
function assertIfMatch (ifMatch: string | undefined, version: number): void {
  if (ifMatch === undefined) return
  const tags = ifMatch.split(',').map(t => t.trim().replace(/^W\//, ''))
  if (!tags.includes('*') && !tags.includes(`"${version}"`)) {
    throw new AppError('precondition_failed', 412, 'The user changed since you read it (If-Match does not match its version); read it again and retry.')
  }
}

function notFound (id: string): AppError {
  return new AppError('user_not_found', 404, `No user has the id ${id}.`)
}

const EMAIL = /^[^\s@"(),:;<>[\\\]]+@[^\s@"(),:;<>[\\\]]+\.[^\s@"(),:;<>[\\\]]+$/
const USERNAME = new RegExp(USERNAME_PATTERN)
const MAX_EMAILS = 20

function emailsOf (value: unknown): ScimEmail[] | null {
  if (value === undefined || value === null) return null
  if (!Array.isArray(value)) throw invalidValue('emails must be an array.')
  if (value.length > MAX_EMAILS) throw invalidValue(`At most ${MAX_EMAILS} emails are kept.`)
  const emails = value.map((entry, i): ScimEmail => {
    if (!isObject(entry)) throw invalidValue(`emails[${i}] must be an object.`)
    const address = optionalString(attr(entry, 'value'), `emails[${i}].value`, 254)
    if (address == null) throw invalidValue(`emails[${i}].value is required.`)
    const email: ScimEmail = { value: address }
    const type = optionalString(attr(entry, 'type'), `emails[${i}].type`, 64)
    if (type != null) email.type = type
    const primary = attr(entry, 'primary')
    if (primary !== undefined && primary !== null) email.primary = booleanOf(primary, `emails[${i}].primary`)
    return email
  })
  if (emails.filter(e => e.primary === true).length > 1) throw invalidValue('At most one of emails is primary.')
  return emails.length > 0 ? emails : null
}

/** The enterprise extension's strings: SCIM's name, and the column that keeps it. */
const ENTERPRISE_STRINGS = [
  ['employeeNumber', 'employee_number'],
  ['costCenter', 'cost_center'],
  ['organization', 'organization'],
  ['division', 'division'],
  ['department', 'department']
] as const
type EnterpriseColumn = typeof ENTERPRISE_STRINGS[number][1]

/** What the enterprise extension says; `undefined` where it says nothing. */
type EnterpriseFields = Record<EnterpriseColumn, string | null | undefined> & { manager: string | null | undefined }

function enterpriseFieldsOf (resource: Resource): EnterpriseFields {
  const extension = attr(resource, URN.enterpriseUser)
  if (extension !== undefined && extension !== null && !isObject(extension)) throw invalidValue(`${URN.enterpriseUser} must be an object.`)
  const part = isObject(extension) ? extension : {}
  const fields = { manager: managerValueOf(attr(part, 'manager')) } as EnterpriseFields
  for (const [name, column] of ENTERPRISE_STRINGS) fields[column] = optionalString(attr(part, name), name, 200)
  return fields
}

/** What a User resource says about the fields gatehouse keeps; `undefined` where it says nothing. */
interface ResourceFields {
  username: string
  first_name: string | null | undefined
  last_name: string | null | undefined
  formatted_name: string | null | undefined
  display_name: string | null | undefined
  external_id: string | null | undefined
  disabled: boolean | undefined
  scim_emails: ScimEmail[] | null
  enterprise: EnterpriseFields
}

function fieldsOf (resource: Resource): ResourceFields {
  const userName = attr(resource, 'userName')
  if (typeof userName !== 'string' || userName === '') throw invalidValue('userName is required.')
  if (!USERNAME.test(userName)) throw invalidValue('userName must be 1 to 64 characters: letters, digits, and . _ @ -.')
  const name = attr(resource, 'name')
  if (name !== undefined && name !== null && !isObject(name)) throw invalidValue('name must be an object.')
  const active = attr(resource, 'active')
  return {
    username: userName,
    first_name: isObject(name) ? optionalString(attr(name, 'givenName'), 'name.givenName', 200) : name === null ? null : undefined,
    last_name: isObject(name) ? optionalString(attr(name, 'familyName'), 'name.familyName', 200) : name === null ? null : undefined,
    formatted_name: isObject(name) ? optionalString(attr(name, 'formatted'), 'name.formatted', 400) : name === null ? null : undefined,
    display_name: optionalString(attr(resource, 'displayName'), 'displayName', 400),
    external_id: optionalString(attr(resource, 'externalId'), 'externalId', 255),
    disabled: active === undefined || active === null ? undefined : !booleanOf(active, 'active'),
    scim_emails: emailsOf(attr(resource, 'emails')),
    enterprise: enterpriseFieldsOf(resource)
  }
}

/**
 * The enterprise columns a resource sets, each cleared where it says nothing
 * (as a PUT replaces). A manager that is no user here is passed over, as a
 * group's member is: an identity provider may name one it has not
 * provisioned to this app (Microsoft's collection sends "SuzzyQ").
 */
async function enterpriseColumnsOf (trx: Db, fields: EnterpriseFields, userId: string | undefined): Promise<Record<EnterpriseColumn | 'manager_id', string | null>> {
  if (fields.manager != null && userId !== undefined && fields.manager.toLowerCase() === userId) throw invalidValue('A user cannot be their own manager.')
  const columns = { manager_id: fields.manager == null ? null : await findReferableUserId(trx, fields.manager) ?? null } as Record<EnterpriseColumn | 'manager_id', string | null>
  for (const [, column] of ENTERPRISE_STRINGS) columns[column] = fields[column] ?? null
  return columns
}

/**
 * gatehouse's `email` for a SCIM emails list: the primary (or only first)
 * address when it is an address and no other user has it. Addresses are an
 * identity here (unique, used to link sign-ins), and not in SCIM, where two
 * people may share one: the list keeps what the client sent either way.
 */
async function gatehouseEmailOf (db: Db, emails: ScimEmail[] | null, userId: string | undefined): Promise<string | null> {
  const primary = emails?.find(e => e.primary === true) ?? emails?.[0]
  if (primary === undefined || !EMAIL.test(primary.value)) return null
  const holder = await findUserIdByEmail(db, primary.value)
  return holder === undefined || holder === userId ? primary.value : null
}

function emailsOfRow (row: ScimUserRow): ScimEmail[] {
  const parsed: ScimEmail[] = row.scim_emails === null ? [] : typeof row.scim_emails === 'string' ? JSON.parse(row.scim_emails) as ScimEmail[] : row.scim_emails
  // In the order emailsOf writes them: PostgreSQL's jsonb gives the keys back in an order of its own.
  const stored = parsed.map(e => ({ value: e.value, ...(e.type !== undefined ? { type: e.type } : {}), ...(e.primary !== undefined ? { primary: e.primary } : {}) }))
  // An address set through another door than SCIM is the primary one.
  if (row.email !== null && !stored.some(e => e.value.toLowerCase() === row.email!.toLowerCase())) {
    return [{ value: row.email, type: 'work', primary: true }, ...stored.map(e => ({ ...e, primary: false }))]
  }
  return stored
}

/** The enterprise extension of a row, empty when nothing of it is set; the manager's displayName is read from their user. */
function enterpriseOf (row: ScimUserRow, baseUrl: string, managerNames: ReadonlyMap<string, string>): Resource {
  const extension: Resource = {}
  for (const [name, column] of ENTERPRISE_STRINGS) if (row[column] !== null) extension[name] = row[column]
  if (row.manager_id !== null) {
    const displayName = managerNames.get(row.manager_id)
    extension.manager = { value: row.manager_id, $ref: `${baseUrl}/Users/${row.manager_id}`, ...(displayName !== undefined ? { displayName } : {}) }
  }
  return extension
}

/** The User resource of a row: core schema, as /Schemas describes it, and the enterprise extension when something of it is set. */
export function userResource (row: ScimUserRow, baseUrl: string, groups: ReadonlyArray<{ id: string, display_name: string }>, managerNames: ReadonlyMap<string, string> = new Map()): Resource {
  const name: Resource = {}
  if (row.formatted_name !== null) name.formatted = row.formatted_name
  if (row.last_name !== null) name.familyName = row.last_name
  if (row.first_name !== null) name.givenName = row.first_name
  const emails = emailsOfRow(row)
  const enterprise = enterpriseOf(row, baseUrl, managerNames)
  const extended = Object.keys(enterprise).length > 0
  return {
    schemas: extended ? [URN.user, URN.enterpriseUser] : [URN.user],
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    userName: row.username,
    ...(Object.keys(name).length > 0 ? { name } : {}),
    ...(row.display_name !== null ? { displayName: row.display_name } : {}),
    active: !toBool(row.disabled),
    ...(emails.length > 0 ? { emails } : {}),
    ...(groups.length > 0 ? { groups: groups.map(group => ({ value: group.id, display: group.display_name, $ref: `${baseUrl}/Groups/${group.id}` })) } : {}),
    ...(extended ? { [URN.enterpriseUser]: enterprise } : {}),
    meta: {
      resourceType: 'User',
      created: toIso(row.created_at),
      lastModified: toIso(row.updated_at),
      version: etagOf(row.version),
      location: `${baseUrl}/Users/${row.id}`
    }
  }
}

async function readUser (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  const row = await findScimUserById(db, id)
  if (row === undefined) throw notFound(id)
  const groups = await findGroupsOfUsers(db, [id])
  const managerNames = await findManagerNames(db, row.manager_id !== null ? [row.manager_id] : [])
  return { resource: userResource(row, baseUrl, groups.get(id) ?? [], managerNames), version: row.version }
}

export async function getScimUser (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  return await readUser(db, id, baseUrl)
}

/** Creates a user from a SCIM User: role `user`, no password (SCIM users sign in through single sign-on). */
export async function createScimUser (db: Db, scim: ScimContext, body: ScimResourceBody): Promise<ScimAnswer> {
  const fields = fieldsOf(body)
  const password = passwordOf(body)
  const passwordHash = password !== undefined ? await scim.hashPassword(password, { username: fields.username, emails: (fields.scim_emails ?? []).map(e => e.value) }) : null
  return await db.transaction().execute(async trx => {
    const now = nowIso()
    const row = newUserRow({
      username: fields.username,
      email: await gatehouseEmailOf(trx, fields.scim_emails, undefined),
      first_name: fields.first_name,
      last_name: fields.last_name,
      disabled: fields.disabled ?? false,
      external_id: fields.external_id,
      display_name: fields.display_name,
      formatted_name: fields.formatted_name,
      scim_emails: fields.scim_emails,
      ...await enterpriseColumnsOf(trx, fields.enterprise, undefined)
    }, passwordHash, passwordHash !== null, now)
    row.provisioned_at = now
    await createUserRecorded(trx, scim.ctx, row, SOURCE)
    return await readUser(trx, row.id, scim.baseUrl)
  })
}

/**
 * Applies what a User resource says to the stored user through the user
 * lifecycle (events, webhooks, the last-admin rule, sessions and keys ended on
 * disabling). Attributes the resource leaves out are cleared, as a PUT
 * replaces the resource (RFC 7644 §3.5.1), except `active`: a PUT that does
 * not mention it neither enables nor disables anyone.
 */
async function applyResource (trx: Db, scim: ScimContext, current: ScimUserRow, resource: Resource, ifMatch: string | undefined, passwordHash: string | undefined): Promise<ScimAnswer> {
  const fields = fieldsOf(resource)
  // Emails as the user already shows them (an address set through the REST API included) are no change.
  const sameEmails = JSON.stringify(fields.scim_emails ?? []) === JSON.stringify(emailsOfRow(current))
  const changes: UserChanges = {
    username: fields.username,
    ...(sameEmails ? {} : { email: await gatehouseEmailOf(trx, fields.scim_emails, current.id), scim_emails: fields.scim_emails }),
    first_name: fields.first_name ?? null,
    last_name: fields.last_name ?? null,
    formatted_name: fields.formatted_name ?? null,
    display_name: fields.display_name ?? null,
    external_id: fields.external_id ?? null,
    ...await enterpriseColumnsOf(trx, fields.enterprise, current.id),
    ...(fields.disabled !== undefined ? { disabled: fields.disabled } : {}),
    ...(passwordHash !== undefined ? { password_hash: passwordHash } : {})
  }
  await changeUserRecorded(trx, scim.ctx, current.id, changes, {
    lastAdmin: 'refuse',
    provisioning: true,
    extra: SOURCE,
    check: (locked: UserRow) => {
      assertIfMatch(ifMatch, locked.version)
      if (locked.version !== current.version) {
        throw new AppError('precondition_failed', 412, 'The user changed while this request was applied; read it again and retry.')
      }
    }
  })
  return await readUser(trx, current.id, scim.baseUrl)
}

/** A new password is hashed before the transaction, against the userName and addresses the user will have. */
async function hashOf (scim: ScimContext, password: string | undefined, resource: Resource): Promise<string | undefined> {
  if (password === undefined) return undefined
  const userName = attr(resource, 'userName')
  const emails = attr(resource, 'emails')
  const addresses = Array.isArray(emails) ? emails.map(e => isObject(e) ? attr(e, 'value') : undefined).filter(v => typeof v === 'string') : []
  return await scim.hashPassword(password, { username: typeof userName === 'string' ? userName : '', emails: addresses })
}

export async function replaceScimUser (db: Db, scim: ScimContext, id: string, body: ScimResourceBody, ifMatch: string | undefined): Promise<ScimAnswer> {
  const passwordHash = await hashOf(scim, passwordOf(body), body)
  return await db.transaction().execute(async trx => {
    const current = await findScimUserById(trx, id)
    if (current === undefined) throw notFound(id)
    return await applyResource(trx, scim, current, withoutPassword(body), ifMatch, passwordHash)
  })
}

/**
 * The PATCH is applied once, to the user as read. With a password, that read
 * is before the transaction: the rules compare the password with the
 * userName and addresses the user will have, and the hash must not hold a
 * write lock; the change is then stored only if the user is still at that
 * version (else 412, as any change made meanwhile would be lost).
 */
export async function patchScimUser (db: Db, scim: ScimContext, id: string, body: ScimPatchBody, ifMatch: string | undefined): Promise<ScimAnswer> {
  const split = splitPassword(body)
  if (split.password === undefined) {
    return await db.transaction().execute(async trx => {
      const current = await findScimUserById(trx, id)
      if (current === undefined) throw notFound(id)
      return await applyResource(trx, scim, current, patchedResource(userResource(current, scim.baseUrl, []), split.body), ifMatch, undefined)
    })
  }
  const stored = await findScimUserById(db, id)
  if (stored === undefined) throw notFound(id)
  const patched = patchedResource(userResource(stored, scim.baseUrl, []), split.body)
  const passwordHash = await hashOf(scim, split.password, patched)
  return await db.transaction().execute(async trx => await applyResource(trx, scim, stored, patched, ifMatch, passwordHash))
}

export async function deleteScimUser (db: Db, scim: ScimContext, id: string, ifMatch: string | undefined): Promise<void> {
  if (await findScimUserById(db, id) === undefined) throw notFound(id)
  await db.transaction().execute(async trx => {
    await deleteUserRecorded(trx, scim.ctx, id, { check: current => { assertIfMatch(ifMatch, current.version) } })
  })
}

export async function listScimUsersPage (db: Db, baseUrl: string, query: ScimListQuery): Promise<ScimListAnswer> {
  const { filter, startIndex, count, descending } = listQueryOf(query)
  const sortColumn = query.sortBy !== undefined ? sortColumnOf(query.sortBy) : 'created_at'
  if (sortColumn === undefined) throw invalidValue(`Users cannot be sorted by "${query.sortBy!}".`)
  const page = await filtered(async () => await listScimUsers(db, { filter, sortColumn, descending, offset: startIndex - 1, limit: count }))
  const groups = await findGroupsOfUsers(db, page.rows.map(row => row.id))
  const managerNames = await findManagerNames(db, page.rows.flatMap(row => row.manager_id !== null ? [row.manager_id] : []))
  const Resources = page.rows.map(row => project(userResource(row, baseUrl, groups.get(row.id) ?? [], managerNames), query.attributes, query.excludedAttributes))
  return { totalResults: page.total, startIndex, itemsPerPage: Resources.length, Resources }
}
