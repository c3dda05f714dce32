/**
 * What the SCIM Users and Groups services share (data level, below both):
 * the context of a request, the reading of attributes whatever their case,
 * `attributes`/`excludedAttributes`, list paging and filters.
 */
import { filter as matches, parse as parseFilter } from 'scim2-parse-filter'
import type { RequestContext } from '../auth/principal.ts'
import { AppError } from '../errors.ts'
import type { PasswordOwner } from '../lib/password-policy.ts'
import { InvalidFilter, parseScimFilter, type Filter } from '../lib/scim-filter.ts'
import { DEFAULT_COUNT, MAX_RESULTS, URN, type ScimListQuery } from './scim.schemas.ts'

/** Who asked, where resources live (`meta.location`: the absolute URL of /scim/v2), and how a password is checked and hashed. */
export interface ScimContext {
  ctx: RequestContext
  baseUrl: string
  /** Applies the password rules (as the REST API does) and hashes; called before any transaction, as a hash takes milliseconds. */
  hashPassword: (password: string, owner: PasswordOwner) => Promise<string>
}

/** A SCIM resource as sent: an object of attributes. */
export type Resource = Record<string, unknown>

export function etagOf (version: number): string {
  return `W/"${version}"`
}

export function invalidValue (detail: string): AppError {
  return new AppError('invalid_value', 400, detail)
}

/** The value of an attribute whatever the case of its name (RFC 7643 §2.1). */
export function attr (resource: Resource, name: string): unknown {
  const wanted = name.toLowerCase()
  for (const [key, value] of Object.entries(resource)) {
    if (key.toLowerCase() === wanted) return value
  }
  return undefined
}

export function isObject (value: unknown): value is Resource {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** SCIM booleans, and the strings "True" and "False" that Entra sends for them. */
export function booleanOf (value: unknown, name: string): boolean {
  if (typeof value === 'boolean') return value
  if (typeof value === 'string' && /^(true|false)$/i.test(value)) return value.toLowerCase() === 'true'
  throw invalidValue(`${name} must be true or false.`)
}

export function optionalString (value: unknown, name: string, max: number): string | null | undefined {
  if (value === undefined) return undefined
  if (value === null || value === '') return null
  if (typeof value !== 'string') throw invalidValue(`${name} must be a string.`)
  if (value.length > max) throw invalidValue(`${name} is longer than ${max} characters.`)
  return value
}
/**
 * The id a `manager` names, in each form clients send it: `{"value": "<id>"}`
 * (RFC 7643), a bare id string (Entra's PATCH), or a list of one such object.
 * `null` clears it: null, an empty string, an empty list or an empty value,
 * as Entra sends a manager taken away.
 */
export function managerValueOf (value: unknown): string | null | undefined {
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

export const CORE_USER_PREFIX = `${URN.user}:`.toLowerCase()
const CORE_PREFIXES = [CORE_USER_PREFIX, `${URN.group}:`.toLowerCase()]
export const ENTERPRISE_PREFIX = `${URN.enterpriseUser}:`.toLowerCase()

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
export interface ScimListAnswer { totalResults: number, startIndex: number, itemsPerPage: number, Resources: Resource[] }

/** The filter and paging of a list request; an unparsable filter is 400 invalidFilter. */
export function listQueryOf (query: ScimListQuery): { filter: Filter | undefined, startIndex: number, count: number, descending: boolean } {
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
export async function filtered<T> (list: () => Promise<T>): Promise<T> {
  try {
    return await list()
  } catch (error) {
    if (error instanceof InvalidFilter) throw new AppError('invalid_filter', 400, error.message)
    throw error
  }
}
