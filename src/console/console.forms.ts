import { Ajv, type ErrorObject } from 'ajv'
import addFormats from 'ajv-formats'
import { AppError } from '../errors.ts'
import { lazyValidator } from '../lib/lazy-compile.ts'
import { passwordViolation, type PasswordPolicy } from '../lib/password-policy.ts'
import { SCOPES, type Scope } from '../auth/principal.ts'
import { ApiKeyCreate } from '../api-keys/api-keys.schemas.ts'
import { ListEventsQuery } from '../events/events.schemas.ts'
import { ListUsersQuery, UserCreate, UserPatch, type User } from '../users/users.schemas.ts'
import { ListAttemptsQuery, ListDeliveriesQuery, WebhookCreate } from '../webhooks/webhooks.schemas.ts'

/**
 * The console's forms become the API's own request shapes (UserCreate,
 * UserPatch, ApiKeyCreate, the list queries) and are checked against the
 * API's own schemas, so the console can accept nothing the API would refuse.
 * Failures come back per field, to be shown next to the field.
 */
// Built and compiled on first use: most processes never receive a console form.
let ajvs: { exact: Ajv, query: Ajv } | undefined
function compilers (): { exact: Ajv, query: Ajv } {
  if (ajvs === undefined) {
    const exact = new Ajv({ allErrors: true, strict: false, coerceTypes: false })
    addFormats.default(exact)
    const query = new Ajv({ allErrors: true, strict: false, coerceTypes: true })
    addFormats.default(query)
    ajvs = { exact, query }
  }
  return ajvs
}

const checkCreate = lazyValidator(() => compilers().exact.compile(UserCreate))
const checkPatch = lazyValidator(() => compilers().exact.compile(UserPatch))
const checkKey = lazyValidator(() => compilers().exact.compile(ApiKeyCreate))
const checkUsersQuery = lazyValidator(() => compilers().query.compile(ListUsersQuery))
const checkEventsQuery = lazyValidator(() => compilers().query.compile(ListEventsQuery))
const checkWebhook = lazyValidator(() => compilers().exact.compile(WebhookCreate))
const checkDeliveriesQuery = lazyValidator(() => compilers().query.compile(ListDeliveriesQuery))
const checkAttemptsQuery = lazyValidator(() => compilers().query.compile(ListAttemptsQuery))

/** Field name to what is wrong with it. */
export type FieldErrors = Record<string, string>

export type Fields = Record<string, unknown>

/** The one value of a form field; a field sent twice takes the first. */
export function text (fields: Fields, name: string): string {
  const value = fields[name]
  const first = Array.isArray(value) ? value[0] : value
  return typeof first === 'string' ? first : ''
}

function all (fields: Fields, name: string): string[] {
  const value = fields[name]
  const list = Array.isArray(value) ? value : value === undefined ? [] : [value]
  return list.filter((v): v is string => typeof v === 'string')
}

/** "analysts, ops" as a list: commas or new lines separate groups. */
export function parseGroups (value: string): string[] {
  return value.split(/[,\n]/).map(g => g.trim()).filter(g => g !== '')
}

/** What a pattern or format failure means for fields whose rule is not the username's. */
const PATTERN_TEXT: Record<string, string> = {
  url: 'must be an http:// or https:// URL',
  event_types: 'may contain * (every type), an event type such as user.created, or a prefix such as user.* only',
  description: 'must not contain control characters'
}

function describe (error: ErrorObject, field: string): string {
  if ((error.keyword === 'pattern' || error.keyword === 'format') && PATTERN_TEXT[field] !== undefined) return PATTERN_TEXT[field]
  const limit = error.params as { limit?: number, format?: string }
  switch (error.keyword) {
    case 'required': return 'is required'
    case 'format': return limit.format === 'email' ? 'is not an email address' : `is not a valid ${limit.format ?? 'value'}`
    case 'pattern': return 'may contain letters, digits and . _ @ - only'
    case 'maxLength': return `is too long (at most ${limit.limit} characters)`
    case 'minLength': return 'is required'
    case 'uniqueItems': return 'names the same entry twice'
    case 'maxItems': return `has too many entries (at most ${limit.limit})`
    case 'minItems': return 'needs at least one entry'
    case 'enum': case 'const': case 'anyOf': return 'is not one of the choices'
    default: return error.message ?? 'is not valid'
  }
}

function fieldErrors (errors: ErrorObject[] | null | undefined): FieldErrors {
  const out: FieldErrors = {}
  for (const error of errors ?? []) {
    const name = error.keyword === 'required'
      ? String((error.params as { missingProperty: string }).missingProperty)
      : error.instancePath.split('/')[1] ?? ''
    if (name !== '' && out[name] === undefined) out[name] = describe(error, name)
  }
  return out
}

export type Parsed<T> = { ok: true, value: T } | { ok: false, errors: FieldErrors }

/** The values a user form shows: what was typed, or the user as stored. */
export interface UserFormValues {
  username: string
  email: string
  first_name: string
  last_name: string
  role: 'admin' | 'user'
  groups: string
  disabled: boolean
}

export function formValuesOf (user: User): UserFormValues {
  return {
    username: user.username,
    email: user.email ?? '',
    first_name: user.first_name ?? '',
    last_name: user.last_name ?? '',
    role: user.role,
    groups: user.groups.join(', '),
    disabled: user.disabled
  }
}

export function formValuesFrom (fields: Fields): UserFormValues {
  return {
    username: text(fields, 'username').trim(),
    email: text(fields, 'email').trim(),
    first_name: text(fields, 'first_name').trim(),
    last_name: text(fields, 'last_name').trim(),
    role: text(fields, 'role') === 'admin' ? 'admin' : 'user',
    groups: text(fields, 'groups'),
    disabled: text(fields, 'disabled') !== ''
  }
}

const FORM_FIELDS = ['username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled'] as const
export type FormField = typeof FORM_FIELDS[number]

/**
 * The fields an identity provider keeps for a user it provisions through
 * SCIM (userName, emails, name, active): read-only in the console, whose
 * change its next sync would overwrite. Role, groups and password stay.
 */
export const SCIM_OWNED_FIELDS: readonly FormField[] = ['username', 'email', 'first_name', 'last_name', 'disabled']

/** How a form field is named in a sentence. */
export const FIELD_NAMES: Record<FormField, string> = {
  username: 'the username', email: 'the email', first_name: 'the first name', last_name: 'the last name', role: 'the role', groups: 'the groups', disabled: 'whether the account is disabled'
}

/**
 * The values the edit form was filled with (`was_*` hidden fields), i.e. the
 * version the admin read; undefined when the form did not carry them.
 */
export function originalValuesFrom (fields: Fields): UserFormValues | undefined {
  if (fields.was_username === undefined) return undefined
  const values = formValuesFrom(Object.fromEntries(FORM_FIELDS.map(name => [name, fields[`was_${name}`]])))
  values.disabled = text(fields, 'was_disabled') === 'true'
  return values
}

function comparable (field: FormField, values: UserFormValues): string {
  return field === 'groups' ? parseGroups(values.groups).join(',') : String(values[field])
}

/** The fields whose values differ between two fillings of the form. */
export function changedFields (a: UserFormValues, b: UserFormValues): FormField[] {
  return FORM_FIELDS.filter(field => comparable(field, a) !== comparable(field, b))
}

/**
 * The form's other problems, with the password's (which the service would
 * only report once they are fixed): all shown at once, as the API reports them.
 */
function withPasswordRule (errors: FieldErrors, password: string, values: UserFormValues, policy: PasswordPolicy): FieldErrors {
  if (password === '' || errors.password !== undefined) return errors
  const broken = passwordViolation(password, { username: values.username === '' ? undefined : values.username, emails: [values.email === '' ? undefined : values.email] }, policy)
  return broken === undefined ? errors : { ...errors, password: broken.detail.replace(/\.$/, '') }
}

/** A new user from the create form; empty optional fields are left out, so the API's defaults apply. */
export function parseCreate (fields: Fields, policy: PasswordPolicy): Parsed<UserCreate> {
  const values = formValuesFrom(fields)
  const password = text(fields, 'password')
  const input: Record<string, unknown> = { username: values.username, role: text(fields, 'role') || 'user', groups: parseGroups(values.groups), disabled: values.disabled }
  if (values.email !== '') input.email = values.email
  if (values.first_name !== '') input.first_name = values.first_name
  if (values.last_name !== '') input.last_name = values.last_name
  if (password !== '') input.password = password
  if (text(fields, 'invite') === 'true') input.invite = true
  return checkCreate(input) ? { ok: true, value: input as UserCreate } : { ok: false, errors: withPasswordRule(fieldErrors(checkCreate.errors), password, values, policy) }
}

/**
 * The edit form as a merge patch of the fields the admin changed from the
 * version they read: an emptied field clears it, an empty password leaves the
 * password alone.
 */
export function parsePatch (fields: Fields, policy: PasswordPolicy): Parsed<UserPatch> {
  const values = formValuesFrom(fields)
  const original = originalValuesFrom(fields)
  const password = text(fields, 'password')
  const patch: Record<string, unknown> = {
    username: values.username,
    email: values.email === '' ? null : values.email,
    first_name: values.first_name === '' ? null : values.first_name,
    last_name: values.last_name === '' ? null : values.last_name,
    role: text(fields, 'role'),
    groups: parseGroups(values.groups),
    disabled: values.disabled
  }
  if (password !== '') patch.password = password
  if (!checkPatch(patch)) return { ok: false, errors: withPasswordRule(fieldErrors(checkPatch.errors), password, values, policy) }
  // Only what the admin changed goes into the merge patch, so fields they did not touch are never written back.
  if (original !== undefined) {
    const changed = new Set<string>(changedFields(values, original))
    for (const field of FORM_FIELDS) if (!changed.has(field)) delete patch[field]
  }
  return { ok: true, value: patch as UserPatch }
}

/** A `datetime-local` value (a wall-clock time without a zone) read as UTC, which the forms say; undefined if it is not one. */
function utcOfLocalInput (value: string): string | undefined {
  const match = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2}(?:\.\d{1,3})?)?$/.exec(value)
  const at = match !== null ? new Date(`${match[1]!}T${match[2]!}${match[3] ?? ':00'}Z`) : undefined
  return at === undefined || Number.isNaN(at.getTime()) ? undefined : at.toISOString()
}

export function parseKey (fields: Fields): Parsed<ApiKeyCreate> & { expires: string } {
  const expires = text(fields, 'expires_at').trim()
  const input: Record<string, unknown> = { name: text(fields, 'name').trim() }
  const scopes = all(fields, 'scopes').filter((s): s is Scope => (SCOPES as readonly string[]).includes(s))
  if (scopes.length > 0) input.scopes = [...new Set(scopes)]
  if (expires !== '') {
    const at = utcOfLocalInput(expires)
    if (at === undefined) return { ok: false, errors: { expires_at: 'is not a date and time' }, expires }
    input.expires_at = at
  }
  if (!checkKey(input)) return { ok: false, errors: fieldErrors(checkKey.errors), expires }
  return { ok: true, value: input as ApiKeyCreate, expires }
}

/** What the webhook form was filled with, to show again. */
export interface WebhookFormValues { url: string, event_types: string, description: string }

export function webhookValuesFrom (fields: Fields): WebhookFormValues {
  return { url: text(fields, 'url').trim(), event_types: text(fields, 'event_types'), description: text(fields, 'description').trim() }
}

/** A new endpoint from the form: patterns separated by commas, spaces or new lines; none means every event, as in the API. */
export function parseWebhook (fields: Fields): Parsed<WebhookCreate> {
  const values = webhookValuesFrom(fields)
  const input: Record<string, unknown> = { url: values.url }
  const types = values.event_types.split(/[\s,]+/).filter(t => t !== '')
  if (types.length > 0) input.event_types = types
  if (values.description !== '') input.description = values.description
  return checkWebhook(input) ? { ok: true, value: input as WebhookCreate } : { ok: false, errors: fieldErrors(checkWebhook.errors) }
}

function parseQuery<T> (check: ((data: unknown) => boolean) & { errors?: ErrorObject[] | null }, query: unknown, keep: readonly string[]): T {
  const input: Record<string, unknown> = {}
  for (const [name, value] of Object.entries((query ?? {}) as Record<string, unknown>)) {
    // An empty filter field means "any"; names the page does not use are ignored.
    if (keep.includes(name) && typeof value === 'string' && value.trim() !== '') input[name] = value.trim()
  }
  if (!check(input)) {
    const errors = fieldErrors(check.errors)
    throw new AppError('validation_failed', 422, `These filters are not valid: ${Object.entries(errors).map(([n, d]) => `${n} ${d}`).join('; ')}.`)
  }
  return input as T
}

export const USER_QUERY_FIELDS = ['q', 'role', 'group', 'disabled', 'sort', 'cursor'] as const

export function parseUsersQuery (query: unknown): ListUsersQuery {
  return parseQuery<ListUsersQuery>(checkUsersQuery, query, USER_QUERY_FIELDS)
}

/** The events page's filters as typed: who by username or id, and a time range in UTC. */
export interface EventsFilterValues { type: string, actor: string, target: string, from: string, to: string }

export interface EventsFilter {
  values: EventsFilterValues
  /** The API's own filters that need no look-up: type, the time range and the page. */
  query: Pick<ListEventsQuery, 'type' | 'since' | 'until' | 'cursor'>
  errors: FieldErrors
}

/**
 * The events page's query. `actor` and `target` stay as typed (a username or
 * an id), to be resolved by the caller; `from` and `to` are `datetime-local`
 * values read as UTC, `from` included and `to` not, as the API's `since` and
 * `until`. `actor_id` and `target_id`, the page's earlier names, still work.
 */
export function parseEventsFilter (query: unknown): EventsFilter {
  const q = (query ?? {}) as Record<string, unknown>
  const one = (name: string): string => text(q, name).trim()
  const values: EventsFilterValues = {
    type: one('type'),
    actor: one('actor') || one('actor_id'),
    target: one('target') || one('target_id'),
    from: one('from'),
    to: one('to')
  }
  const errors: FieldErrors = {}
  const since = values.from !== '' ? utcOfLocalInput(values.from) : undefined
  const until = values.to !== '' ? utcOfLocalInput(values.to) : undefined
  if (values.from !== '' && since === undefined) errors.from = 'is not a date and time'
  if (values.to !== '' && until === undefined) errors.to = 'is not a date and time'
  if (since !== undefined && until !== undefined && until <= since) errors.to = 'must be later than From'
  for (const name of ['actor', 'target'] as const) if (values[name].length > 64) errors[name] = 'is too long (at most 64 characters)'
  const checked = parseQuery<ListEventsQuery>(checkEventsQuery, { type: values.type, cursor: one('cursor') }, ['type', 'cursor'])
  return {
    values,
    query: { ...checked, ...(since !== undefined ? { since } : {}), ...(until !== undefined ? { until } : {}) },
    errors
  }
}

/** An endpoint page's query: the deliveries' filter and page (`status`, `cursor`) and the attempts' page (`attempts_cursor`). */
export function parseWebhookQuery (query: unknown): { deliveries: ListDeliveriesQuery, attemptsCursor: string | undefined } {
  const deliveries = parseQuery<ListDeliveriesQuery>(checkDeliveriesQuery, query, ['status', 'cursor'])
  const attemptsCursor = (query as Record<string, unknown> | undefined)?.attempts_cursor
  const attempts = parseQuery<ListAttemptsQuery>(checkAttemptsQuery, typeof attemptsCursor === 'string' ? { cursor: attemptsCursor } : {}, ['cursor'])
  return { deliveries, attemptsCursor: attempts.cursor }
}

/** Where each error code of the users service belongs on the form. */
export function fieldOfError (error: AppError): string | undefined {
  if (error.code === 'username_taken') return 'username'
  if (error.code === 'email_taken') return 'email'
  if (error.code.startsWith('password_')) return 'password'
  return undefined
}
