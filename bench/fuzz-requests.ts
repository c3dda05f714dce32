/**
 * The fuzzer's generator and runner, shared by `npm run fuzz` (bench/fuzz.ts,
 * 100,000 requests against a server process) and the seeded run in
 * test/fuzz.test.ts (a server built in the test). It lives in bench/ because
 * it is load-generating tooling like the rest of bench/; the test imports it,
 * and nothing here imports from test/ or src/, so it runs against any
 * gatehouse reachable over HTTP.
 *
 * Every request is derived from the OpenAPI document the server publishes
 * (plus the few server-rendered pages it hides from it), with fast-check
 * arbitraries seeded by `seed + index`: request N of a seed is always the same
 * recipe. Ids of resources the run created are filled in when the request is
 * sent, so they depend on what the server answered before.
 */
import { createServer, request as httpRequest, Agent } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import fc from 'fast-check'
import { bodyGenerators, scimQueryGenerators } from './fuzz-generators.ts'

// ---------------------------------------------------------------- settings of the server under test

/**
 * Settings for the server under test, so that requests reach the handlers
 * instead of the sign-in throttles and the request limit (which would answer
 * most of them with 429), and so that TOTP and webhooks on loopback can be
 * exercised. Exported as environment variables for a server process and as
 * the matching config fields for one built in-process.
 */
export const FUZZ_SERVER_ENV: Record<string, string> = {
  LOGIN_MAX_FAILURES_PER_ACCOUNT: '1000000000',
  LOGIN_MAX_FAILURES_PER_ADDRESS: '1000000000',
  LOGIN_FAILURE_WINDOW_S: '1',
  ACCOUNT_LOCK_THRESHOLD: '1000000000',
  ACCOUNT_LOCK_S: '1',
  MFA_MAX_FAILURES: '1000000000',
  RATE_LIMIT_PER_CREDENTIAL: '0',
  RATE_LIMIT_PER_ADDRESS: '0',
  WEBHOOK_ALLOW_PRIVATE: 'true',
  // Webhooks point at a port nobody listens on; retries must not pile up during the run.
  WEBHOOK_RETRY_BASE_MS: '600000',
  MFA_ENCRYPTION_KEY: '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef',
  // Hostile bodies must not queue behind each other's password hashes long enough to get 503 server_busy.
  HASH_QUEUE_LIMIT: '1000'
}

export const FUZZ_CONFIG_OVERRIDES = {
  loginMaxFailuresPerAccount: 1_000_000_000,
  loginMaxFailuresPerAddress: 1_000_000_000,
  loginFailureWindowMs: 1000,
  accountLockThreshold: 1_000_000_000,
  accountLockMs: 1000,
  mfaMaxFailures: 1_000_000_000,
  rateLimitPerCredential: 0,
  rateLimitPerAddress: 0,
  webhookAllowPrivate: true,
  webhookRetryBaseMs: 600_000,
  mfaEncryptionKey: Buffer.from(FUZZ_SERVER_ENV.MFA_ENCRYPTION_KEY!, 'hex'),
  hashQueueLimit: 1000
}

/** The admin user whose sessions the cookie-authenticated requests use. */
export const FUZZ_ADMIN_USERNAME = 'fuzz_admin'
// Also the seeded users' password: it must not contain a piece of their addresses (fuzz_…@example.com), which the password rules refuse.
export const FUZZ_ADMIN_PASSWORD = 'correct horse battery staple at random'

// ---------------------------------------------------------------- operations

type Schema = Record<string, any>

export interface Parameter { in: 'path' | 'query' | 'header', name: string, required: boolean, schema: Schema }

export interface Operation {
  method: string
  /** The path template, e.g. /auth/api/users/{user_id}. */
  template: string
  parameters: Parameter[]
  /** Declared request bodies by content type; empty when the operation takes none. */
  bodies: Array<{ contentType: string, schema: Schema }>
  /** The body's named schema (`ScimPatchOp`, `InvitationAcceptance`, …), which may have a generator of its own (BODY_GENERATORS). */
  bodySchemaName?: string
  secured: boolean
  /** A SCIM operation: its credential is a `scim` key (security scheme ScimBearer), its errors SCIM's error body. */
  scim?: boolean
}

/** Follows local $refs (#/components/...), so generators see plain schemas. */
function resolve (doc: Schema, schema: Schema | undefined, depth = 0): Schema {
  if (schema === undefined || schema === null || typeof schema !== 'object' || depth > 20) return {}
  if (typeof schema.$ref === 'string' && schema.$ref.startsWith('#/')) {
    let target: any = doc
    for (const part of schema.$ref.slice(2).split('/')) target = target?.[part.replace(/~1/g, '/').replace(/~0/g, '~')]
    return resolve(doc, target, depth + 1)
  }
  if (Array.isArray(schema)) return schema.map(s => resolve(doc, s, depth + 1)) as unknown as Schema
  const out: Schema = {}
  for (const [key, value] of Object.entries(schema)) {
    out[key] = value !== null && typeof value === 'object' && key !== 'enum' && key !== 'const' && key !== 'examples' && key !== 'example'
      ? (key === 'properties' ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolve(doc, v as Schema, depth + 1)])) : resolve(doc, value as Schema, depth + 1))
      : value
  }
  return out
}

/** Every operation of the OpenAPI document. */
export function operationsFrom (doc: Schema): Operation[] {
  const operations: Operation[] = []
  for (const [template, item] of Object.entries<Schema>(doc.paths ?? {})) {
    for (const method of ['get', 'post', 'put', 'patch', 'delete']) {
      const op = item[method]
      if (op === undefined) continue
      const parameters = [...(item.parameters ?? []), ...(op.parameters ?? [])]
        .map((p: Schema) => resolve(doc, p))
        .filter((p: Schema) => p.in === 'path' || p.in === 'query' || p.in === 'header')
        .map((p: Schema) => ({ in: p.in, name: p.name, required: p.required === true, schema: p.schema ?? {} }))
      const content = op.requestBody?.content ?? {}
      const bodies = Object.entries<Schema>(content).map(([contentType, media]) => ({ contentType, schema: resolve(doc, media.schema) }))
      const secured = Array.isArray(op.security) ? op.security.some((s: Schema) => Object.keys(s).length > 0) : true
      const scim = Array.isArray(op.security) && op.security.some((s: Schema) => 'ScimBearer' in s)
      const ref = Object.values<Schema>(content)[0]?.schema?.$ref
      const bodySchemaName = typeof ref === 'string' ? ref.split('/').pop() : undefined
      operations.push({ method: method.toUpperCase(), template, parameters, bodies, secured, ...(bodySchemaName !== undefined ? { bodySchemaName } : {}), ...(scim ? { scim } : {}) })
    }
  }
  return operations
}

/**
 * The server-rendered pages (sign-in, MFA, account, console, OIDC redirects),
 * which the OpenAPI document hides: their inputs are forms and query strings
 * of plain strings.
 */
export function pageOperations (basePath: string): Operation[] {
  const text = { type: 'string' }
  const query = (...names: string[]): Parameter[] => names.map(name => ({ in: 'query', name, required: false, schema: text }))
  const path = (...names: string[]): Parameter[] => names.map(name => ({ in: 'path', name, required: true, schema: text }))
  const form = (...names: string[]): Operation['bodies'] => [{
    contentType: 'application/x-www-form-urlencoded',
    schema: { type: 'object', properties: Object.fromEntries(names.map(n => [n, text])) }
  }]
  const page = (method: string, template: string, parameters: Parameter[] = [], bodies: Operation['bodies'] = []): Operation =>
    ({ method, template: basePath + template, parameters, bodies, secured: true })
  return [
    page('GET', '/login', query('next', 'error')),
    page('POST', '/login', query('next'), form('username', 'password', 'next')),
    page('POST', '/logout', [], form('next')),
    page('GET', '/login/passkey', query('next')),
    page('POST', '/login/passkey', [], form('challenge_token', 'credential', 'next')),
    page('POST', '/login/mfa', [], form('challenge_token', 'code', 'next', 'method')),
    page('GET', '/account'),
    page('POST', '/account/totp', [], form()),
    page('POST', '/account/totp/confirm', [], form('code')),
    page('POST', '/account/totp/remove', [], form()),
    page('POST', '/account/passkeys', [], form('credential', 'name')),
    page('POST', '/account/recovery-codes', [], form()),
    page('GET', '/sso/{provider_id}/start', [...path('provider_id'), ...query('next')]),
    page('GET', '/sso/{provider_id}/callback', [...path('provider_id'), ...query('code', 'state', 'error', 'iss')]),
    page('GET', '/admin'),
    page('GET', '/admin/users', query('q', 'limit', 'cursor', 'role', 'disabled', 'sort', 'group', 'notice')),
    page('GET', '/admin/users/new'),
    page('POST', '/admin/users', [], form('username', 'email', 'password', 'role', 'first_name', 'last_name', 'groups')),
    page('GET', '/admin/users/{user_id}', path('user_id')),
    page('POST', '/admin/users/{user_id}', path('user_id'), form('email', 'role', 'first_name', 'last_name', 'groups', 'version')),
    page('POST', '/admin/users/{user_id}/disable', path('user_id'), form()),
    page('POST', '/admin/users/{user_id}/enable', path('user_id'), form()),
    page('POST', '/admin/users/{user_id}/unlock', path('user_id'), form()),
    page('POST', '/admin/users/{user_id}/end-sessions', path('user_id'), form()),
    page('GET', '/admin/users/{user_id}/delete', path('user_id')),
    page('POST', '/admin/users/{user_id}/delete', path('user_id'), form('confirm')),
    page('GET', '/admin/api-keys', query('include_revoked')),
    page('POST', '/admin/api-keys', [], form('name', 'scopes', 'expires_at', 'user_id')),
    page('POST', '/admin/api-keys/{key_id}/revoke', path('key_id'), form()),
    page('POST', '/admin/api-keys/{key_id}/rotate', path('key_id'), form()),
    page('GET', '/admin/events', query('type', 'actor_id', 'target_id', 'since', 'until', 'limit', 'cursor')),
    page('GET', '/admin/webhooks'),
    page('POST', '/admin/webhooks', [], form('url', 'events', 'description')),
    page('GET', '/admin/webhooks/{webhook_id}', [...path('webhook_id'), ...query('status', 'cursor')]),
    page('POST', '/admin/webhooks/{webhook_id}/enable', path('webhook_id'), form()),
    page('POST', '/admin/webhooks/{webhook_id}/disable', path('webhook_id'), form()),
    page('POST', '/admin/webhooks/{webhook_id}/rotate', path('webhook_id'), form()),
    page('POST', '/admin/webhooks/{webhook_id}/ping', path('webhook_id'), form()),
    page('GET', '/admin/webhooks/{webhook_id}/delete', path('webhook_id')),
    page('POST', '/admin/webhooks/{webhook_id}/delete', path('webhook_id'), form()),
    page('POST', '/admin/webhooks/{webhook_id}/deliveries/{event_id}/retry', path('webhook_id', 'event_id'), form())
  ]
}

// ---------------------------------------------------------------- hostile values

/** Strings that have broken parsers, databases, headers and redirects somewhere. */
export const HOSTILE_STRINGS = [
  '', ' ', '\u0000', 'a\u0000b', '\ud800', 'x\udfffy', '\ud83d', '😀', '\u202e', 'admin\u202etxt.exe', '\u200b', '\ufeff',
  'é', 'Ünïcödé', '日本語', 'مرحبا', '\u0085', '\u2028', '\r\n', 'a\rb', 'a\nSet-Cookie: x=1', '\t',
  '%', '%%', '%00', '%ZZ', '%ud800', '%ED%A0%80', '%C0%AF', '%2e%2e%2f', '../../etc/passwd', '..', '.', '/', '//evil.example', '\\\\evil',
  'https://evil.example/', 'javascript:alert(1)', '/\\evil.example', '/%2F%2Fevil.example', '/\u3002evil',
  "'", '"', "' OR '1'='1", '; DROP TABLE users; --', '\\', '`', '$' + '{7*7}', '{{7*7}}', '<script>alert(1)</script>', '<>&',
  '*', '(', ')', '(uid=*)', '*)(uid=*', 'null', 'undefined', 'true', 'false', 'NaN', 'Infinity', '-Infinity', '1e309', '-1e309',
  '0', '-0', '-1', '1.5', '0x10', '1e3', '9007199254740993', '99999999999999999999999999999', '+1', ' 1', '1 ', '١٢٣',
  '__proto__', 'constructor', 'prototype', 'hasOwnProperty', 'toString',
  '00000000-0000-0000-0000-000000000000', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '01a1fdb3-9dfe-7788-bb28-0de1225a78e5',
  '2026-13-45T99:99:99Z', '0000-01-01T00:00:00Z', '9999-12-31T23:59:59.999Z', '275760-09-13T00:00:00.001Z', '1970-01-01', 'yesterday',
  'a@b', '@', 'a@', '@b', 'a@b.c', 'x@[127.0.0.1]', '"a b"@example.com',
  'gatehouse_', 'gatehouse_session_', 'gatehouse_' + 'a'.repeat(64), 'Bearer', 'Basic YWRtaW46YWRtaW4=',
  'a'.repeat(64), 'a'.repeat(65), 'a'.repeat(101), 'a'.repeat(201), 'a'.repeat(255), 'a'.repeat(257), 'a'.repeat(1025), 'a'.repeat(2049), 'é'.repeat(5000), '\ud800'.repeat(300)
]

export const HOSTILE_NUMBERS = [
  0, -0, 1, -1, 2, 1000, 1001, 999, 2 ** 31 - 1, 2 ** 31, -(2 ** 31) - 1, 2 ** 53, 2 ** 53 + 2, -(2 ** 53), 2 ** 63, 1e21, 1e300, -1e300,
  Number.MAX_VALUE, Number.MIN_VALUE, 0.5, 1.0000001, 1e-7
]

/** Number-like texts for places a number arrives as text (query, path, header, form). */
const HOSTILE_NUMBER_TEXTS = ['1e309', '-1e309', 'Infinity', '-Infinity', 'NaN', '1e1000', '0x1F', '0b11', '1_000', '1,000', '١', '1.', '.5', '+5', '-0', '00001', '1e-400', '18446744073709551616', '9'.repeat(400)]

// ---------------------------------------------------------------- values from schemas

const anyString = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom(...HOSTILE_STRINGS) },
  { weight: 4, arbitrary: fc.string({ unit: 'binary', maxLength: 40 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 20 }) },
  // Long values: past the field limits, the 16 KiB header limit (in a URL) and the 64 KiB body limit.
  { weight: 1, arbitrary: fc.constantFrom(300, 1100, 5000, 17_000, 70_000).map(n => 'x'.repeat(n)) }
)

function stringFor (schema: Schema): fc.Arbitrary<string> {
  const formatted: Record<string, fc.Arbitrary<string>> = {
    uuid: fc.uuid(),
    email: fc.emailAddress(),
    'date-time': fc.date({ min: new Date('1970-01-01'), max: new Date('2100-01-01'), noInvalidDate: true }).map(d => d.toISOString()),
    date: fc.date({ min: new Date('1970-01-01'), max: new Date('2100-01-01'), noInvalidDate: true }).map(d => d.toISOString().slice(0, 10)),
    uri: fc.constantFrom('http://127.0.0.1:9/hook', 'https://example.com/hook', 'https://127.0.0.1:9/cb', 'http://[::1]:9/', 'ftp://example.com/'),
    url: fc.constantFrom('http://127.0.0.1:9/hook', 'https://example.com/hook')
  }
  const options: Array<fc.Arbitrary<string>> = []
  if (Array.isArray(schema.enum)) options.push(fc.constantFrom(...schema.enum.filter((v: unknown) => typeof v === 'string')))
  if (typeof schema.const === 'string') options.push(fc.constant(schema.const))
  if (typeof schema.format === 'string' && formatted[schema.format] !== undefined) options.push(formatted[schema.format]!)
  if (typeof schema.pattern === 'string') {
    try {
      options.push(fc.stringMatching(new RegExp(schema.pattern)).filter(s => s.length <= (schema.maxLength ?? 300)))
    } catch {
      // A pattern fast-check cannot generate from: lengths and hostile strings cover it.
    }
  }
  const min = typeof schema.minLength === 'number' ? schema.minLength : 0
  const max = typeof schema.maxLength === 'number' ? schema.maxLength : 40
  if (options.length === 0) options.push(fc.string({ minLength: min, maxLength: Math.min(max, 60) }))
  // Boundaries: just inside and just outside the length limits.
  options.push(fc.constantFrom(...[min, Math.max(0, min - 1), max, max + 1].map(n => 'a'.repeat(n))))
  return fc.oneof({ weight: 6, arbitrary: fc.oneof(...options) }, { weight: 3, arbitrary: anyString })
}

function numberFor (schema: Schema, integer: boolean): fc.Arbitrary<number> {
  const min = typeof schema.minimum === 'number' ? schema.minimum : -1000
  const max = typeof schema.maximum === 'number' ? schema.maximum : 1_000_000
  const inRange = integer ? fc.integer({ min: Math.max(min, -2_147_483_648), max: Math.min(max, 2_147_483_647) }) : fc.double({ min, max, noNaN: true })
  return fc.oneof(
    { weight: 5, arbitrary: inRange },
    { weight: 2, arbitrary: fc.constantFrom(min, max, min - 1, max + 1) },
    { weight: 2, arbitrary: fc.constantFrom(...HOSTILE_NUMBERS) },
    { weight: 1, arbitrary: fc.double() }
  )
}

/** A JSON value for a schema: mostly valid-ish, often hostile (wrong type, boundaries, unknown fields, deep nesting). */
export function valueFor (schema: Schema, depth = 0): fc.Arbitrary<unknown> {
  const wrong = wrongValue(depth)
  if (depth > 6) return fc.constantFrom(null, 'deep', 1)
  const variants: Array<fc.Arbitrary<unknown>> = []
  for (const key of ['anyOf', 'oneOf'] as const) {
    if (Array.isArray(schema[key]) && schema[key].length > 0) variants.push(fc.oneof(...schema[key].map((s: Schema) => valueFor(s, depth + 1))))
  }
  if (Array.isArray(schema.allOf) && schema.allOf.length > 0) {
    variants.push(valueFor(Object.assign({}, ...schema.allOf), depth + 1))
  }
  if (variants.length > 0) return fc.oneof({ weight: 8, arbitrary: fc.oneof(...variants) }, { weight: 2, arbitrary: wrong })
  const types: string[] = Array.isArray(schema.type) ? schema.type : typeof schema.type === 'string' ? [schema.type] : []
  if (types.length === 0 && schema.properties !== undefined) types.push('object')
  const typed = types.map((type): fc.Arbitrary<unknown> => {
    switch (type) {
      case 'string': return stringFor(schema)
      case 'integer': return numberFor(schema, true)
      case 'number': return numberFor(schema, false)
      case 'boolean': return fc.boolean()
      case 'null': return fc.constant(null)
      case 'array': {
        const item = valueFor(schema.items ?? {}, depth + 1)
        const max = typeof schema.maxItems === 'number' ? schema.maxItems : 5
        return fc.oneof(
          { weight: 5, arbitrary: fc.array(item, { maxLength: Math.min(max, 5) }) },
          { weight: 1, arbitrary: fc.array(item, { minLength: max + 1, maxLength: max + 2 }) }
        )
      }
      case 'object': return objectFor(schema, depth)
      default: return anyJson(depth)
    }
  })
  if (typeof schema.const !== 'undefined') typed.push(fc.constant(schema.const))
  if (Array.isArray(schema.enum)) typed.push(fc.constantFrom(...schema.enum))
  if (typed.length === 0) return fc.oneof(anyJson(depth), wrong)
  return fc.oneof({ weight: 8, arbitrary: fc.oneof(...typed) }, { weight: 2, arbitrary: wrong })
}

function objectFor (schema: Schema, depth: number): fc.Arbitrary<Record<string, unknown>> {
  const properties: Record<string, Schema> = schema.properties ?? {}
  const names = Object.keys(properties)
  const required = new Set<string>(Array.isArray(schema.required) ? schema.required : [])
  const record: Record<string, fc.Arbitrary<unknown>> = {}
  for (const name of names) record[name] = valueFor(properties[name]!, depth + 1)
  const base = names.length > 0
    ? fc.record(record, { requiredKeys: names.filter(n => required.has(n)) })
    : fc.constant({})
  return fc.tuple(
    base,
    fc.option(fc.subarray(names, { maxLength: Math.min(2, names.length) }), { freq: 6 }).map(drop => drop ?? []),
    fc.option(fc.dictionary(fc.oneof(fc.constantFrom('__proto__', 'constructor', 'extra', 'id', 'role', 'created_at', '', '\u0000', 'a'.repeat(200)), fc.string({ maxLength: 10 })), anyJson(depth + 1), { maxKeys: 3 }), { freq: 5 })
  ).map(([value, drop, extra]) => {
    const out: Record<string, unknown> = { ...value }
    // Sometimes drop even required fields.
    for (const name of drop) delete out[name]
    if (extra !== null) {
      for (const [k, v] of Object.entries(extra)) Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true })
    }
    return out
  })
}

function anyJson (depth: number): fc.Arbitrary<unknown> {
  if (depth > 4) return fc.constantFrom(null, 0, '', true)
  return fc.oneof(
    anyString,
    fc.constantFrom(...HOSTILE_NUMBERS),
    fc.boolean(),
    fc.constant(null),
    fc.array(fc.oneof(anyString, fc.integer()), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 6 }), fc.oneof(anyString, fc.integer()), { maxKeys: 3 })
  )
}

function wrongValue (depth: number): fc.Arbitrary<unknown> {
  return fc.oneof(
    anyJson(depth + 3),
    fc.constantFrom(null, [], {}, [null], [[]], { a: { b: { c: {} } } }, '', 0, true, [1, 2, 3], { $ne: null }, { __proto__: { admin: true } })
  )
}

/** The text of a query, path or header value. */
function scalarText (value: unknown): string {
  if (typeof value === 'string') return value
  if (typeof value === 'number') return String(value)
  if (value === undefined) return ''
  return JSON.stringify(value)
}

function parameterText (parameter: Parameter): fc.Arbitrary<string[]> {
  const one = fc.oneof(
    { weight: 7, arbitrary: valueFor(parameter.schema).map(scalarText) },
    { weight: 2, arbitrary: fc.constantFrom(...HOSTILE_NUMBER_TEXTS) },
    { weight: 2, arbitrary: anyString }
  )
  // Repeated query parameters arrive as arrays where a scalar is expected.
  return parameter.in === 'query'
    ? fc.oneof({ weight: 9, arbitrary: one.map(v => [v]) }, { weight: 1, arbitrary: fc.array(one, { minLength: 2, maxLength: 3 }) })
    : one.map(v => [v])
}

// ---------------------------------------------------------------- encoding

/**
 * Percent-encodes a JavaScript string byte by byte. Lone surrogates, which
 * encodeURIComponent refuses, become the three bytes a WTF-8 encoder would
 * write (ED A0 80 for \ud800): what a hostile client can send.
 */
export function percentEncode (text: string, keep = /[A-Za-z0-9\-._~]/): string {
  let out = ''
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i)
    const ch = text[i]!
    if (code < 0x80 && keep.test(ch)) { out += ch; continue }
    let codePoint = code
    if (code >= 0xd800 && code <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1)
      if (next >= 0xdc00 && next <= 0xdfff) { codePoint = 0x10000 + ((code - 0xd800) << 10) + (next - 0xdc00); i++ }
    }
    for (const byte of wtf8(codePoint)) out += '%' + byte.toString(16).toUpperCase().padStart(2, '0')
  }
  return out
}

function wtf8 (cp: number): number[] {
  if (cp < 0x80) return [cp]
  if (cp < 0x800) return [0xc0 | (cp >> 6), 0x80 | (cp & 63)]
  if (cp < 0x10000) return [0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 63), 0x80 | (cp & 63)]
  return [0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 63), 0x80 | ((cp >> 6) & 63), 0x80 | (cp & 63)]
}

/** A header value as Node sends it: bytes of the WTF-8 encoding, written as Latin-1, minus the bytes HTTP forbids. */
function headerText (text: string): string {
  const bytes = decodeURIComponentBytes(percentEncode(text, /[\x20-\x7e]/))
  // HTTP forbids control characters other than tab in a header value; Node would refuse to send them.
  return [...bytes].filter(ch => { const c = ch.charCodeAt(0); return c === 9 || (c >= 0x20 && c !== 0x7f) }).join('')
}

function decodeURIComponentBytes (encoded: string): string {
  return encoded.replace(/%([0-9A-F]{2})/g, (_m, hex: string) => String.fromCharCode(parseInt(hex, 16)))
}

/** A raw segment, sent as is: encodings the server's decoder has to cope with. */
const RAW_PATH_SEGMENTS = ['%', '%ZZ', '%00', '%ED%A0%80', '%C0%AF', '%2F', '%2e%2e', '..', '.', '%FF%FE', '%E2%80%AE', '%F0%9F%98%80', 'a;b', 'a%3Bb', ';', '%20', '+', 'a'.repeat(201), ''] as const

// ---------------------------------------------------------------- requests

/** `admin_key*` is the SCIM key on SCIM's operations; `crossed_key` is the other door's key (the admin key on SCIM, the SCIM key elsewhere). */
export type AuthMode = 'admin_key' | 'admin_key_query' | 'admin_key_bearer' | 'session' | 'session_bearer' | 'anonymous' | 'bogus' | 'crossed_key'

/** What the generator decides; ids of live resources and credentials are filled in when it is sent. */
export interface Recipe {
  operation: Operation
  method: string
  path: Array<{ name: string, kind: 'live' | 'random' | 'raw', value: string, pick: number }>
  query: Array<[string, string]>
  rawQuerySuffix: string
  headers: Array<[string, string]>
  auth: AuthMode
  body: BodyRecipe | undefined
  ifMatch: 'none' | 'live' | 'random'
}

type BodyRecipe =
  | { kind: 'json', contentType: string, value: unknown }
  | { kind: 'form', contentType: string, value: unknown }
  | { kind: 'multipart', contentType: string, value: unknown, withFile: boolean, manyParts: boolean }
  | { kind: 'raw', contentType: string | undefined, text: string }

const RAW_BODIES = [
  '', '{', '}', '[', '{"a":', '{"a":1,}', "{'a':1}", 'null', 'true', '0', '"string"', '[]', '{"__proto__":{"admin":true}}',
  '{"constructor":{"prototype":{"admin":true}}}', '{"a":1}{"b":2}', '\ufeff{}', '{"username":"\\ud800"}', '{"username":"a\\u0000b"}',
  '{"limit":1e309}', '{"a":' + '['.repeat(5000) + ']'.repeat(5000) + '}', '['.repeat(20000), '{"a":"' + 'x'.repeat(70_000) + '"}',
  'username=a&password=b', '--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nb\r\n--x--\r\n', '\u0000\u0001\u0002', 'é'
]

const CONTENT_TYPES = [
  'application/json', 'application/json; charset=utf-8', 'application/json; charset=utf-16', 'application/json; charset=latin1',
  'application/merge-patch+json', 'application/x-www-form-urlencoded', 'multipart/form-data', 'multipart/form-data; boundary=',
  'text/plain', 'application/xml', 'application/octet-stream', 'application/problem+json', 'application/json-seq', 'text/html',
  '*/*', 'application/*', 'APPLICATION/JSON', 'application/json;', ';', 'é/é', 'application/json\u00e9'
]

const EXTRA_HEADERS: Array<[string, fc.Arbitrary<string>]> = [
  ['x-request-id', fc.oneof(fc.constantFrom('', 'a'.repeat(65), 'a b', 'fz\u00e9'), anyString)],
  ['accept', fc.constantFrom('text/html', 'application/json', '*/*', 'application/problem+json', 'image/png', '', 'text/html;q=0', 'é')],
  ['accept-language', fc.constantFrom('de', 'ar', '*', 'x'.repeat(500), '')],
  ['origin', fc.constantFrom('null', 'https://evil.example', 'http://127.0.0.1', '', 'http://[::1]', 'é')],
  ['sec-fetch-site', fc.constantFrom('same-origin', 'cross-site', 'none', '')],
  ['x-forwarded-for', fc.constantFrom('1.2.3.4', '::1', 'garbage', '1.2.3.4, 5.6.7.8', '')],
  ['x-forwarded-proto', fc.constantFrom('https', 'gopher', '')],
  ['x-forwarded-host', fc.constantFrom('evil.example', '', 'a:b:c')],
  ['host', fc.constantFrom('evil.example', '127.0.0.1:1', 'é', '[::1]', 'a b')],
  ['cookie', fc.constantFrom('gatehouse_session=x', 'gatehouse_session=', 'gatehouse_device=x', '=;;;=', 'gatehouse_session=%ED%A0%80', 'a=' + 'b'.repeat(3000))],
  ['authorization', fc.constantFrom('Bearer', 'Bearer ', 'Basic Zm9vOmJhcg==', 'Bearer gatehouse_x', 'Negotiate x', 'Bearer ' + 'a'.repeat(5000))],
  ['if-match', fc.constantFrom('*', '"x"', 'W/"1"', '', '"' + 'a'.repeat(300) + '"', '1e309')],
  ['if-none-match', fc.constantFrom('*', '"x"')],
  ['content-encoding', fc.constantFrom('gzip', 'br', 'identity', 'x')],
  ['range', fc.constantFrom('bytes=0-1', 'bytes=-1')]
]

/** The share of requests that go to SCIM's operations (issue 38: at least 15 %); the others share the rest evenly. */
export const SCIM_SHARE = 0.2

export function recipeArbitrary (operations: Operation[]): fc.Arbitrary<Recipe> {
  const scim = operations.filter(op => op.scim === true).length
  const others = operations.length - scim
  const scimWeight = scim === 0 || others === 0 ? 100 : Math.max(1, Math.round(100 * SCIM_SHARE * others / ((1 - SCIM_SHARE) * scim)))
  // Built once per operation: fc.chain would rebuild the body generators for every request.
  return fc.oneof(...operations.map(op => ({ weight: op.scim === true ? scimWeight : 100, arbitrary: operationRecipe(op) })))
}

function operationRecipe (operation: Operation): fc.Arbitrary<Recipe> {
  const pathParams = operation.parameters.filter(p => p.in === 'path')
  const queryParams = operation.parameters.filter(p => p.in === 'query')
  const headerParams = operation.parameters.filter(p => p.in === 'header' && p.name.toLowerCase() !== 'if-match')
  const pathArb = fc.tuple(...pathParams.map(p => fc.oneof(
    { weight: 6, arbitrary: fc.record({ name: fc.constant(p.name), kind: fc.constant('live' as const), value: fc.constant(''), pick: fc.nat() }) },
    { weight: 3, arbitrary: fc.record({ name: fc.constant(p.name), kind: fc.constant('random' as const), value: fc.oneof(fc.uuid(), anyString, fc.constantFrom(...HOSTILE_NUMBER_TEXTS)), pick: fc.constant(0) }) },
    { weight: 1, arbitrary: fc.record({ name: fc.constant(p.name), kind: fc.constant('raw' as const), value: fc.constantFrom(...RAW_PATH_SEGMENTS), pick: fc.constant(0) }) }
  )))
  const scimQuery = operation.scim === true ? scimQueryGenerators(anyString) : {}
  const queryText = (p: Parameter): fc.Arbitrary<string[]> => scimQuery[p.name] !== undefined
    ? fc.oneof({ weight: 3, arbitrary: scimQuery[p.name]!.map(v => [v]) }, { weight: 1, arbitrary: parameterText(p) })
    : parameterText(p)
  const queryArb = fc.tuple(...queryParams.map(p => fc.option(queryText(p).map(values => values.map(v => [p.name, v] as [string, string])), { freq: 2 })))
    .map(lists => lists.flatMap(list => list ?? []))
  const unknownQuery = fc.option(fc.tuple(fc.constantFrom('API_KEY', 'limit', 'foo', '__proto__', 'q[]', 'a[b]', '', 'next'), anyString).map(([k, v]) => [[k, v]] as Array<[string, string]>), { freq: 8 })
  const rawQuerySuffix = fc.oneof({ weight: 12, arbitrary: fc.constant('') }, { weight: 1, arbitrary: fc.constantFrom('&', '&&', '&=', '&%', '&limit', '&limit=', '&a=%ZZ', '&a=%ED%A0%80', '&' + 'a=1&'.repeat(2000), '#frag') })
  const headers = fc.tuple(
    fc.tuple(...headerParams.map(p => fc.option(parameterText(p).map(v => [p.name, v[0]!] as [string, string]), { freq: 2 }))),
    fc.subarray(EXTRA_HEADERS, { maxLength: 2 }).chain(chosen => fc.tuple(...chosen.map(([name, value]) => value.map(v => [name, v] as [string, string]))))
  ).map(([declared, extra]) => [...declared.filter((h): h is [string, string] => h !== null), ...extra])
  const auth = fc.oneof(
    { weight: 60, arbitrary: fc.constant('admin_key' as const) },
    { weight: 5, arbitrary: fc.constant('admin_key_query' as const) },
    { weight: 5, arbitrary: fc.constant('admin_key_bearer' as const) },
    { weight: 12, arbitrary: fc.constant('session' as const) },
    { weight: 4, arbitrary: fc.constant('session_bearer' as const) },
    { weight: 9, arbitrary: fc.constant('anonymous' as const) },
    { weight: 5, arbitrary: fc.constant('bogus' as const) },
    { weight: 3, arbitrary: fc.constant('crossed_key' as const) }
  )
  const method = fc.oneof({ weight: 30, arbitrary: fc.constant(operation.method) }, { weight: 1, arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS') })
  const ifMatch = operation.parameters.some(p => p.name.toLowerCase() === 'if-match')
    ? fc.constantFrom('none' as const, 'live' as const, 'live' as const, 'random' as const)
    : fc.constant('none' as const)
  return fc.record({
    operation: fc.constant(operation),
    method,
    path: pathArb,
    query: fc.tuple(queryArb, unknownQuery).map(([q, u]) => [...q, ...(u ?? [])]),
    rawQuerySuffix,
    headers,
    auth,
    body: bodyArbitrary(operation),
    ifMatch
  })
}

let namedBodies: Record<string, fc.Arbitrary<unknown>> | undefined

function bodyArbitrary (operation: Operation): fc.Arbitrary<BodyRecipe | undefined> {
  const schema = operation.bodies[0]?.schema ?? {}
  const declared = operation.bodies.map(b => b.contentType)
  const value = valueFor(schema)
  const typed = (contentType: string): fc.Arbitrary<BodyRecipe> => {
    if (/form-urlencoded/.test(contentType)) return value.map(v => ({ kind: 'form' as const, contentType, value: v }))
    if (/multipart/.test(contentType)) return fc.tuple(value, fc.boolean(), fc.nat(20)).map(([v, withFile, n]) => ({ kind: 'multipart' as const, contentType, value: v, withFile: withFile && n < 5, manyParts: n === 0 }))
    return value.map(v => ({ kind: 'json' as const, contentType, value: v }))
  }
  const options: Array<{ weight: number, arbitrary: fc.Arbitrary<BodyRecipe | undefined> }> = [
    { weight: 2, arbitrary: fc.tuple(fc.option(fc.constantFrom(...CONTENT_TYPES), { freq: 6 }), fc.constantFrom(...RAW_BODIES)).map(([contentType, text]) => ({ kind: 'raw' as const, contentType: contentType ?? undefined, text })) },
    { weight: 2, arbitrary: fc.constantFrom(...CONTENT_TYPES.slice(0, 8)).chain(typed) }
  ]
  if (declared.length > 0) options.push({ weight: 14, arbitrary: fc.constantFrom(...declared).chain(typed) })
  // A generator of its own for the bodies a schema describes too loosely (fuzz-generators.ts).
  const special = operation.bodySchemaName !== undefined ? (namedBodies ??= bodyGenerators(anyString))[operation.bodySchemaName] : undefined
  const jsonTypes = declared.filter(type => /json/.test(type))
  if (special !== undefined && jsonTypes.length > 0) {
    options.push({ weight: 20, arbitrary: fc.tuple(fc.constantFrom(...jsonTypes), special).map(([contentType, value]) => ({ kind: 'json' as const, contentType, value })) })
  }
  options.push({ weight: declared.length > 0 ? 1 : 16, arbitrary: fc.constant(undefined) })
  return fc.oneof(...options)
}

/** Recipe number `index` of a run with this seed: the same every time. */
export function recipeAt (arbitrary: fc.Arbitrary<Recipe>, seed: number, index: number): Recipe {
  return fc.sample(arbitrary, { seed: (seed + index * 7919) | 0, numRuns: 1 })[0]!
}

// ---------------------------------------------------------------- the state a run builds up

/** Ids the run has seen, by the path parameter name they fill in, and ETags by resource path. */
export class LivePool {
  private readonly ids = new Map<string, string[]>()
  readonly etags = new Map<string, string>()
  /** Ids the fuzzer must not hit (its own admin key and session user), or it would lock itself out. */
  readonly protectedIds = new Set<string>()

  add (name: string, id: unknown): void {
    if (typeof id !== 'string' || id === '' || this.protectedIds.has(id)) return
    const list = this.ids.get(name) ?? []
    if (list.includes(id)) return
    list.push(id)
    // A bounded pool, newest kept: old ids are mostly deleted by now.
    if (list.length > 200) list.shift()
    this.ids.set(name, list)
  }

  pick (name: string, n: number): string | undefined {
    const list = this.ids.get(name)
    if (list === undefined || list.length === 0) return undefined
    return list[n % list.length]
  }

  /**
   * Takes ids from a JSON answer: the resource a collection path holds, and
   * ids named in it; and what the e-mail flows need: usernames, addresses,
   * and the tokens and codes of links issued without SMTP.
   */
  harvest (template: string, body: unknown): void {
    const scim = template.match(/\/scim\/v2\/(Users|Groups)(?:\/\{id\})?$/)?.[1]
    const resource = scim ?? (template.endsWith('/members') ? undefined : template.match(/\/(users|groups|api-keys|webhooks|providers|passkeys|identities|deliveries|attempts|events)(?:\/\{[a-z_]+\})?(?:\/[a-z-]+)?$/)?.[1])
    const idName: Record<string, string> = {
      users: 'user_id', groups: 'group_id', Users: 'user_id', Groups: 'group_id', 'api-keys': 'key_id', webhooks: 'webhook_id', providers: 'provider_id', passkeys: 'passkey_id', identities: 'identity_id', events: 'event_id', deliveries: 'event_id', attempts: 'event_id'
    }
    const visit = (value: unknown, depth: number): void => {
      if (depth > 3 || value === null || typeof value !== 'object') return
      if (Array.isArray(value)) { for (const v of value.slice(0, 50)) visit(v, depth + 1); return }
      const record = value as Record<string, unknown>
      if (resource !== undefined && idName[resource] !== undefined && typeof record.id === 'string' && !template.includes('/deliveries') && !template.includes('/attempts')) this.add(idName[resource]!, record.id)
      for (const key of ['user_id', 'key_id', 'webhook_id', 'event_id', 'provider_id', 'identity_id', 'passkey_id', 'group_id', 'actor_id', 'target_id']) {
        if (typeof record[key] === 'string') this.add(key === 'actor_id' || key === 'target_id' ? 'user_id' : key, record[key])
      }
      for (const key of ['username', 'userName']) if (typeof record[key] === 'string') { this.add('username', record[key]); this.add('login', record[key]) }
      if (typeof record.email === 'string') { this.add('email', record.email); this.add('login', record.email) }
      const token = typeof record.url === 'string' ? /[?&]token=(ght_[0-9A-Za-z]{43})/.exec(record.url)?.[1] : undefined
      if (token !== undefined) this.add('token', token)
      if (typeof record.code === 'string' && /^[A-Z0-9]{4}-[A-Z0-9]{4}$/.test(record.code)) this.add('code', record.code)
      if (record.user !== undefined) visit(record.user, depth + 1)
      if (record.invitation !== undefined) visit(record.invitation, depth + 1)
      for (const key of ['items', 'data', 'users', 'keys', 'webhooks', 'providers', 'passkeys', 'identities', 'events', 'deliveries', 'Resources']) {
        if (Array.isArray(record[key])) visit(record[key], depth + 1)
      }
    }
    visit(body, 0)
  }
}

// ---------------------------------------------------------------- sending

export interface Target {
  host: string
  port: number
  basePath: string
  adminKey: string
}

export interface Sent {
  method: string
  path: string
  headers: Record<string, string>
  body: Buffer | undefined
}

export interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: string
}

/** What `send` got back, and the connection it went over (undefined when it was never sent). */
type Sending = (Answer | { clientError: string }) & { socket?: Socket }

export interface Credentials {
  adminKey: string
  sessionToken: string | undefined
  /** A key with the `scim` scope: SCIM's operations take it and nothing else. */
  scimKey?: string
}

/** Which pool fills a path parameter: SCIM names every resource's `{id}` alike. */
function poolNameOf (template: string, parameter: string): string {
  const scim = /\/scim\/v2\/(Users|Groups|ResourceTypes|Schemas)\/\{/.exec(template)?.[1]
  if (scim === undefined) return parameter
  return { Users: 'user_id', Groups: 'group_id', ResourceTypes: 'scim_resource_type', Schemas: 'scim_schema' }[scim]!
}

/** What a `{{live:<pool>:<n>}}` placeholder becomes when its pool is still empty. */
const LIVE_FALLBACK: Record<string, string> = {
  user_id: '00000000-0000-7000-8000-000000000000',
  group_id: '00000000-0000-7000-8000-000000000000',
  token: 'ght_' + 'A'.repeat(43),
  code: 'AAAA-AAAA',
  username: 'nobody',
  email: 'nobody@example.com',
  login: 'nobody'
}

/** Fills in the `{{live:<pool>:<n>}}` placeholders of the generators (fuzz-generators.ts) from the pool. */
export function fillLive (text: string, pool: LivePool): string {
  if (!text.includes('{{live:')) return text
  return text.replace(/\{\{live:([a-z_]+):(\d+)\}\}/g, (_m, name: string, n: string) => pool.pick(name, Number(n)) ?? LIVE_FALLBACK[name] ?? '')
}

/** Turns a recipe into the bytes of a request, with live ids and credentials. */
export function materialize (recipe: Recipe, pool: LivePool, target: Target, credentials: Credentials): { sent: Sent, resourcePath: string } {
  let path = recipe.operation.template
  for (const segment of recipe.path) {
    let value: string
    if (segment.kind === 'live') {
      const live = pool.pick(poolNameOf(recipe.operation.template, segment.name), segment.pick)
      value = live !== undefined ? percentEncode(live) : '00000000-0000-7000-8000-000000000000'
    } else if (segment.kind === 'raw') {
      value = segment.value
    } else {
      value = percentEncode(segment.value)
    }
    path = path.replace(`{${segment.name}}`, value)
  }
  const resourcePath = path
  const query: string[] = recipe.query.map(([k, v]) => `${percentEncode(k)}=${percentEncode(fillLive(v, pool))}`)
  const headers: Record<string, string> = {}
  for (const [name, value] of recipe.headers) headers[name] = headerText(value)
  const origin = `http://${target.host}:${target.port}`
  // SCIM's operations take the SCIM key where the others take the admin key.
  const scimKey = credentials.scimKey ?? credentials.adminKey
  const key = recipe.operation.scim === true ? scimKey : credentials.adminKey
  switch (recipe.auth) {
    case 'admin_key': headers['x-api-key'] = key; break
    case 'admin_key_bearer': headers.authorization = `Bearer ${key}`; break
    case 'admin_key_query': query.push(`API_KEY=${percentEncode(key)}`); break
    case 'crossed_key': headers.authorization = `Bearer ${recipe.operation.scim === true ? credentials.adminKey : scimKey}`; break
    case 'session':
      if (credentials.sessionToken !== undefined) {
        headers.cookie = `gatehouse_session=${credentials.sessionToken}`
        // Cookie-authenticated writes need the own origin (CSRF check); sometimes it is missing or foreign.
        if (headers.origin === undefined) headers.origin = origin
      }
      break
    case 'session_bearer': if (credentials.sessionToken !== undefined) headers.authorization = `Bearer ${credentials.sessionToken}`; break
    case 'bogus': headers['x-api-key'] = 'gatehouse_' + 'f'.repeat(40); break
    case 'anonymous': break
  }
  if (recipe.ifMatch === 'live') {
    const etag = pool.etags.get(resourcePath)
    if (etag !== undefined) headers['if-match'] = etag
  } else if (recipe.ifMatch === 'random') {
    headers['if-match'] = '"' + 'deadbeef' + '"'
  }
  let body: Buffer | undefined
  const b = recipe.body
  if (b !== undefined) {
    if (b.kind === 'raw') {
      body = Buffer.from(b.text, 'utf8')
      if (b.contentType !== undefined) headers['content-type'] = headerText(b.contentType)
    } else if (b.kind === 'json') {
      body = Buffer.from(fillLive(JSON.stringify(b.value) ?? '', pool), 'utf8')
      headers['content-type'] = headerText(b.contentType)
    } else if (b.kind === 'form') {
      body = Buffer.from(formEncode(b.value), 'latin1')
      headers['content-type'] = b.contentType
    } else {
      const boundary = 'fuzzboundary' + Math.abs(JSON.stringify(b.value)?.length ?? 0)
      body = multipartEncode(b.value, boundary, b.withFile, b.manyParts)
      headers['content-type'] = `multipart/form-data; boundary=${boundary}`
    }
  }
  const queryText = query.length > 0 ? '?' + query.join('&') + recipe.rawQuerySuffix : (recipe.rawQuerySuffix !== '' ? '?' + recipe.rawQuerySuffix.replace(/^&/, '') : '')
  return { sent: { method: recipe.method, path: path + queryText, headers, body }, resourcePath }
}

function formEncode (value: unknown): string {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return `value=${percentEncode(scalarText(value))}`
  const parts: string[] = []
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (Array.isArray(v)) for (const item of v) parts.push(`${percentEncode(k)}=${percentEncode(scalarText(item))}`)
    else parts.push(`${percentEncode(k)}=${percentEncode(scalarText(v))}`)
  }
  return parts.join('&')
}

function multipartEncode (value: unknown, boundary: string, withFile: boolean, manyParts: boolean): Buffer {
  const fields: Array<[string, string]> = []
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (Array.isArray(v)) for (const item of v) fields.push([k, scalarText(item)])
      else fields.push([k, scalarText(v)])
    }
  } else {
    fields.push(['value', scalarText(value)])
  }
  if (manyParts) for (let i = 0; i < 60; i++) fields.push([`f${i}`, 'x'])
  const chunks: Buffer[] = []
  for (const [name, text] of fields) {
    chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${name.replace(/["\r\n]/g, '_')}"\r\n\r\n`, 'utf8'))
    chunks.push(Buffer.from(text, 'utf8'), Buffer.from('\r\n'))
  }
  if (withFile) chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\nContent-Type: text/csv\r\n\r\nusername\r\nbob\r\n`))
  chunks.push(Buffer.from(`--${boundary}--\r\n`))
  return Buffer.concat(chunks)
}

/** One request over a kept-alive connection; a request Node refuses to send (a header it finds invalid) is reported as such. */
export async function send (agent: Agent, target: Target, sent: Sent, timeoutMs: number): Promise<Sending> {
  return await new Promise(resolve => {
    let settled = false
    let socket: Socket | undefined
    const done = (value: Answer | { clientError: string }): void => { if (!settled) { settled = true; resolve({ ...value, socket }) } }
    let req
    try {
      req = httpRequest({ host: target.host, port: target.port, method: sent.method, path: sent.path, headers: { ...sent.headers, ...(sent.body !== undefined ? { 'content-length': String(sent.body.length) } : {}) }, agent, timeout: timeoutMs, maxHeaderSize: 1024 * 1024 }, res => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('end', () => done({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
        res.on('error', error => done({ clientError: `response: ${error.message}` }))
      })
    } catch (error) {
      done({ clientError: `not sent: ${(error as Error).message}` })
      return
    }
    req.on('socket', s => { socket = s })
    req.on('timeout', () => { req.destroy(new Error(`no answer within ${timeoutMs} ms`)) })
    req.on('error', error => done({ clientError: (error as Error).message }))
    req.end(sent.body)
  })
}

/** Long curls (70 kB bodies, 5,000-character values) shortened for the console; the results file keeps them whole. */
export function shorten (text: string, max = 700): string {
  const squeezed = text.replace(/(.{1,6}?)\1{20,}/g, (run, unit: string) => `${unit}…(${unit} ×${run.length / unit.length})…`)
  return squeezed.length > max ? `${squeezed.slice(0, max)}… (${text.length} characters)` : squeezed
}

/** A curl command that sends the same request (bodies through a here-doc-free printf so every byte survives). */
export function toCurl (target: Target, sent: Sent): string {
  const quote = (s: string): string => `'${s.replace(/'/g, "'\\''")}'`
  const parts = ['curl', '-sS', '-g', '-X', sent.method]
  for (const [name, value] of Object.entries(sent.headers)) {
    if (name === 'x-api-key' || name === 'authorization' || name === 'cookie') parts.push('-H', quote(`${name}: ${value.replace(/gatehouse_[A-Za-z0-9_]+/, m => m.startsWith('gatehouse_session') ? '$SESSION' : '$ADMIN_KEY')}`).replace(/^'(.*)'$/, '"$1"'))
    else parts.push('-H', quote(`${name}: ${value}`))
  }
  let path = sent.path.replace(/API_KEY=[^&]*/, 'API_KEY=$ADMIN_KEY')
  path = `http://${target.host}:${target.port}${path}`
  if (sent.body !== undefined) {
    if (sent.body.length > 2000) parts.push('--data-binary', `@<(head -c ${sent.body.length} /dev/zero | tr '\\0' x) # body: ${sent.body.length} bytes starting ${quote(sent.body.subarray(0, 80).toString('latin1'))}`)
    else parts.push('--data-binary', `"$(printf '%b' ${quote(escapeForPrintf(sent.body))})"`)
  }
  parts.splice(5, 0, path.includes('$') ? `"${path}"` : quote(path))
  return parts.join(' ')
}

function escapeForPrintf (body: Buffer): string {
  let out = ''
  for (const byte of body) out += byte >= 0x20 && byte < 0x7f && byte !== 0x5c && byte !== 0x25 ? String.fromCharCode(byte) : '\\x' + byte.toString(16).padStart(2, '0')
  return out
}

// ---------------------------------------------------------------- checking answers

/** What is wrong with an error answer that is not a proper problem+json body; undefined when it is fine. */
export function problemDefect (answer: Answer, method: string, template: string, basePath: string): string | undefined {
  if (answer.status < 400 || method === 'HEAD') return undefined
  const type = String(answer.headers['content-type'] ?? '')
  // Refused by Node's HTTP parser before the request line was read (src/errors.ts, answerClientError): it may have been HEAD, so no body, by design.
  if (answer.body === '' && type === '' && answer.headers.connection === 'close' && [400, 408, 431].includes(answer.status)) return undefined
  // On SCIM, SCIM's error body; but what is refused before routing is a problem, as everywhere (the 4XX of SCIM's operations).
  if (template.startsWith(`${basePath}/scim/v2/`) && !(type.startsWith('application/problem+json') && refusedBeforeRouting(answer.body))) return scimErrorDefect(answer, type)
  // Server-rendered pages answer people with HTML; the API answers problem+json.
  const isPage = !template.startsWith(`${basePath}/api/`) && !template.startsWith(`${basePath}/users`)
  if (isPage && type.startsWith('text/html')) return undefined
  if (!type.startsWith('application/problem+json')) return `content-type ${type === '' ? '(none)' : type}`
  let body: any
  try {
    body = JSON.parse(answer.body)
  } catch {
    return 'body is not JSON'
  }
  if (body === null || typeof body !== 'object') return 'body is not an object'
  if (body.status !== answer.status) return `body status ${String(body.status)} differs from ${answer.status}`
  for (const field of ['type', 'title', 'detail', 'code']) if (typeof body[field] !== 'string') return `no ${field}`
  if (!/^[a-z][a-z0-9_]*$/.test(body.code)) return `code ${String(body.code)} is not snake_case`
  return undefined
}

/** A problem of the framework's error handlers (src/errors.ts): a URL that cannot be decoded, a path segment too long, headers too large, not HTTP. */
function refusedBeforeRouting (text: string): boolean {
  try {
    const body = JSON.parse(text)
    return ['headers_too_large', 'request_timeout', 'malformed_request'].includes(body.code) ||
      (body.code === 'route_not_found' && body.detail === 'The URL could not be decoded.') ||
      (body.code === 'validation_failed' && body.errors?.[0]?.detail === 'a path parameter is longer than this service accepts')
  } catch {
    return false
  }
}

const SCIM_ERROR_TYPES = new Set(['invalidFilter', 'tooMany', 'uniqueness', 'mutability', 'invalidSyntax', 'invalidPath', 'noTarget', 'invalidValue', 'invalidVers', 'sensitive'])

/** What is wrong with an error of a SCIM operation that is not SCIM's error body (RFC 7644 §3.12) in application/scim+json. */
function scimErrorDefect (answer: Answer, type: string): string | undefined {
  if (!type.startsWith('application/scim+json')) return `SCIM error with content-type ${type === '' ? '(none)' : type}`
  let body: any
  try {
    body = JSON.parse(answer.body)
  } catch {
    return 'SCIM error body is not JSON'
  }
  if (body === null || typeof body !== 'object') return 'SCIM error body is not an object'
  if (!Array.isArray(body.schemas) || body.schemas[0] !== 'urn:ietf:params:scim:api:messages:2.0:Error') return 'SCIM error without the Error schema'
  if (body.status !== String(answer.status)) return `SCIM error status ${JSON.stringify(body.status)} is not "${answer.status}"`
  if (typeof body.detail !== 'string') return 'SCIM error without detail'
  if (body.scimType !== undefined && !SCIM_ERROR_TYPES.has(body.scimType)) return `SCIM error with scimType ${String(body.scimType)}`
  return undefined
}

// ---------------------------------------------------------------- the run

/** Bodies past the default BODY_LIMIT_BYTES (64 KiB), which the server may refuse before reading. */
const OVERSIZED_BODY = 65_536
/** Node's HTTP client refuses response headers over 16 KiB by default; a redirect near that is a problem for clients. */
const LARGE_LOCATION = 8192

export interface Finding {
  kind: '5xx' | 'not_problem_json' | 'no_answer' | 'dependency_down' | 'large_location'
  status: number
  method: string
  template: string
  detail: string
  index: number
  curl: string
  body: string
  requestId: string
}

export interface RunResult {
  sent: number
  /** Of `sent`, those to SCIM's operations. */
  scimSent: number
  notSent: number
  statuses: Map<number, number>
  findings: Map<string, Finding & { count: number }>
  serverDied: boolean
  stoppedByTime: boolean
}

export interface RunOptions {
  target: Target
  seed: number
  requests: number
  concurrency: number
  timeLimitMs: number
  requestTimeoutMs?: number
  /** Checked between requests: the run stops when the server process has died. */
  isServerAlive?: () => boolean
  onProgress?: (done: number) => void
}

/** The operations to fuzz: every one the document lists, and the hidden pages. */
export async function loadOperations (target: Target): Promise<Operation[]> {
  const res = await fetch(`http://${target.host}:${target.port}${target.basePath}/openapi.json`)
  if (!res.ok) throw new Error(`GET ${target.basePath}/openapi.json answered ${res.status}`)
  const doc = await res.json() as Schema
  return [...operationsFrom(doc), ...pageOperations(target.basePath)]
}

async function jsonCall (target: Target, method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<{ status: number, body: any, headers: Headers }> {
  const res = await fetch(`http://${target.host}:${target.port}${target.basePath}${path}`, {
    method, headers: { ...headers, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) }, body: body !== undefined ? JSON.stringify(body) : undefined
  })
  const text = await res.text()
  let parsed: unknown
  try { parsed = JSON.parse(text) } catch { parsed = text }
  return { status: res.status, body: parsed, headers: res.headers }
}

/**
 * A fresh admin user and a session of theirs. The fuzz may disable, delete or
 * re-password the previous one (its id is protected, but `/me` routes reach
 * it), so a lost session is replaced by a new user rather than signed in again.
 */
async function newSession (target: Target, pool: LivePool, n: number): Promise<string | undefined> {
  const username = `fuzz_session_${n}_${Math.random().toString(36).slice(2, 8)}`
  const created = await jsonCall(target, 'POST', '/api/users', { 'x-api-key': target.adminKey }, { username, password: FUZZ_ADMIN_PASSWORD, role: 'admin' })
  if (created.status !== 201 && created.status !== 200) return undefined
  pool.protectedIds.add(created.body.id)
  const login = await jsonCall(target, 'POST', '/api/login', {}, { username, password: FUZZ_ADMIN_PASSWORD })
  return login.status === 200 ? login.body.token : undefined
}

/**
 * An OpenID provider that answers discovery (and refuses every code), so that
 * the seeded provider's sign-in start and callback run their whole path
 * instead of ending at an unreachable issuer.
 */
async function startIssuer (): Promise<{ url: string, close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const json = (status: number, body: unknown): void => { res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body)) }
    if (req.url === '/.well-known/openid-configuration') {
      json(200, {
        issuer: url,
        authorization_endpoint: `${url}/authorize`,
        token_endpoint: `${url}/token`,
        jwks_uri: `${url}/jwks`,
        response_types_supported: ['code'],
        subject_types_supported: ['public'],
        id_token_signing_alg_values_supported: ['RS256'],
        code_challenge_methods_supported: ['S256']
      })
    } else if (req.url === '/jwks') {
      json(200, { keys: [] })
    } else if (req.url === '/token') {
      req.resume()
      json(400, { error: 'invalid_grant' })
    } else {
      json(404, { error: 'not_found' })
    }
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => { server.closeAllConnections(); await new Promise<void>(resolve => server.close(() => resolve())) }
  }
}

/**
 * Real resources, so that ids in paths hit existing objects: users (one
 * invited, so that its invitation's token and code are live), a password
 * reset link, API keys, webhooks, an OIDC provider, and SCIM users (with the
 * enterprise extension and a manager) and a group with members.
 */
async function seedResources (target: Target, pool: LivePool, round: number, issuer: string, credentials: Credentials): Promise<void> {
  const admin = { 'x-api-key': target.adminKey }
  const scim = { authorization: `Bearer ${credentials.scimKey ?? ''}` }
  const tag = `${round}_${Math.random().toString(36).slice(2, 8)}`
  const someUser = (): string => pool.pick('user_id', round + 1) ?? LIVE_FALLBACK.user_id!
  const calls: Array<[string, () => string, unknown, Record<string, string>]> = [
    ['POST', () => '/api/users', { username: `fuzz_user_${tag}`, email: `fuzz_${tag}@example.com`, password: FUZZ_ADMIN_PASSWORD, first_name: 'Fuzz', groups: ['fuzzers'] }, admin],
    ['POST', () => '/api/users', { username: `fuzz_invited_${tag}`, email: `fuzz_invited_${tag}@example.com`, invite: true }, admin],
    ['POST', () => `/api/users/${someUser()}/password-reset`, {}, admin],
    ['POST', () => '/api/api-keys', { name: `fuzz key ${tag}` }, admin],
    ['POST', () => '/api/webhooks', { url: 'http://127.0.0.1:9/hook', events: ['user.created'] }, admin],
    ['POST', () => '/api/sso/providers', { id: `fuzz${tag.replace(/_/g, '')}`.slice(0, 30), display_name: 'Fuzz OP', issuer, client_id: 'fuzz' }, admin],
    // SCIM users are deleted often by the run itself: three each round, so that SCIM's ids are mostly live.
    ...[0, 1, 2].map((n): [string, () => string, unknown, Record<string, string>] => ['POST', () => '/scim/v2/Users', {
      schemas: ['urn:ietf:params:scim:schemas:core:2.0:User', 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'],
      userName: `fuzz_scim_${tag}_${n}`,
      externalId: `ext-${tag}-${n}`,
      name: { givenName: 'Fuzz', familyName: 'Scim' },
      emails: [{ value: `fuzz_scim_${tag}_${n}@example.com`, type: 'work', primary: true }],
      'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User': { department: 'Fuzzing', employeeNumber: `${tag}-${n}`, manager: { value: someUser() } }
    }, scim]),
    ['POST', () => '/scim/v2/Groups', { displayName: `fuzz scim ${tag}`, members: [{ value: someUser() }] }, scim]
  ]
  for (const [method, path, body, headers] of calls) {
    try {
      const res = await jsonCall(target, method, path(), headers, body)
      if (res.status < 300) pool.harvest(`${target.basePath}${path().replace(/\/[0-9a-f-]{36}\//, '/{user_id}/')}`, res.body)
    } catch {
      // Seeding is best effort; the fuzz itself reports what breaks.
    }
  }
  for (const path of ['/scim/v2/Users?count=50', '/scim/v2/Groups?count=50']) {
    try {
      const res = await jsonCall(target, 'GET', path, scim)
      if (res.status === 200) pool.harvest(`${target.basePath}${path.split('?')[0]}`, res.body)
    } catch {
      // as above
    }
  }
  for (const path of ['/api/users?limit=50', '/api/groups', '/api/api-keys', '/api/webhooks', '/api/sso/providers', '/api/events?limit=50']) {
    try {
      const res = await jsonCall(target, 'GET', path, admin)
      if (res.status === 200) pool.harvest(`${target.basePath}${path.split('?')[0]}`, res.body)
    } catch {
      // as above
    }
  }
}

/** Sends `requests` generated requests and collects statuses and findings. Stops at the count, the time limit or a dead server. */
export async function runFuzz (options: RunOptions): Promise<RunResult> {
  const { target, seed, requests, concurrency, timeLimitMs } = options
  const requestTimeoutMs = options.requestTimeoutMs ?? 30_000
  const operations = await loadOperations(target)
  const arbitrary = recipeArbitrary(operations)
  const pool = new LivePool()
  const me = await jsonCall(target, 'GET', '/api/me', { 'x-api-key': target.adminKey })
  for (const key of ['id', 'key_id', 'api_key_id', 'user_id']) if (typeof me.body?.[key] === 'string') pool.protectedIds.add(me.body[key])
  if (typeof me.body?.api_key?.id === 'string') pool.protectedIds.add(me.body.api_key.id)
  if (typeof me.body?.user?.id === 'string') pool.protectedIds.add(me.body.user.id)
  const keys = await jsonCall(target, 'GET', '/api/api-keys', { 'x-api-key': target.adminKey })
  // Every key existing before the run is the fuzzer's own: revoking or rotating it would end the run.
  for (const key of Array.isArray(keys.body?.items) ? keys.body.items : Array.isArray(keys.body) ? keys.body : []) if (typeof key?.id === 'string') pool.protectedIds.add(key.id)
  const scimKey = await jsonCall(target, 'POST', '/api/api-keys', { 'x-api-key': target.adminKey }, { name: 'fuzz scim', scopes: ['scim'] })
  if (typeof scimKey.body?.id === 'string') pool.protectedIds.add(scimKey.body.id)
  for (const type of ['User', 'Group']) pool.add('scim_resource_type', type)
  for (const urn of ['urn:ietf:params:scim:schemas:core:2.0:User', 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User', 'urn:ietf:params:scim:schemas:core:2.0:Group']) pool.add('scim_schema', urn)
  const issuer = await startIssuer()
  const credentials: Credentials = { adminKey: target.adminKey, sessionToken: undefined, ...(typeof scimKey.body?.key === 'string' ? { scimKey: scimKey.body.key } : {}) }
  await seedResources(target, pool, 0, issuer.url, credentials)
  credentials.sessionToken = await newSession(target, pool, 0)
  const agent = new Agent({ keepAlive: true, maxSockets: concurrency })
  const result: RunResult = { sent: 0, scimSent: 0, notSent: 0, statuses: new Map(), findings: new Map(), serverDied: false, stoppedByTime: false }
  const deadline = Date.now() + timeLimitMs
  let next = 0
  let sessions = 1
  let refreshing: Promise<void> | undefined
  // The request last answered on each kept-alive connection: a request that gets no answer is most often the
  // victim of the one before it on the same connection (seed 1602: a multipart upload refused part-way).
  const previousOn = new WeakMap<Socket, string>()
  const before = (socket: Socket | undefined): string => {
    const previous = socket !== undefined ? previousOn.get(socket) : undefined
    return previous !== undefined ? `after, on the same connection: ${previous}` : 'first request on its connection'
  }
  const note = (finding: Finding): void => {
    // A 5xx is told apart by its operation; a malformed error answer by what is wrong with it, wherever it came from.
    const key = finding.kind === '5xx' ? `${finding.kind} ${finding.status} ${finding.method} ${finding.template} ${finding.detail}` : `${finding.kind} ${finding.status} ${finding.detail}`
    const known = result.findings.get(key)
    if (known !== undefined) known.count += 1
    else result.findings.set(key, { ...finding, count: 1 })
  }
  const worker = async (): Promise<void> => {
    while (true) {
      if (Date.now() > deadline) { result.stoppedByTime = true; return }
      if (options.isServerAlive !== undefined && !options.isServerAlive()) { result.serverDied = true; return }
      const index = next++
      if (index >= requests) return
      if (index > 0 && index % 2000 === 0) await seedResources(target, pool, index, issuer.url, credentials)
      const recipe = recipeAt(arbitrary, seed, index)
      const { sent, resourcePath } = materialize(recipe, pool, target, credentials)
      const requestId = `fz-${seed}-${index}`
      if (sent.headers['x-request-id'] === undefined) sent.headers['x-request-id'] = requestId
      const answer = await send(agent, target, sent, requestTimeoutMs)
      options.onProgress?.(index + 1)
      const describe = (outcome: string): string => `${requestId} ${sent.method} ${recipe.operation.template} (${outcome}, ${sent.body?.length ?? 0} body bytes): ${shorten(toCurl(target, sent), 300)}`
      const previous = before(answer.socket)
      if (answer.socket !== undefined) previousOn.set(answer.socket, describe('clientError' in answer ? answer.clientError : String(answer.status)))
      if ('clientError' in answer) {
        if (answer.clientError.startsWith('not sent')) { result.notSent += 1; continue }
        result.sent += 1
        if (recipe.operation.scim === true) result.scimSent += 1
        // The server answers an oversized body (413) and closes before the client has written it all: the write fails, as it should.
        if (/EPIPE|ECONNRESET/.test(answer.clientError) && (sent.body?.length ?? 0) > OVERSIZED_BODY) { result.statuses.set(-1, (result.statuses.get(-1) ?? 0) + 1); continue }
        if (options.isServerAlive !== undefined && !options.isServerAlive()) { result.serverDied = true }
        note({ kind: 'no_answer', status: 0, method: sent.method, template: recipe.operation.template, detail: answer.clientError.replace(/\d+/g, 'N'), index, curl: toCurl(target, sent), body: previous, requestId })
        continue
      }
      if (answer.status === 408) {
        // Every request here is written whole at once: the server's receive deadline passing means the connection had stopped reading.
        note({ kind: 'no_answer', status: 408, method: sent.method, template: recipe.operation.template, detail: '408 to a request sent whole: the connection had stopped reading', index, curl: toCurl(target, sent), body: previous, requestId })
      }
      result.sent += 1
      if (recipe.operation.scim === true) result.scimSent += 1
      result.statuses.set(answer.status, (result.statuses.get(answer.status) ?? 0) + 1)
      const answeredId = String(answer.headers['x-request-id'] ?? requestId)
      if (answer.status === 503 && /identity provider cannot be reached/.test(answer.body)) {
        // A provider the fuzz created with an issuer nobody answers at: the documented answer to a dependency that is down.
        note({ kind: 'dependency_down', status: 503, method: sent.method, template: recipe.operation.template, detail: 'identity provider unreachable', index, curl: toCurl(target, sent), body: '', requestId })
      } else if (answer.status >= 500) {
        let code = ''
        try { code = String(JSON.parse(answer.body).code ?? '') } catch { code = '(no problem body)' }
        note({ kind: '5xx', status: answer.status, method: sent.method, template: recipe.operation.template, detail: code, index, curl: toCurl(target, sent), body: answer.body.slice(0, 2000), requestId: answeredId })
      } else {
        const defect = problemDefect(answer, sent.method, recipe.operation.template, target.basePath)
        if (defect !== undefined) note({ kind: 'not_problem_json', status: answer.status, method: sent.method, template: recipe.operation.template, detail: defect, index, curl: toCurl(target, sent), body: answer.body.slice(0, 500), requestId: answeredId })
      }
      const location = String(answer.headers.location ?? '')
      if (location.length > LARGE_LOCATION) {
        note({ kind: 'large_location', status: answer.status, method: sent.method, template: recipe.operation.template, detail: `Location of more than ${LARGE_LOCATION} characters`, index, curl: toCurl(target, sent), body: `Location: ${location.slice(0, 200)}… (${location.length} characters)`, requestId: answeredId })
      }
      if (answer.status < 300 && String(answer.headers['content-type'] ?? '').includes('json')) {
        try { pool.harvest(recipe.operation.template, JSON.parse(answer.body)) } catch { /* not JSON after all */ }
        if (typeof answer.headers.etag === 'string') pool.etags.set(resourcePath, answer.headers.etag)
      }
      if ((recipe.auth === 'session' || recipe.auth === 'session_bearer') && answer.status === 401) {
        refreshing ??= (async () => {
          try {
            // A 401 may come from a fuzzed header; only a session that no longer works is replaced.
            const check = await jsonCall(target, 'GET', '/api/me', { authorization: `Bearer ${credentials.sessionToken ?? ''}` })
            if (check.status === 401) credentials.sessionToken = await newSession(target, pool, sessions++)
          } catch { /* the next 401 tries again */ }
        })().finally(() => { refreshing = undefined })
        await refreshing
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  agent.destroy()
  await issuer.close()
  return result
}
