import { scimPatch, ScimError as PatchError, type ScimPatchOperation } from 'scim-patch'
import { filter as matches, parse as parseFilter } from 'scim2-parse-filter'
import { toBool, toIso, toStringArray, type Db, type ScimEmail } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { nowIso } from '../lib/ids.ts'
import { InvalidFilter, parseScimFilter } from '../lib/scim-filter.ts'
import { changeUserRecorded, createUserRecorded, deleteUserRecorded, newUserRow, type UserChanges } from '../users/users.lifecycle.ts'
import type { UserRow } from '../users/users.repository.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'
import { findScimUserById, findUserIdByEmail, listScimUsers, sortColumnOf, type ScimUserRow } from './scim.repository.ts'
import { DEFAULT_COUNT, MAX_RESULTS, URN, type ScimListQuery, type ScimPatchBody, type ScimResourceBody } from './scim.schemas.ts'

/** Where resources live, for `meta.location`: the absolute URL of /scim/v2. */
export interface ScimContext { ctx: RequestContext, baseUrl: string }

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
}

function fieldsOf (resource: Resource): ResourceFields {
  if (attr(resource, 'password') !== undefined) {
    throw invalidValue('Passwords are not taken through SCIM (users sign in through single sign-on); turn password sync off in the identity provider.')
  }
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
    scim_emails: emailsOf(attr(resource, 'emails'))
  }
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
  const stored: ScimEmail[] = row.scim_emails === null ? [] : typeof row.scim_emails === 'string' ? JSON.parse(row.scim_emails) as ScimEmail[] : row.scim_emails
  // An address set through another door than SCIM is the primary one.
  if (row.email !== null && !stored.some(e => e.value.toLowerCase() === row.email!.toLowerCase())) {
    return [{ value: row.email, type: 'work', primary: true }, ...stored.map(e => ({ ...e, primary: false }))]
  }
  return stored
}

/** The User resource of a row: core schema, as /Schemas describes it. */
export function userResource (row: ScimUserRow, baseUrl: string): Resource {
  const name: Resource = {}
  if (row.formatted_name !== null) name.formatted = row.formatted_name
  if (row.last_name !== null) name.familyName = row.last_name
  if (row.first_name !== null) name.givenName = row.first_name
  const emails = emailsOfRow(row)
  const groups = toStringArray(row.groups)
  return {
    schemas: [URN.user],
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    userName: row.username,
    ...(Object.keys(name).length > 0 ? { name } : {}),
    ...(row.display_name !== null ? { displayName: row.display_name } : {}),
    active: !toBool(row.disabled),
    ...(emails.length > 0 ? { emails } : {}),
    ...(groups.length > 0 ? { groups: groups.map(group => ({ value: group, display: group })) } : {}),
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

/** `attributes` / `excludedAttributes` (RFC 7644 §3.4.2.5): `id` and `schemas` are always returned. */
export function project (resource: Resource, attributes: string | undefined, excluded: string | undefined): Resource {
  const list = (text: string | undefined): string[] => (text ?? '').split(',').map(s => s.trim()).filter(s => s !== '')
    .map(s => s.toLowerCase().startsWith(CORE_USER_PREFIX) ? s.slice(CORE_USER_PREFIX.length) : s)
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
      const [top, sub] = path.split('.', 2) as [string, string | undefined]
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
    const [top, sub] = path.split('.', 2) as [string, string | undefined]
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

export interface ScimUserAnswer { resource: Resource, version: number }

async function readUser (db: Db, id: string, baseUrl: string): Promise<ScimUserAnswer> {
  const row = await findScimUserById(db, id)
  if (row === undefined) throw notFound(id)
  return { resource: userResource(row, baseUrl), version: row.version }
}

export async function getScimUser (db: Db, id: string, baseUrl: string): Promise<ScimUserAnswer> {
  return await readUser(db, id, baseUrl)
}

/** Creates a user from a SCIM User: role `user`, no password (SCIM users sign in through single sign-on). */
export async function createScimUser (db: Db, scim: ScimContext, body: ScimResourceBody): Promise<ScimUserAnswer> {
  const fields = fieldsOf(body)
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
      scim_emails: fields.scim_emails
    }, null, false, now)
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
async function applyResource (trx: Db, scim: ScimContext, current: ScimUserRow, resource: Resource, ifMatch: string | undefined): Promise<ScimUserAnswer> {
  const fields = fieldsOf(resource)
  const changes: UserChanges = {
    username: fields.username,
    email: await gatehouseEmailOf(trx, fields.scim_emails, current.id),
    first_name: fields.first_name ?? null,
    last_name: fields.last_name ?? null,
    formatted_name: fields.formatted_name ?? null,
    display_name: fields.display_name ?? null,
    external_id: fields.external_id ?? null,
    scim_emails: fields.scim_emails,
    ...(fields.disabled !== undefined ? { disabled: fields.disabled } : {})
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

export async function replaceScimUser (db: Db, scim: ScimContext, id: string, body: ScimResourceBody, ifMatch: string | undefined): Promise<ScimUserAnswer> {
  return await db.transaction().execute(async trx => {
    const current = await findScimUserById(trx, id)
    if (current === undefined) throw notFound(id)
    return await applyResource(trx, scim, current, body, ifMatch)
  })
}

/** Attribute names as /Schemas spells them, by their lower case: paths and keys are matched ignoring case. */
const CANONICAL = new Map(['userName', 'name', 'givenName', 'familyName', 'formatted', 'displayName', 'externalId', 'active', 'emails',
  'value', 'type', 'primary', 'display', 'groups', 'members', 'id', 'schemas', 'meta'].map(n => [n.toLowerCase(), n]))

function canonicalPath (path: string): string {
  let text = path.trim()
  if (text.toLowerCase().startsWith(CORE_USER_PREFIX)) text = text.slice(CORE_USER_PREFIX.length)
  // Identifiers outside quoted strings; a quoted value inside a filter is left as sent.
  return text.split(/("(?:[^"\\]|\\.)*")/).map((part, i) => i % 2 === 1
    ? part
    : part.replace(/[A-Za-z][A-Za-z0-9_$-]*/g, word => CANONICAL.get(word.toLowerCase()) ?? word)).join('')
}

/** A path-less add or replace: its value's keys are paths too (Entra sends `{"name.givenName": "…"}`). */
function canonicalValue (value: unknown): unknown {
  if (!isObject(value)) return value
  return Object.fromEntries(Object.entries(value).map(([key, v]) => [canonicalPath(key), v]))
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
  const operations = body.Operations.map((operation): ScimPatchOperation => {
    const op = operation.op.toLowerCase()
    if (op !== 'add' && op !== 'replace' && op !== 'remove') throw invalidValue(`"${operation.op}" is not a PATCH operation (add, replace or remove).`)
    const path = operation.path !== undefined && operation.path !== '' ? canonicalPath(operation.path) : undefined
    if (op === 'remove') {
      if (path === undefined) throw new AppError('invalid_path', 400, 'A remove operation needs a path.')
      return { op, path, ...(operation.value !== undefined ? { value: operation.value } : {}) } as ScimPatchOperation
    }
    return { op, ...(path !== undefined ? { path } : {}), value: path === undefined ? canonicalValue(operation.value) : operation.value } as ScimPatchOperation
  })
  try {
    return scimPatch(structuredClone(resource) as never, operations, { mutateDocument: false, treatMissingAsAdd: true }) as Resource
  } catch (error) {
    if (error instanceof PatchError) throw new AppError(/path|target/i.test(error.message) ? 'invalid_path' : 'invalid_value', 400, error.message)
    throw error
  }
}

export async function patchScimUser (db: Db, scim: ScimContext, id: string, body: ScimPatchBody, ifMatch: string | undefined): Promise<ScimUserAnswer> {
  return await db.transaction().execute(async trx => {
    const current = await findScimUserById(trx, id)
    if (current === undefined) throw notFound(id)
    const resource = userResource(current, scim.baseUrl)
    const patched = patchedResource(resource, body)
    // Groups are read-only on the user, and the meta block is the server's.
    delete patched.groups
    return await applyResource(trx, scim, current, patched, ifMatch)
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
export async function listScimUsersPage (db: Db, baseUrl: string, query: ScimListQuery): Promise<ScimListAnswer> {
  let filter
  try {
    filter = query.filter !== undefined && query.filter.trim() !== '' ? parseScimFilter(query.filter) : undefined
  } catch (error) {
    if (error instanceof InvalidFilter) throw new AppError('invalid_filter', 400, error.message)
    throw error
  }
  const sortColumn = query.sortBy !== undefined ? sortColumnOf(query.sortBy) : 'created_at'
  if (sortColumn === undefined) throw invalidValue(`Users cannot be sorted by "${query.sortBy!}".`)
  // RFC 7644 §3.4.2.4: a startIndex below 1 is 1, a negative count is 0.
  const startIndex = Math.max(1, query.startIndex ?? 1)
  const count = Math.min(MAX_RESULTS, Math.max(0, query.count ?? DEFAULT_COUNT))
  let page
  try {
    page = await listScimUsers(db, { filter, sortColumn, descending: query.sortOrder?.toLowerCase() === 'descending', offset: startIndex - 1, limit: count })
  } catch (error) {
    if (error instanceof InvalidFilter) throw new AppError('invalid_filter', 400, error.message)
    throw error
  }
  const Resources = page.rows.map(row => project(userResource(row, baseUrl), query.attributes, query.excludedAttributes))
  return { totalResults: page.total, startIndex, itemsPerPage: Resources.length, Resources }
}
