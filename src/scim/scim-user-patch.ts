/**
 * A SCIM PATCH of a User, translated into operations scim-patch applies to
 * the user's resource. scim-patch walks a path name by name and writes what
 * it finds at the end, so a path sent as `constructor.prototype.x` or
 * `__proto__` wrote onto Object.prototype: every path and every key of a
 * path-less value is taken from the allow-list below, never as sent.
 */
import { scimPatch, ScimError as PatchError, type ScimPatchOperation } from 'scim-patch'
import { AppError } from '../errors.ts'
import { isPrototypeName } from '../lib/object-keys.ts'
import { attr, CORE_USER_PREFIX, ENTERPRISE_PREFIX, invalidValue, isObject, managerValueOf, type Resource } from './scim.resources.ts'
import { URN, type ScimPatchBody } from './scim.schemas.ts'

/**
 * The password a resource carries (Okta sends one when its "Sync Password"
 * is on): it is write-only and never part of a resource read back.
 */
export function passwordOf (resource: Resource): string | undefined {
  const password = attr(resource, 'password')
  if (password === undefined || password === null) return undefined
  if (typeof password !== 'string' || password === '') throw invalidValue('password must be a string.')
  return password
}

export function withoutPassword (resource: Resource): Resource {
  return Object.fromEntries(Object.entries(resource).filter(([key]) => key.toLowerCase() !== 'password'))
}

const byLowerCase = (names: readonly string[]): Map<string, string> => new Map(names.map(n => [n.toLowerCase(), n]))

/** What gatehouse keeps of a User (docs/scim.md, "The User resource"): attribute, and its sub-attributes, as /Schemas spells them. */
const KEPT = new Map<string, { name: string, subs?: Map<string, string>, filtered?: true }>([
  ['username', { name: 'userName' }],
  ['name', { name: 'name', subs: byLowerCase(['givenName', 'familyName', 'formatted']) }],
  ['displayname', { name: 'displayName' }],
  ['externalid', { name: 'externalId' }],
  ['active', { name: 'active' }],
  ['emails', { name: 'emails', subs: byLowerCase(['value', 'type', 'primary', 'display']), filtered: true }]
])

/**
 * Accepted and not kept: the rest of RFC 7643's User (§4.1), which Entra's
 * and Okta's default mappings send, and the attributes that are the
 * server's (`groups` is changed through /Groups). An operation on one is
 * left out; a name in neither list is refused.
 */
const NOT_KEPT = new Set(['id', 'schemas', 'meta', 'groups', 'nickname', 'profileurl', 'title', 'usertype', 'preferredlanguage', 'locale', 'timezone',
  'phonenumbers', 'ims', 'photos', 'addresses', 'entitlements', 'roles', 'x509certificates'])
const NAME_NOT_KEPT = new Set(['middlename', 'honorificprefix', 'honorificsuffix'])

export const ENTERPRISE_ATTRIBUTES = ['employeeNumber', 'costCenter', 'organization', 'division', 'department', 'manager']
const ENTERPRISE_KEPT = byLowerCase(ENTERPRISE_ATTRIBUTES)
const MANAGER_SUBS = byLowerCase(['value', '$ref', 'displayName'])
const MANAGER_PATH = `${URN.enterpriseUser}:manager`

/** The words a value filter on emails may hold outside its quoted values. */
const FILTER_WORDS = byLowerCase(['value', 'type', 'primary', 'display', 'eq', 'ne', 'co', 'sw', 'ew', 'gt', 'ge', 'lt', 'le', 'pr', 'and', 'or', 'not', 'true', 'false', 'null'])

const NAME = '[A-Za-z$][A-Za-z0-9_$-]*'
const CORE_PATH = new RegExp(`^(${NAME})(?:\\[([^\\]]*)\\])?(?:\\.(${NAME}))?$`)
const ENTERPRISE_PATH = new RegExp(`^(${NAME})(?:\\.(${NAME}))?$`)

function invalidPath (path: string, why: string): AppError {
  return new AppError('invalid_path', 400, `"${path}" is not a path of a User that can be changed: ${why}`)
}

/** A value filter (`emails[type eq "work"]`) with its attribute names as /Schemas spells them; any other name is refused. */
function canonicalFilter (filter: string, path: string): string {
  return filter.split(/("(?:[^"\\]|\\.)*")/).map((part, i) => i % 2 === 1
    ? part
    : part.replace(/[A-Za-z_$][A-Za-z0-9_$-]*/g, word => {
      const known = FILTER_WORDS.get(word.toLowerCase())
      if (known === undefined) throw invalidPath(path, `an emails filter names value, type, primary or display, not "${word}".`)
      return known
    })).join('')
}

function enterprisePath (path: string, rest: string): string {
  const parts = ENTERPRISE_PATH.exec(rest)
  const top = parts === null ? undefined : ENTERPRISE_KEPT.get(parts[1]!.toLowerCase())
  if (parts === null || top === undefined) throw invalidPath(path, `the enterprise extension keeps ${ENTERPRISE_ATTRIBUTES.join(', ')}.`)
  if (parts[2] === undefined) return `${URN.enterpriseUser}:${top}`
  const sub = top === 'manager' ? MANAGER_SUBS.get(parts[2].toLowerCase()) : undefined
  if (sub === undefined) throw invalidPath(path, `${top} has no sub-attribute "${parts[2]}".`)
  return `${URN.enterpriseUser}:${top}.${sub}`
}

/**
 * The path as scim-patch is given it, spelled as /Schemas spells it (paths
 * are matched ignoring case, RFC 7643 §2.1); undefined for an attribute
 * that is accepted and not kept. Anything else is 400 invalidPath.
 */
export function allowedPath (sent: string): string | undefined {
  const path = sent.trim()
  const lower = path.toLowerCase()
  if (lower === URN.enterpriseUser.toLowerCase()) return URN.enterpriseUser
  if (lower.startsWith(ENTERPRISE_PREFIX)) return enterprisePath(sent, path.slice(ENTERPRISE_PREFIX.length))
  const core = lower.startsWith(CORE_USER_PREFIX) ? path.slice(CORE_USER_PREFIX.length) : path
  // Another schema's extension (a provider's own): not kept, as long as no part of it is a prototype's name.
  if (core === path && lower.startsWith('urn:')) {
    if (path.split(/[:.[\]]/).some(isPrototypeName)) throw invalidPath(sent, 'a name in it is a prototype\'s.')
    return undefined
  }
  const parts = CORE_PATH.exec(core)
  if (parts === null) throw invalidPath(sent, 'an attribute, optionally [a filter] and .a sub-attribute.')
  const [, topName, filter, subName] = parts as unknown as [string, string, string | undefined, string | undefined]
  if (NOT_KEPT.has(topName.toLowerCase())) return undefined
  const top = KEPT.get(topName.toLowerCase())
  if (top === undefined) throw invalidPath(sent, 'gatehouse keeps userName, name, displayName, externalId, active, emails, password and the enterprise extension.')
  if (filter !== undefined && top.filtered !== true) throw invalidPath(sent, `${top.name} is not multi-valued.`)
  let canonical = filter !== undefined ? `${top.name}[${canonicalFilter(filter, sent)}]` : top.name
  if (subName !== undefined) {
    if (top.name === 'name' && NAME_NOT_KEPT.has(subName.toLowerCase())) return undefined
    const sub = top.subs?.get(subName.toLowerCase())
    if (sub === undefined) throw invalidPath(sent, `${top.name} has no sub-attribute "${subName}" that is kept.`)
    canonical += `.${sub}`
  }
  return canonical
}

/**
 * A path-less add or replace: its value's keys are paths too (Entra sends
 * `{"name.givenName": "…"}`), each taken from the allow-list. The enterprise
 * extension as an object (Okta's `{"urn:…:enterprise:2.0:User":
 * {"department": "…"}}`) becomes one path per attribute it names: the
 * attributes it leaves out stay as they are (RFC 7643 §3.5.2.3), and
 * scim-patch would read the URN itself as a path.
 */
function allowedValue (value: unknown, op: string): Resource {
  if (!isObject(value)) throw invalidValue(`A ${op} without a path takes an object of attributes.`)
  const entries = Object.entries(value).flatMap(([key, v]): Array<[string, unknown]> => {
    if (key.toLowerCase() !== URN.enterpriseUser.toLowerCase()) {
      const path = allowedPath(key)
      return path === undefined ? [] : [[path, v]]
    }
    if (v === null) return ENTERPRISE_ATTRIBUTES.map(name => [`${URN.enterpriseUser}:${name}`, null])
    if (!isObject(v)) throw invalidValue(`${URN.enterpriseUser} must be an object.`)
    return Object.entries(v).map(([name, sub]) => [enterprisePath(`${key}:${name}`, name), sub])
  })
  return Object.fromEntries(entries)
}

/**
 * The operations of one PATCH operation on the enterprise extension, in the
 * forms scim-patch applies: a path that is the extension itself is one per
 * attribute, and a manager given as a bare id or a list of one (Entra) is
 * `{"value": "<id>"}`, and as null or empty a remove (Entra's clearing).
 */
function enterpriseOperations (op: 'add' | 'replace' | 'remove', path: string, value: unknown): ScimPatchOperation[] | undefined {
  if (path === URN.enterpriseUser) {
    if (op === 'remove' || value === null) return ENTERPRISE_ATTRIBUTES.map(name => ({ op: 'remove', path: `${URN.enterpriseUser}:${name}` }) as ScimPatchOperation)
    return [{ op, value: allowedValue({ [URN.enterpriseUser]: value }, op) } as ScimPatchOperation]
  }
  if (path !== MANAGER_PATH || op === 'remove') return undefined
  const id = managerValueOf(value)
  return id == null ? [{ op: 'remove', path }] as ScimPatchOperation[] : [{ op: 'replace', path, value: { value: id } } as ScimPatchOperation]
}

function operationsOf (operation: ScimPatchBody['Operations'][number]): ScimPatchOperation[] {
  const op = operation.op.toLowerCase()
  if (op !== 'add' && op !== 'replace' && op !== 'remove') throw invalidValue(`"${operation.op}" is not a PATCH operation (add, replace or remove).`)
  if (operation.path === undefined || operation.path === '') {
    if (op === 'remove') throw new AppError('invalid_path', 400, 'A remove operation needs a path.')
    const value = allowedValue(operation.value, op)
    return Object.keys(value).length > 0 ? [{ op, value } as ScimPatchOperation] : []
  }
  const path = allowedPath(operation.path)
  if (path === undefined) return []
  const enterprise = enterpriseOperations(op, path, operation.value)
  if (enterprise !== undefined) return enterprise
  if (op === 'remove') {
    // A manager is removed whatever value names it (Entra may send the one it removes).
    if (path === MANAGER_PATH) return [{ op, path } as ScimPatchOperation]
    return [{ op, path, ...(operation.value !== undefined ? { value: operation.value } : {}) } as ScimPatchOperation]
  }
  return [{ op, path, value: operation.value } as ScimPatchOperation]
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
  const operations = body.Operations.flatMap(operationsOf)
  if (operations.length === 0) return resource
  try {
    return scimPatch(structuredClone(resource) as never, operations, { mutateDocument: false, treatMissingAsAdd: true }) as Resource
  } catch (error) {
    if (error instanceof PatchError) throw new AppError(/path|target/i.test(error.message) ? 'invalid_path' : 'invalid_value', 400, error.message)
    throw error
  }
}

/** A password a PATCH sets (`path: "password"`, or a path-less replace with one), taken out of its operations. */
export function splitPassword (body: ScimPatchBody): { password: string | undefined, body: ScimPatchBody } {
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
