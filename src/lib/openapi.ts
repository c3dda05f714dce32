import { Type, type Static, type TSchema } from 'typebox'
import { STATUS_CODES } from 'node:http'
import type { SwaggerTransform, SwaggerTransformObject } from '@fastify/swagger'

/**
 * A reference to a schema registered with `app.addSchema`, typed as the
 * schema itself. Named schemas appear once under components.schemas in the
 * OpenAPI document instead of being inlined at every use.
 */
export function ref<T extends TSchema> (schema: T): ReturnType<typeof Type.Unsafe<Static<T>>> {
  const id = (schema as { $id?: unknown }).$id
  if (typeof id !== 'string') throw new TypeError('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>(Type.Ref(`${id}#`))
}

/** What the server accepts as a client's X-Request-Id (else it makes a UUID); so every request id has this form. */
export const REQUEST_ID_PATTERN = '^[A-Za-z0-9._:-]{1,64}$'

/** An RFC 3339 timestamp. Bounded so that input cannot carry an endless fraction of a second. */
export function Timestamp (options: Record<string, unknown> = {}): ReturnType<typeof Type.String> {
  return Type.String({ format: 'date-time', maxLength: 64, ...options })
}

export function Uuid (options: Record<string, unknown> = {}): ReturnType<typeof Type.String> {
  return Type.String({ format: 'uuid', maxLength: 36, ...options })
}

export const Problem = Type.Object({
  type: Type.String({ maxLength: 96, pattern: '^urn:gatehouse:problem:[a-z_]+$', description: '`urn:gatehouse:problem:<code>`; see docs/errors.md.' }),
  title: Type.String({ maxLength: 64, description: 'The HTTP status text.' }),
  status: Type.Integer({ format: 'int32', minimum: 400, maximum: 599 }),
  detail: Type.String({ description: 'What went wrong, for a person.' }),
  code: Type.String({ maxLength: 64, pattern: '^[a-z][a-z_]*$', description: 'Stable snake_case error code, for programs.', examples: ['user_not_found'] }),
  request_id: Type.String({ maxLength: 64, pattern: REQUEST_ID_PATTERN, description: 'Quote this when reporting a problem; it is in our logs.' }),
  errors: Type.Optional(Type.Array(Type.Object({
    in: Type.Enum(['body', 'query', 'path', 'header'], { description: 'Which part of the request.' }),
    pointer: Type.String({ pattern: '^(/([^~/]|~[01])*)*$', description: 'JSON pointer (RFC 6901) to the offending value.' }),
    detail: Type.String()
  })))
}, {
  $id: 'Problem',
  // RFC 9457 extension members: some problems carry more (Import Users' per-item report).
  additionalProperties: true,
  description: 'An RFC 9457 problem; every error has this shape, as application/problem+json. Some carry extension members, described with their operation.'
})

/** The media type of every error (RFC 9457); the error handler sends nothing else. */
export const PROBLEM_MEDIA_TYPE = 'application/problem+json'
const ProblemRef = ref(Problem)

/**
 * One error response, as a Problem in `application/problem+json`. The route's
 * serializer is chosen by that media type, which is the one sendProblem sets.
 */
function problemResponse (status: number | '4xx'): TSchema {
  const description = status === '4xx'
    ? 'Any other client error (a malformed URL or body, a method the path does not have, headers too large, …).'
    : STATUS_CODES[status] ?? 'Error'
  return Type.Unsafe({ description, content: { [PROBLEM_MEDIA_TYPE]: { schema: ProblemRef } } })
}

/**
 * Error responses to document for an operation, each a Problem. Every
 * operation can also answer 500, and any other 4xx (`4XX`).
 */
export function problems (...statuses: number[]): Record<string, TSchema> {
  const out: Record<string, TSchema> = {}
  for (const status of [...statuses, '4xx' as const, 500]) out[status] = problemResponse(status)
  return out
}

/** The two path families: the current release under /api, and 3.6.1's paths, kept as deprecated aliases. */
export const FAMILIES = [
  { prefix: '/api', legacy: false, tag: 'default', operationId: (id: string) => id },
  { prefix: '', legacy: true, tag: 'legacy', operationId: (id: string) => `legacy_${id}` }
] as const

/** Any one of the three ways to send an API key will do. */
export const SECURITY: Array<Record<string, string[]>> = [{ ApiKeyQuery: [] }, { ApiKeyHeader: [] }, { Bearer: [] }]

/**
 * `T | null` as `type: [T, "null"]` (OpenAPI 3.1) rather than anyOf: the
 * serializer writes type lists directly but must run a validator for anyOf.
 */
export function Nullable<T extends TSchema & { type: string }> (schema: T, options: Record<string, unknown> = {}): ReturnType<typeof Type.Unsafe<Static<T> | null>> {
  return Type.Unsafe<Static<T> | null>({ ...schema, ...options, type: [schema.type, 'null'] })
}

// ---------------------------------------------------------------------------
// Response headers. Each is described once, here. A route names the headers
// it sets itself with withHeaders(); the ones every route gets from a hook
// (request id, request limit, 3.6.1 deprecation) are added by
// operationTransform() from the route's config, so the document says what the
// hooks in system/http-policy.plugin.ts and the rate-limit plugin really send.

/** `name`: the header's name where its component's differs (SCIM's ETag is another header component than the REST API's). */
interface HeaderObject { description: string, required?: boolean, schema: Record<string, unknown>, name?: string }

const INT32_MAX = 2_147_483_647
const count = (description: string, minimum = 0): HeaderObject =>
  ({ description, schema: { type: 'integer', format: 'int32', minimum, maximum: INT32_MAX } })
/** `<URI-reference>; rel="…"`, comma-separated (RFC 8288). The request's own query is repeated in a next link, hence the bound. */
const LINK_SCHEMA = { type: 'string', maxLength: 65_536, pattern: '^<[^>]*>; rel="[a-z-]+"(, <[^>]*>; rel="[a-z-]+")*$' }

const RESPONSE_HEADERS = {
  'X-Request-Id': {
    required: true,
    description: 'This request\'s id: the client\'s own `X-Request-Id` if it had that form, else a new UUID. It is the `request_id` of errors, events and log lines.',
    schema: { type: 'string', maxLength: 64, pattern: REQUEST_ID_PATTERN }
  },
  'RateLimit-Limit': count('Requests allowed per window for this credential or client address (the general request limit; on a throttled sign-in, the sign-in throttle\'s).'),
  'RateLimit-Remaining': count('Requests left in the current window.'),
  'RateLimit-Reset': count('Seconds until the current window ends.'),
  'Retry-After': count('Seconds to wait before trying again.', 1),
  'WWW-Authenticate': {
    required: true,
    description: 'The ways to authenticate: `Bearer realm="gatehouse", ApiKey realm="gatehouse"`.',
    schema: { type: 'string', maxLength: 128, pattern: '^Bearer realm="[^"]*"' }
  },
  ETag: {
    required: true,
    description: 'The version of the user or group, as a strong entity tag; send it as `If-Match` to refuse lost updates.',
    schema: { type: 'string', maxLength: 22, pattern: '^"[0-9]+"$', examples: ['"3"'] }
  },
  Location: {
    required: true,
    description: 'The path of the new resource (the 3.6.1 path when created through one).',
    schema: { type: 'string', format: 'uri-reference', maxLength: 2048, examples: ['/auth/api/users/01a1fd7c-b1e2-7699-a01a-121c313edad5'] }
  },
  Link: {
    description: '`<…>; rel="next"`: the URL of the next page (every query parameter kept but the cursor and `API_KEY`). Absent on the last page.',
    schema: LINK_SCHEMA
  },
  'Idempotent-Replayed': {
    description: '`true`: this is the stored answer to an earlier request with the same `Idempotency-Key` and body, sent again (status, body, `Location`, `ETag` and `Content-Type` as they were); nothing was done this time. Absent on an answer made for this request.',
    schema: { type: 'string', enum: ['true'] }
  },
  ScimETag: {
    name: 'ETag',
    required: true,
    description: 'The version of the SCIM user or group, as a weak entity tag (its `meta.version`); send it as `If-Match` to refuse lost updates.',
    schema: { type: 'string', maxLength: 24, pattern: '^W/"[0-9]+"$', examples: ['W/"3"'] }
  },
  ScimLocation: {
    name: 'Location',
    required: true,
    description: 'The new SCIM resource\'s URL (its `meta.location`).',
    schema: { type: 'string', format: 'uri', maxLength: 2048, examples: ['https://gatehouse.example.com/auth/scim/v2/Users/01a1fd7c-b1e2-7699-a01a-121c313edad5'] }
  },
  Deprecation: {
    required: true,
    description: 'This 3.6.1 path is deprecated (RFC 9745): `@<seconds since the epoch>` of the deprecation.',
    schema: { type: 'string', maxLength: 24, pattern: '^@[0-9]+$' }
  },
  Sunset: {
    required: true,
    description: 'When this 3.6.1 path may stop working (RFC 8594), as an HTTP date; setting LEGACY_SUNSET.',
    schema: { type: 'string', maxLength: 64, pattern: '^[A-Z][a-z]{2}, [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT$' }
  }
} satisfies Record<string, HeaderObject>

export type ResponseHeader = keyof typeof RESPONSE_HEADERS

/** Documented as components.headers; on a 3.6.1 path, Link always names the successor and on a paged list also holds the next page. */
const HEADER_COMPONENTS: Record<string, HeaderObject> = {
  ...RESPONSE_HEADERS,
  LegacyLink: {
    required: true,
    description: '`<…/api/…>; rel="successor-version"`: the same operation at its current path. On a paged list, also the next page\'s `<…>; rel="next"`.',
    schema: LINK_SCHEMA
  }
}

/**
 * A response schema that also names the headers the route sets on it. They
 * are documented (as declared in RESPONSE_HEADERS); the serializer ignores them.
 */
export function withHeaders<T extends TSchema> (schema: T, ...names: ResponseHeader[]): T {
  const headers: Record<string, unknown> = {}
  for (const name of names) headers[name] = { ...RESPONSE_HEADERS[name].schema, description: RESPONSE_HEADERS[name].description }
  return { ...schema, headers }
}

/**
 * The `Idempotency-Key` request header of a route with `config.idempotent`
 * (idempotency/idempotency.plugin.ts parses it): an RFC 8941 string, or the
 * same text bare; the key inside is 1 to 255 characters.
 */
const IDEMPOTENCY_KEY_PARAMETER = {
  type: 'string',
  minLength: 1,
  maxLength: 512,
  pattern: '^("([\\x20\\x21\\x23-\\x5B\\x5D-\\x7E]|\\\\["\\\\])+"|[\\x21\\x23-\\x2B\\x2D-\\x7E]+)$',
  description: 'Makes this request retry-safe (draft-ietf-httpapi-idempotency-key-header; docs/api.md, "Retry-safe writes"): a key of 1 to 255 characters ' +
    'that you choose for this one request, best a random UUID, as a quoted string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`) or bare. ' +
    'A retry with the same key and body gets the first answer again, with `Idempotent-Replayed: true`, and changes nothing; ' +
    'the same key with another body is refused (422 `idempotency_key_reused`), and while the first request still runs a retry gets 409 ' +
    '`idempotency_key_in_progress` with `Retry-After`. Keys are kept 24 hours, per credential and per operation.',
  examples: ['"8e03978e-40d5-43e8-bc93-6894a57f9324"']
}

/** Where operationTransform leaves an operation's finished response headers for finishDocument to put in place. */
const PENDING_HEADERS = 'x-gatehouse-response-headers'

/**
 * The @fastify/swagger `transform` hook: documents what the route's config
 * makes the server do, which no route schema states. Public routes (no
 * `scope`) get an explicit anonymous `security: [{}]`; rate-limited routes
 * (all but those with `rateLimit: false`, when a limit is on) get the 429
 * problem and the RateLimit-* headers; 3.6.1 aliases get Deprecation, Sunset
 * and the successor Link; every response gets X-Request-Id.
 */
export function operationTransform (options: { rateLimited: boolean }): SwaggerTransform {
  return ({ schema: routeSchema, url, route }) => {
    const schema = routeSchema as Record<string, unknown> | undefined
    if (schema === undefined || schema.hide === true || schema.response === undefined) return { schema: routeSchema, url }
    const config = (route.config ?? {}) as { scope?: unknown, legacy?: boolean, rateLimit?: unknown, idempotent?: boolean }
    const limited = options.rateLimited && config.rateLimit !== false
    const response = { ...(schema.response as Record<string, Record<string, unknown>> | undefined) }
    if (limited && response[429] === undefined) response[429] = tooManyRequests(response['4xx'])

    // Response status → header name → its entry in HEADER_COMPONENTS.
    const pending: Record<string, Record<string, string>> = {}
    for (const [status, declared] of Object.entries(response)) {
      const names = new Set(Object.keys((declared.headers ?? {}) as Record<string, unknown>) as ResponseHeader[])
      names.add('X-Request-Id')
      if (limited && /^[24]/.test(status)) for (const name of ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'] as const) names.add(name)
      if (status === '429' || status === '503') names.add('Retry-After')
      if (config.idempotent === true) {
        // Not on what is refused before the key is claimed (credential, media type, size) nor on what the client should retry.
        if (/^[24]/.test(status) && !['401', '413', '415', '429'].includes(status)) names.add('Idempotent-Replayed')
        if (status === '409') names.add('Retry-After')
      }
      if (status === '401' && config.scope !== undefined) names.add('WWW-Authenticate')
      if (config.legacy === true) for (const name of ['Deprecation', 'Sunset', 'Link'] as const) names.add(name)
      // Header name → component.
      const headers: Record<string, string> = {}
      for (const name of names) {
        const described = RESPONSE_HEADERS[name] as HeaderObject | undefined
        if (described === undefined) throw new Error(`${url}: response header ${name} is not described in RESPONSE_HEADERS`)
        headers[described.name ?? name] = name === 'Link' && config.legacy === true ? 'LegacyLink' : name
      }
      pending[status.toUpperCase()] = headers
    }
    const security = schema.security === undefined && config.scope === undefined ? { security: [{}] } : {}
    const idempotency = config.idempotent === true ? idempotencyKeyParameter(schema.headers as Record<string, any> | undefined) : {}
    return { schema: { ...schema, ...security, ...idempotency, response, [PENDING_HEADERS]: pending }, url }
  }
}

/**
 * The 429, in the form of the route's own errors: the first media type of its
 * `4XX` (a Problem; SCIM's error body on the SCIM routes).
 */
function tooManyRequests (otherErrors: Record<string, unknown> | undefined): Record<string, unknown> {
  const content = otherErrors?.content as Record<string, unknown> | undefined
  const [first] = Object.entries(content ?? {})
  return first === undefined ? problemResponse(429) as Record<string, unknown> : { description: STATUS_CODES[429], content: { [first[0]]: first[1] } }
}

/** The route's request headers with `Idempotency-Key` added (the plugin reads it; the route's schema does not name it). */
function idempotencyKeyParameter (headers: Record<string, any> | undefined): { headers: Record<string, unknown> } {
  return { headers: { type: 'object', ...headers, properties: { ...headers?.properties, 'idempotency-key': IDEMPOTENCY_KEY_PARAMETER } } }
}

/**
 * Request headers as the docs and RFCs spell them. @fastify/swagger names a
 * header parameter by its key in the route's schema, which is lower case
 * because Fastify matches it against the lower-cased incoming headers (any
 * case a client sends is accepted); a client generated from the document
 * takes the name as written, so the document gets the canonical one.
 */
const REQUEST_HEADER_NAMES: Record<string, string> = {
  'if-match': 'If-Match',
  'idempotency-key': 'Idempotency-Key'
}

/** Gives each header parameter its canonical name; a header missing from REQUEST_HEADER_NAMES fails the document. */
function canonicalHeaderParameters (path: string, parameters: Array<Record<string, any>> | undefined): void {
  for (const parameter of parameters ?? []) {
    if (parameter.in !== 'header') continue
    const name = REQUEST_HEADER_NAMES[String(parameter.name).toLowerCase()]
    if (name === undefined) throw new Error(`${path}: request header ${String(parameter.name)} has no canonical spelling in REQUEST_HEADER_NAMES`)
    parameter.name = name
  }
}

interface OpenApiDocument {
  paths?: Record<string, Record<string, Record<string, any>>>
  components?: { schemas?: Record<string, Record<string, any>>, headers?: Record<string, HeaderObject> }
}

const FORM_MEDIA_TYPES = ['application/x-www-form-urlencoded', 'multipart/form-data']

/**
 * The @fastify/swagger `transformObject` hook, run on the finished document:
 * puts the headers operationTransform prepared into the responses, as
 * references to components.headers (full header objects, with `required`);
 * spells request headers canonically (REQUEST_HEADER_NAMES); and says how a form body carries an array (each item a repeated field,
 * `groups=a&groups=b`), which is how the routes read form bodies (lib/forms.ts).
 */
export const finishDocument: SwaggerTransformObject = (documentObject) => {
  if (!('openapiObject' in documentObject)) return documentObject.swaggerObject
  const document = documentObject.openapiObject as OpenApiDocument
  const schemas = document.components?.schemas ?? {}
  const used: Record<string, HeaderObject> = {}
  for (const [path, item] of Object.entries(document.paths ?? {})) {
    for (const operation of Object.values(item)) {
      canonicalHeaderParameters(path, operation.parameters)
      const pending = operation[PENDING_HEADERS] as Record<string, Record<string, string>> | undefined
      delete operation[PENDING_HEADERS]
      for (const [status, headers] of Object.entries(pending ?? {})) {
        const response = operation.responses?.[status]
        if (response === undefined) continue
        response.headers = {}
        for (const [name, component] of Object.entries(headers)) {
          const { name: _name, ...header } = HEADER_COMPONENTS[component]!
          used[component] = header
          response.headers[name] = { $ref: `#/components/headers/${component}` }
        }
      }
      const content = operation.requestBody?.content as Record<string, Record<string, any>> | undefined
      for (const mediaType of FORM_MEDIA_TYPES) {
        const media = content?.[mediaType]
        if (content === undefined || media === undefined) continue
        const target = typeof media.schema?.$ref === 'string' ? schemas[media.schema.$ref.replace('#/components/schemas/', '')] : media.schema
        const arrays = Object.entries<Record<string, any>>(target?.properties ?? {})
          .filter(([, property]) => property.type === 'array' || (Array.isArray(property.type) && property.type.includes('array')))
        // The media object is shared by every content type of the body: the encoding goes on a copy.
        if (arrays.length > 0) content[mediaType] = { ...media, encoding: Object.fromEntries(arrays.map(([name]) => [name, { style: 'form', explode: true }])) }
      }
    }
  }
  if (Object.keys(used).length > 0) document.components = { ...document.components, headers: { ...document.components?.headers, ...used } }
  return documentObject.openapiObject
}
