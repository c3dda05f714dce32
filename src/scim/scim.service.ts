import { scimPatch, ScimError as PatchError, type ScimPatchOperation } from 'scim-patch'
import { filter as matches, parse as parseFilter } from 'scim2-parse-filter'
import { toBool, toIso, type Db, type ScimEmail } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { nowIso } from '../lib/ids.ts'
import { InvalidFilter, parseScimFilter, type Filter } from '../lib/scim-filter.ts'
import type { PasswordOwner } from '../lib/password-policy.ts'
import { changeUserRecorded, createUserRecorded, deleteUserRecorded, newUserRow, type UserChanges } from '../users/users.lifecycle.ts'
import type { UserRow } from '../users/users.repository.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'
import {
  findExistingUserIds,
  findGroupsOfUsers,
  findManagerNames,
  findReferableUserId,
  findMembersOfGroups,
  findScimGroupById,
  findScimUserById,
  findUserIdByEmail,
  groupSortColumnOf,
  listScimGroups,
  listScimUsers,
  sortColumnOf,
  type ScimGroupRow,
  type ScimUserRow
} from './scim.repository.ts'
import {
  addGroupMembersRecorded,
  changeGroupRecorded,
  createGroupRecorded,
  deleteGroupRecorded,
  removeGroupMembersRecorded,
  replaceGroupMembersRecorded
} from '../groups/groups.lifecycle.ts'
import { DEFAULT_COUNT, MAX_RESULTS, URN, type ScimListQuery, type ScimPatchBody, type ScimResourceBody } from './scim.schemas.ts'

/** Who asked, where resources live (`meta.location`: the absolute URL of /scim/v2), and how a password is checked and hashed. */
export interface ScimContext {
  ctx: RequestContext
  baseUrl: string
  /** Applies the password rules (as the REST API does) and hashes; called before any transaction, as a hash takes milliseconds. */
  hashPassword: (password: string, owner: PasswordOwner) => Promise<string>
}

/** A SCIM resource as sent: an object of attributes. */
export type Resource = Record<string, unknown>

/** What every SCIM change adds to its `user.updated` / `user.created` event. */
const SOURCE = { source: 'scim' }

export function etagOf (version: number): string {
  return `W/"${version}"`
}

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

function invalidValue (detail: string): AppError {
  return new AppError('invalid_value', 400, detail)
}

/** The value of an attribute whatever the case of its name (RFC 7643 §2.1). */
function attr (resource: Resource, name: string): unknown {
  const wanted = name.toLowerCase()
  for (const [key, value] of Object.entries(resource)) {
    if (key.toLowerCase() === wanted) return value
  }
  return undefined
}

function isObject (value: unknown): value is Resource {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** SCIM booleans, and the strings "True" and "False" that Entra sends for them. */
function booleanOf (value: unknown, name: string): boolean {
  if (typeof value === 'boolean') return value
  if (typeof value === 'string' && /^(true|false)$/i.test(value)) return value.toLowerCase() === 'true'
  throw invalidValue(`${name} must be true or false.`)
}

function optionalString (value: unknown, name: string, max: number): string | null | undefined {
  if (value === undefined) return undefined
  if (value === null || value === '') return null
  if (typeof value !== 'string') throw invalidValue(`${name} must be a string.`)
  if (value.length > max) throw invalidValue(`${name} is longer than ${max} characters.`)
  return value
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

/**
 * The id a `manager` names, in each form clients send it: `{"value": "<id>"}`
 * (RFC 7643), a bare id string (Entra's PATCH), or a list of one such object.
 * `null` clears it: null, an empty string, an empty list or an empty value,
 * as Entra sends a manager taken away.
 */
function managerValueOf (value: unknown): string | null | undefined {
  if (value === undefined) return undefined
  if (value === null || value === '') return null
  if (typeof value === 'string') return value
  if (Array.isArray(value)) {
    if (value.length > 1) throw invalidValue('manager is one user, not a list.')
    return value.length === 0 ? null : managerValueOf(value[0])
  }
  if (!isObject(value)) throw invalidValue('manager must be an object with the manager\'s id as its value.')
  const id = attr(value, 'value')
  if (id === undefined || id === null || id === '') return null
  if (typeof id !== 'string') throw invalidValue('manager.value must be a string.')
  if (id.length > 255) throw invalidValue('manager.value is longer than 255 characters.')
  return id
}

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

/**
 * The password a resource carries (Okta sends one when its "Sync Password"
 * is on): it is write-only and never part of a resource read back.
 */
function passwordOf (resource: Resource): string | undefined {
  const password = attr(resource, 'password')
  if (password === undefined || password === null) return undefined
  if (typeof password !== 'string' || password === '') throw invalidValue('password must be a string.')
  return password
}

function withoutPassword (resource: Resource): Resource {
  return Object.fromEntries(Object.entries(resource).filter(([key]) => key.toLowerCase() !== 'password'))
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

const CORE_USER_PREFIX = `${URN.user}:`.toLowerCase()
const CORE_PREFIXES = [CORE_USER_PREFIX, `${URN.group}:`.toLowerCase()]
const ENTERPRISE_PREFIX = `${URN.enterpriseUser}:`.toLowerCase()

/** An attribute path as its top-level key and first sub-attribute: `urn:…:enterprise:2.0:User:department` is the extension's `department`. */
function topAndSub (path: string): [string, string | undefined] {
  const lower = path.toLowerCase()
  if (lower === URN.enterpriseUser.toLowerCase()) return [URN.enterpriseUser, undefined]
  if (lower.startsWith(ENTERPRISE_PREFIX)) return [URN.enterpriseUser, path.slice(ENTERPRISE_PREFIX.length).split('.')[0]]
  return path.split('.', 2) as [string, string | undefined]
}

/** `attributes` / `excludedAttributes` (RFC 7644 §3.4.2.5): `id` and `schemas` are always returned. */
export function project (resource: Resource, attributes: string | undefined, excluded: string | undefined): Resource {
  const list = (text: string | undefined): string[] => (text ?? '').split(',').map(s => s.trim()).filter(s => s !== '')
    .map(s => s.slice(CORE_PREFIXES.find(prefix => s.toLowerCase().startsWith(prefix))?.length ?? 0))
  const wanted = list(attributes)
  const unwanted = list(excluded)
  const findKey = (object: Resource, name: string): string | undefined => Object.keys(object).find(k => k.toLowerCase() === name.toLowerCase())
  if (wanted.length > 0) {
    const out: Resource = { schemas: resource.schemas, id: resource.id }
    for (const path of wanted) {
      const bracket = /^([^[]+)\[(.+)\]$/.exec(path)
      if (bracket !== null) {
        const key = findKey(resource, bracket[1]!)
        const values = key !== undefined ? resource[key] : undefined
        if (!Array.isArray(values)) continue
        let test: (r: unknown) => boolean
        try {
          test = matches(parseFilter(bracket[2]!))
        } catch {
          throw new AppError('invalid_filter', 400, `The attribute "${path}" has a value filter that cannot be parsed.`)
        }
        const kept = values.filter(v => test(v))
        if (kept.length > 0) out[key!] = [...((out[key!] as unknown[] | undefined) ?? []), ...kept]
        continue
      }
      const [top, sub] = topAndSub(path)
      const key = findKey(resource, top)
      if (key === undefined) continue
      const value = resource[key]
      if (sub === undefined) {
        out[key] = value
      } else if (isObject(value)) {
        const subKey = findKey(value, sub)
        if (subKey !== undefined) out[key] = { ...(out[key] as Resource | undefined), [subKey]: value[subKey] }
      } else if (Array.isArray(value)) {
        out[key] = value.map(v => isObject(v) ? Object.fromEntries(Object.entries(v).filter(([k]) => k.toLowerCase() === sub.toLowerCase())) : v)
      }
    }
    return out
  }
  if (unwanted.length === 0) return resource
  const out: Resource = { ...resource }
  for (const path of unwanted) {
    const [top, sub] = topAndSub(path)
    const key = findKey(out, top)
    if (key === undefined || key === 'id' || key === 'schemas') continue
    if (sub === undefined) {
      delete out[key]
    } else if (isObject(out[key])) {
      const object = { ...(out[key] as Resource) }
      const subKey = findKey(object, sub)
      if (subKey !== undefined) delete object[subKey]
      out[key] = object
    }
  }
  return out
}

export interface ScimAnswer { resource: Resource, version: number }

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
  // A provisioning key must not be a way into an admin account: it may disable or delete one
  // (a leaver), but their sign-in names and password are changed in gatehouse only.
  if (current.role === 'admin') {
    const touches = [
      changes.username !== undefined && changes.username !== current.username ? 'userName' : undefined,
      changes.email !== undefined && changes.email !== current.email ? 'emails' : undefined,
      passwordHash !== undefined ? 'password' : undefined
    ].filter(field => field !== undefined)
    if (touches.length > 0) {
      throw new AppError('forbidden', 403, `${current.username} is an admin: their ${touches.join(', ')} can be changed in gatehouse, not through SCIM (SCIM may disable or delete them).`)
    }
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

/** Attribute names as /Schemas spells them, by their lower case: paths and keys are matched ignoring case. */
const CANONICAL = new Map(['userName', 'name', 'givenName', 'familyName', 'formatted', 'displayName', 'externalId', 'active', 'emails',
  'value', 'type', 'primary', 'display', 'groups', 'members', 'id', 'schemas', 'meta'].map(n => [n.toLowerCase(), n]))

/** The enterprise extension's attribute names, by their lower case. */
const ENTERPRISE_CANONICAL = new Map(['employeeNumber', 'costCenter', 'organization', 'division', 'department', 'manager', 'value', '$ref', 'displayName']
  .map(n => [n.toLowerCase(), n]))

function canonicalPath (path: string): string {
  let text = path.trim()
  // `urn:…:enterprise:2.0:User:manager.value` in any case: the URN as the resource's key spells it, then the names.
  if (text.toLowerCase().startsWith(ENTERPRISE_PREFIX)) {
    return `${URN.enterpriseUser}:${text.slice(ENTERPRISE_PREFIX.length).split('.').map(n => ENTERPRISE_CANONICAL.get(n.toLowerCase()) ?? n).join('.')}`
  }
  if (text.toLowerCase().startsWith(CORE_USER_PREFIX)) text = text.slice(CORE_USER_PREFIX.length)
  // Identifiers outside quoted strings; a quoted value inside a filter is left as sent.
  return text.split(/("(?:[^"\\]|\\.)*")/).map((part, i) => i % 2 === 1
    ? part
    : part.replace(/[A-Za-z][A-Za-z0-9_$-]*/g, word => CANONICAL.get(word.toLowerCase()) ?? word)).join('')
}

/**
 * A path-less add or replace: its value's keys are paths too (Entra sends
 * `{"name.givenName": "…"}`). The enterprise extension as an object (Okta's
 * `{"urn:…:enterprise:2.0:User": {"department": "…"}}`) becomes one path per
 * attribute it names: the attributes it leaves out stay as they are
 * (RFC 7644 §3.5.2.3), and scim-patch would read the URN itself as a path.
 */
function canonicalValue (value: unknown): unknown {
  if (!isObject(value)) return value
  return Object.fromEntries(Object.entries(value).flatMap(([key, v]): Array<[string, unknown]> => {
    if (key.toLowerCase() !== URN.enterpriseUser.toLowerCase()) return [[canonicalPath(key), v]]
    if (v === null) return ENTERPRISE_ATTRIBUTES.map(name => [`${URN.enterpriseUser}:${name}`, null])
    if (!isObject(v)) throw invalidValue(`${URN.enterpriseUser} must be an object.`)
    return Object.entries(v).map(([name, sub]) => [canonicalPath(`${URN.enterpriseUser}:${name}`), sub])
  }))
}

const ENTERPRISE_ATTRIBUTES = ['employeeNumber', 'costCenter', 'organization', 'division', 'department', 'manager']
const MANAGER_PATH = `${URN.enterpriseUser}:manager`

/**
 * The operations of one PATCH operation on the enterprise extension, in the
 * forms scim-patch applies: a path that is the extension itself is one per
 * attribute, and a manager given as a bare id or a list of one (Entra) is
 * `{"value": "<id>"}`, and as null or empty a remove (Entra's clearing).
 */
function enterpriseOperations (op: 'add' | 'replace' | 'remove', path: string, value: unknown): ScimPatchOperation[] | undefined {
  if (path.toLowerCase() === URN.enterpriseUser.toLowerCase()) {
    if (op === 'remove' || value === null) return ENTERPRISE_ATTRIBUTES.map(name => ({ op: 'remove', path: `${URN.enterpriseUser}:${name}` }) as ScimPatchOperation)
    return [{ op, value: canonicalValue({ [URN.enterpriseUser]: value }) } as ScimPatchOperation]
  }
  if (path !== MANAGER_PATH || op === 'remove') return undefined
  const id = managerValueOf(value)
  return id == null ? [{ op: 'remove', path }] as ScimPatchOperation[] : [{ op: 'replace', path, value: { value: id } } as ScimPatchOperation]
}

/**
 * PATCH as Okta and Entra send it (RFC 7644 §3.5.2 and their quirks): op
 * names in any case, attribute names in any case, path-less replace with an
 * object, `add` on `emails[type eq "work"].value` creating the entry.
 * The operations are applied by scim-patch to the user's current resource;
 * the result is then stored as a PUT of it would be, so a PATCH can do
 * nothing a PUT cannot (and `active` as "False" is read as false there).
 */
export function patchedResource (resource: Resource, body: ScimPatchBody): Resource {
  const operations = body.Operations.flatMap((operation): ScimPatchOperation[] => {
    const op = operation.op.toLowerCase()
    if (op !== 'add' && op !== 'replace' && op !== 'remove') throw invalidValue(`"${operation.op}" is not a PATCH operation (add, replace or remove).`)
    const path = operation.path !== undefined && operation.path !== '' ? canonicalPath(operation.path) : undefined
    const enterprise = path !== undefined ? enterpriseOperations(op, path, operation.value) : undefined
    if (enterprise !== undefined) return enterprise
    if (op === 'remove') {
      if (path === undefined) throw new AppError('invalid_path', 400, 'A remove operation needs a path.')
      // A manager is removed whatever value names it (Entra may send the one it removes).
      if (path === MANAGER_PATH) return [{ op, path } as ScimPatchOperation]
      return [{ op, path, ...(operation.value !== undefined ? { value: operation.value } : {}) } as ScimPatchOperation]
    }
    return [{ op, ...(path !== undefined ? { path } : {}), value: path === undefined ? canonicalValue(operation.value) : operation.value } as ScimPatchOperation]
  })
  try {
    return scimPatch(structuredClone(resource) as never, operations, { mutateDocument: false, treatMissingAsAdd: true }) as Resource
  } catch (error) {
    if (error instanceof PatchError) throw new AppError(/path|target/i.test(error.message) ? 'invalid_path' : 'invalid_value', 400, error.message)
    throw error
  }
}

/** A password a PATCH sets (`path: "password"`, or a path-less replace with one), taken out of its operations. */
function splitPassword (body: ScimPatchBody): { password: string | undefined, body: ScimPatchBody } {
  let password: string | undefined
  const operations = body.Operations.flatMap(operation => {
    if (operation.path?.trim().toLowerCase() === 'password') {
      if (operation.op.toLowerCase() === 'remove') throw new AppError('invalid_path', 400, 'A password cannot be removed; set a new one or disable the user.')
      password = passwordOf({ password: operation.value })
      return []
    }
    if ((operation.path === undefined || operation.path === '') && isObject(operation.value) && attr(operation.value, 'password') !== undefined) {
      password = passwordOf(operation.value)
      const rest = withoutPassword(operation.value)
      return Object.keys(rest).length > 0 ? [{ ...operation, value: rest }] : []
    }
    return [operation]
  })
  return { password, body: { ...body, Operations: operations } }
}

export async function patchScimUser (db: Db, scim: ScimContext, id: string, body: ScimPatchBody, ifMatch: string | undefined): Promise<ScimAnswer> {
  const split = splitPassword(body)
  let passwordHash: string | undefined
  if (split.password !== undefined) {
    // The rules compare the password with the userName and addresses the user
    // will have: this PATCH applied to the user as read now, before the hash
    // (which must not hold a write lock).
    const stored = await findScimUserById(db, id)
    if (stored === undefined) throw notFound(id)
    const resource = userResource(stored, scim.baseUrl, [])
    passwordHash = await hashOf(scim, split.password, split.body.Operations.length > 0 ? patchedResource(resource, split.body) : resource)
  }
  return await db.transaction().execute(async trx => {
    const current = await findScimUserById(trx, id)
    if (current === undefined) throw notFound(id)
    const resource = userResource(current, scim.baseUrl, [])
    const patched = split.body.Operations.length > 0 ? patchedResource(resource, split.body) : resource
    // Groups are read-only on the user, and the meta block is the server's.
    delete patched.groups
    return await applyResource(trx, scim, current, patched, ifMatch, passwordHash)
  })
}

export async function deleteScimUser (db: Db, scim: ScimContext, id: string, ifMatch: string | undefined): Promise<void> {
  if (await findScimUserById(db, id) === undefined) throw notFound(id)
  await db.transaction().execute(async trx => {
    await deleteUserRecorded(trx, scim.ctx, id, { check: current => { assertIfMatch(ifMatch, current.version) } })
  })
}

export interface ScimListAnswer { totalResults: number, startIndex: number, itemsPerPage: number, Resources: Resource[] }

/** GET /Users: filter, sortBy/sortOrder, startIndex/count (RFC 7644 §3.4.2). */
/** The filter and paging of a list request; an unparsable filter is 400 invalidFilter. */
function listQueryOf (query: ScimListQuery): { filter: Filter | undefined, startIndex: number, count: number, descending: boolean } {
  let filter: Filter | undefined
  try {
    filter = query.filter !== undefined && query.filter.trim() !== '' ? parseScimFilter(query.filter) : undefined
  } catch (error) {
    if (error instanceof InvalidFilter) throw new AppError('invalid_filter', 400, error.message)
    throw error
  }
  // RFC 7644 §3.4.2.4: a startIndex below 1 is 1, a negative count is 0.
  const startIndex = Math.max(1, query.startIndex ?? 1)
  const count = Math.min(MAX_RESULTS, Math.max(0, query.count ?? DEFAULT_COUNT))
  return { filter, startIndex, count, descending: query.sortOrder?.toLowerCase() === 'descending' }
}

/** Runs a list query, turning a filter that names what cannot be filtered on into 400 invalidFilter. */
async function filtered<T> (list: () => Promise<T>): Promise<T> {
  try {
    return await list()
  } catch (error) {
    if (error instanceof InvalidFilter) throw new AppError('invalid_filter', 400, error.message)
    throw error
  }
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

function groupNotFound (id: string): AppError {
  return new AppError('group_not_found', 404, `No group has the id ${id}.`)
}

/** The Group resource of a row: core schema, members as user ids with their userName. */
export function groupResource (row: ScimGroupRow, baseUrl: string, members: ReadonlyArray<{ id: string, username: string }>): Resource {
  return {
    schemas: [URN.group],
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    displayName: row.display_name,
    members: members.map(member => ({ value: member.id, display: member.username, $ref: `${baseUrl}/Users/${member.id}` })),
    meta: {
      resourceType: 'Group',
      created: toIso(row.created_at),
      lastModified: toIso(row.updated_at),
      version: etagOf(row.version),
      location: `${baseUrl}/Groups/${row.id}`
    }
  }
}

async function readGroup (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  const row = await findScimGroupById(db, id)
  if (row === undefined) throw groupNotFound(id)
  const members = await findMembersOfGroups(db, [id])
  return { resource: groupResource(row, baseUrl, members.get(id) ?? []), version: row.version }
}

export async function getScimGroup (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  return await readGroup(db, id, baseUrl)
}

/**
 * The user ids a `members` value names: `[{"value": "<id>"}]`, or a bare id
 * string (Microsoft's collection sends one). Ids that are no user are passed
 * over: an identity provider pushes a group with members it has not
 * provisioned here (not assigned to the app), and refusing the whole change
 * would stop that group's memberships from syncing at all.
 */
async function memberIdsOf (db: Db, value: unknown): Promise<string[]> {
  if (value === undefined || value === null) return []
  const entries = Array.isArray(value) ? value : [value]
  const ids = entries.map((entry, i) => {
    const id = isObject(entry) ? attr(entry, 'value') : entry
    if (typeof id !== 'string') throw invalidValue(`members[${i}].value must be a user id.`)
    return id
  })
  return await findExistingUserIds(db, ids)
}

function displayNameOf (resource: Resource): string {
  const name = attr(resource, 'displayName')
  if (typeof name !== 'string' || name.trim() === '') throw invalidValue('displayName is required.')
  if (name.length > 64) throw invalidValue('displayName is longer than 64 characters (a group name is one of a user\'s groups).')
  return name
}

export async function createScimGroup (db: Db, scim: ScimContext, body: ScimResourceBody): Promise<ScimAnswer> {
  const displayName = displayNameOf(body)
  const externalId = optionalString(attr(body, 'externalId'), 'externalId', 255)
  return await db.transaction().execute(async trx => {
    const memberIds = await memberIdsOf(trx, attr(body, 'members'))
    const { group } = await createGroupRecorded(trx, scim.ctx, { display_name: displayName, external_id: externalId ?? null, member_ids: memberIds })
    return await readGroup(trx, group.id, scim.baseUrl)
  })
}

function groupIfMatch (ifMatch: string | undefined): (current: ScimGroupRow) => void {
  return current => {
    if (ifMatch === undefined) return
    const tags = ifMatch.split(',').map(t => t.trim().replace(/^W\//, ''))
    if (!tags.includes('*') && !tags.includes(`"${current.version}"`)) {
      throw new AppError('precondition_failed', 412, 'The group changed since you read it (If-Match does not match its version); read it again and retry.')
    }
  }
}

/** PUT: the name, external id and members become what the resource says (no members: none). */
export async function replaceScimGroup (db: Db, scim: ScimContext, id: string, body: ScimResourceBody, ifMatch: string | undefined): Promise<ScimAnswer> {
  const displayName = displayNameOf(body)
  const externalId = optionalString(attr(body, 'externalId'), 'externalId', 255)
  return await db.transaction().execute(async trx => {
    if (await findScimGroupById(trx, id) === undefined) throw groupNotFound(id)
    const memberIds = await memberIdsOf(trx, attr(body, 'members'))
    await changeGroupRecorded(trx, scim.ctx, id, { display_name: displayName, external_id: externalId ?? null }, { check: groupIfMatch(ifMatch) })
    await replaceGroupMembersRecorded(trx, scim.ctx, id, memberIds)
    return await readGroup(trx, id, scim.baseUrl)
  })
}

const MEMBER_FILTER = /^members\s*\[\s*value\s+eq\s+"([^"]*)"\s*\]$/i

/**
 * PATCH on a group, as Okta and Entra send it, each operation through the
 * group lifecycle: `add` members; `remove` with `members[value eq "<id>"]`,
 * or Entra's `{"op":"Remove","path":"members","value":[{"value":"<id>"}]}`,
 * which removes only those members (a path with no value removes them all);
 * `replace` of members, displayName or externalId, also path-less with an
 * object value.
 */
export async function patchScimGroup (db: Db, scim: ScimContext, id: string, body: ScimPatchBody, ifMatch: string | undefined): Promise<number> {
  return await db.transaction().execute(async trx => {
    const current = await findScimGroupById(trx, id)
    if (current === undefined) throw groupNotFound(id)
    groupIfMatch(ifMatch)(current)
    for (const operation of body.Operations) {
      const op = operation.op.toLowerCase()
      if (op !== 'add' && op !== 'replace' && op !== 'remove') throw invalidValue(`"${operation.op}" is not a PATCH operation (add, replace or remove).`)
      const rawPath = operation.path?.trim() ?? ''
      const path = rawPath.toLowerCase().startsWith(`${URN.group.toLowerCase()}:`) ? rawPath.slice(URN.group.length + 1) : rawPath
      const one = MEMBER_FILTER.exec(path)
      if (one !== null) {
        if (op !== 'remove') throw new AppError('invalid_path', 400, 'members[value eq "…"] is a path for remove; add members with the path members.')
        await removeGroupMembersRecorded(trx, scim.ctx, id, await findExistingUserIds(trx, [one[1]!]))
        continue
      }
      const values: Resource = path === '' ? (isObject(operation.value) ? operation.value : {}) : { [path]: operation.value }
      if (path === '' && !isObject(operation.value)) throw invalidValue(`A ${op} without a path takes an object of attributes.`)
      for (const [name, value] of Object.entries(values)) {
        switch (name.toLowerCase()) {
          case 'members': {
            if (op === 'add') await addGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            else if (op === 'replace') await replaceGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            else if (value === undefined || value === null) await replaceGroupMembersRecorded(trx, scim.ctx, id, [])
            else await removeGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            break
          }
          case 'displayname':
            if (op === 'remove') throw new AppError('invalid_value', 400, 'displayName is required; it cannot be removed.')
            await changeGroupRecorded(trx, scim.ctx, id, { display_name: displayNameOf({ displayName: value }) })
            break
          case 'externalid':
            await changeGroupRecorded(trx, scim.ctx, id, { external_id: op === 'remove' ? null : optionalString(value, 'externalId', 255) ?? null })
            break
          // Okta's rename sends the group's own id with the new name; an id is never changed.
          case 'id':
            if (value !== id) throw new AppError('invalid_value', 400, 'A group\'s id cannot be changed.')
            break
          case 'schemas':
            break
          default:
            throw new AppError('invalid_path', 400, `A group has no attribute "${name}" that can be changed (members, displayName, externalId).`)
        }
      }
    }
    return (await findScimGroupById(trx, id))!.version
  })
}

export async function deleteScimGroup (db: Db, scim: ScimContext, id: string, ifMatch: string | undefined): Promise<void> {
  await db.transaction().execute(async trx => {
    if (await findScimGroupById(trx, id) === undefined) throw groupNotFound(id)
    await deleteGroupRecorded(trx, scim.ctx, id, { check: groupIfMatch(ifMatch) })
  })
}

export async function listScimGroupsPage (db: Db, baseUrl: string, query: ScimListQuery): Promise<ScimListAnswer> {
  const { filter, startIndex, count, descending } = listQueryOf(query)
  const sortColumn = query.sortBy !== undefined ? groupSortColumnOf(query.sortBy) : 'display_name'
  if (sortColumn === undefined) throw invalidValue(`Groups cannot be sorted by "${query.sortBy!}".`)
  const page = await filtered(async () => await listScimGroups(db, { filter, sortColumn, descending, offset: startIndex - 1, limit: count }))
  // Entra asks with excludedAttributes=members when it only wants to know a group is there: no members are read then.
  const wantsMembers = !(query.excludedAttributes ?? '').split(',').some(a => a.trim().toLowerCase() === 'members')
  const members = wantsMembers ? await findMembersOfGroups(db, page.rows.map(row => row.id)) : new Map<string, Array<{ id: string, username: string }>>()
  const Resources = page.rows.map(row => project(groupResource(row, baseUrl, members.get(row.id) ?? []), query.attributes, query.excludedAttributes))
  return { totalResults: page.total, startIndex, itemsPerPage: Resources.length, Resources }
}
