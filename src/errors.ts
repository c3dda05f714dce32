import { randomUUID } from 'node:crypto'
import { STATUS_CODES, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyBaseLogger, FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { DatabaseConnectionError } from './db/connection-failure.ts'

/**
 * The stable error codes of the API. Clients branch on these; never rename one.
 * Each is documented in docs/errors.md.
 */
export type ErrorCode =
  | 'validation_failed'
  | 'malformed_body'
  | 'credentials_in_query'
  | 'malformed_request'
  | 'headers_too_large'
  | 'request_timeout'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'route_not_found'
  | 'method_not_allowed'
  | 'unauthenticated'
  | 'forbidden'
  | 'user_not_found'
  | 'api_key_not_found'
  | 'webhook_not_found'
  | 'webhook_delivery_not_found'
  | 'webhook_url_refused'
  | 'username_taken'
  | 'email_taken'
  | 'last_admin'
  | 'group_not_found'
  | 'group_exists'
  | 'too_many_groups'
  | 'too_many_api_keys'
  | 'precondition_failed'
  | 'invalid_cursor'
  | 'password_too_short'
  | 'password_too_long'
  | 'password_contains_username'
  | 'password_contains_email'
  | 'password_contains_context_word'
  | 'password_too_common'
  | 'password_hash_unsupported'
  | 'password_hash_out_of_bounds'
  | 'import_failed'
  | 'invalid_credentials'
  | 'csrf_rejected'
  | 'conflict'
  | 'idempotency_key_reused'
  | 'invalid_filter'
  | 'invalid_value'
  | 'invalid_path'
  | 'idempotency_key_in_progress'
  | 'rate_limited'
  | 'mfa_failed'
  | 'mfa_required'
  | 'reauthentication_required'
  | 'mfa_not_enrolled'
  | 'totp_not_configured'
  | 'totp_already_enrolled'
  | 'totp_not_pending'
  | 'invalid_code'
  | 'passkey_not_found'
  | 'passkey_rejected'
  | 'server_busy'
  | 'sso_failed'
  | 'sso_refused'
  | 'sso_provider_not_found'
  | 'sso_provider_exists'
  | 'sso_provider_read_only'
  | 'identity_not_found'
  | 'session_not_found'
  | 'password_sign_in_disabled'
  | 'token_invalid'
  | 'invitation_not_pending'
  | 'mail_unavailable'
  | 'email_required'
  | 'directory_unavailable'
  | 'database_unavailable'
  | 'dependency_unavailable'
  | 'internal_error'

export interface FieldError {
  /** Where the offending value was: body, query, path or header. */
  in: string
  /** RFC 6901 JSON pointer to the value inside that part. */
  pointer: string
  detail: string
}

export class AppError extends Error {
  readonly code: ErrorCode
  readonly status: number
  readonly detail: string
  readonly errors: FieldError[] | undefined
  readonly headers: Record<string, string>
  /** RFC 9457 extension members, added to the problem body. */
  readonly extensions: Record<string, unknown> | undefined

  constructor (code: ErrorCode, status: number, detail: string, options: { cause?: unknown, errors?: FieldError[], headers?: Record<string, string>, extensions?: Record<string, unknown> } = {}) {
    super(detail, { cause: options.cause })
    this.name = 'AppError'
    this.code = code
    this.status = status
    this.detail = detail
    this.errors = options.errors
    this.headers = options.headers ?? {}
    this.extensions = options.extensions
  }
}

export const PROBLEM_TYPE_PREFIX = 'urn:gatehouse:problem:'

export interface ProblemBody {
  type: string
  title: string
  status: number
  detail: string
  code: ErrorCode
  request_id: string
  errors?: FieldError[]
}

export function problemFor (error: AppError, requestId: string): ProblemBody {
  // Extension members first, so they can never overwrite a standard member.
  const body: ProblemBody = {
    ...error.extensions,
    type: PROBLEM_TYPE_PREFIX + error.code,
    title: STATUS_CODES[error.status] ?? 'Error',
    status: error.status,
    detail: error.detail,
    code: error.code,
    request_id: requestId
  }
  if (error.errors !== undefined) body.errors = error.errors
  return body
}

export function sendProblem (reply: FastifyReply, error: AppError): FastifyReply {
  for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
  return reply
    .code(error.status)
    .type('application/problem+json; charset=utf-8')
    .send(problemFor(error, reply.request.id))
}

const VALIDATION_PART: Record<string, string> = { body: 'body', querystring: 'query', params: 'path', headers: 'header' }

interface AjvIssue { instancePath: string, keyword: string, message?: string, params: Record<string, unknown> }

/** Patterns a person should not have to read as regular expressions, in words; see patternInWords. */
const PATTERN_WORDS = new Map<string, string>()

/**
 * Names a schema pattern in words: a value that does not match it is then
 * reported as "must be <words>" rather than with the regular expression.
 * Returns the pattern, for use in the schema.
 */
export function patternInWords (pattern: string, words: string): string {
  PATTERN_WORDS.set(pattern, words)
  return pattern
}

function fieldErrorsFrom (error: FastifyError): FieldError[] {
  const part = VALIDATION_PART[error.validationContext ?? 'body'] ?? 'body'
  return ((error.validation ?? []) as AjvIssue[]).map(issue => {
    let pointer = issue.instancePath
    let detail = issue.message ?? 'is invalid'
    if (issue.keyword === 'additionalProperties') {
      const name = String(issue.params.additionalProperty)
      pointer = `${pointer}/${escapePointer(name)}`
      detail = 'is not a field this operation accepts (unknown or read-only)'
    } else if (issue.keyword === 'required') {
      pointer = `${pointer}/${escapePointer(String(issue.params.missingProperty))}`
      detail = 'is required'
    } else if (issue.keyword === 'pattern' && PATTERN_WORDS.has(String(issue.params.pattern))) {
      detail = `must be ${PATTERN_WORDS.get(String(issue.params.pattern))!}`
    }
    return { in: part, pointer, detail }
  })
}

export function escapePointer (token: string): string {
  return token.replace(/~/g, '~0').replace(/\//g, '~1')
}

/**
 * Fastify's own errors, by code, turned into ours. Anything not listed with a
 * 4xx status keeps its status under a generic code; 5xx are never explained.
 */
const FASTIFY_ERRORS: Record<string, [ErrorCode, number, string]> = {
  FST_ERR_CTP_INVALID_MEDIA_TYPE: ['unsupported_media_type', 415, 'This operation does not accept that Content-Type.'],
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: ['malformed_body', 400, 'Content-Length does not match the body.'],
  FST_ERR_CTP_BODY_TOO_LARGE: ['payload_too_large', 413, 'The request body is larger than this service accepts.'],
  FST_ERR_CTP_EMPTY_JSON_BODY: ['malformed_body', 400, 'The body is empty but Content-Type says JSON.'],
  FST_ERR_CTP_INVALID_JSON_BODY: ['malformed_body', 400, 'The body is not valid JSON.'],
  FST_INVALID_MULTIPART_CONTENT_TYPE: ['unsupported_media_type', 415, 'The body is not multipart.'],
  FST_REQ_FILE_TOO_LARGE: ['payload_too_large', 413, 'An uploaded part is larger than this service accepts.'],
  FST_PARTS_LIMIT: ['payload_too_large', 413, 'The form has more parts than this service accepts (at most 50).'],
  FST_FILES_LIMIT: ['validation_failed', 422, 'File uploads are not accepted; send form fields only.'],
  FST_FIELDS_LIMIT: ['payload_too_large', 413, 'The form has more fields than this service accepts (at most 50).'],
  FST_PROTO_VIOLATION: ['malformed_body', 400, 'The body contains a forbidden property name.'],
  FST_ERR_BAD_URL: ['route_not_found', 404, 'The URL could not be decoded.'],
  FST_ERR_ASYNC_CONSTRAINT: ['internal_error', 500, 'Something went wrong on our side. The request id identifies it in our logs.']
}

/** Any thrown value as the AppError it answers as: ours as they are, database and Fastify errors by their meaning, anything else 500. */
export function toAppError (error: unknown): AppError {
  if (error instanceof AppError) return error
  const mapped = mapDatabaseError(error)
  if (mapped !== undefined) return mapped
  const e = error as FastifyError
  if (e.validation !== undefined) {
    return new AppError('validation_failed', 422, 'The request does not match the schema of this operation.', { errors: fieldErrorsFrom(e) })
  }
  const known = e.code !== undefined ? FASTIFY_ERRORS[e.code] : undefined
  if (known !== undefined) return new AppError(known[0], known[1], known[2], { cause: error })
  // The JSON parser's prototype-poisoning guard throws a plain 400 SyntaxError with this text.
  if (e.statusCode === 400 && /forbidden prototype property|__proto__|constructor/.test(e.message)) {
    return new AppError('malformed_body', 400, 'The body contains a forbidden property name (__proto__ or constructor).', { cause: error })
  }
  if (e instanceof SyntaxError && e.statusCode === 400) {
    return new AppError('malformed_body', 400, 'The body is not valid JSON.', { cause: error })
  }
  // busboy throws this plain Error, before reading a byte, for `multipart/form-data` without `boundary=`.
  if (e.message === 'Multipart: Boundary not found') {
    return new AppError('malformed_body', 400, 'A multipart/form-data body needs a boundary parameter: Content-Type: multipart/form-data; boundary=…', { cause: error })
  }
  if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return new AppError(e.statusCode === 429 ? 'rate_limited' : 'malformed_body', e.statusCode, e.statusCode === 429 ? 'Too many requests; slow down.' : 'The request could not be processed.', { cause: error })
  }
  return new AppError('internal_error', 500, 'Something went wrong on our side. The request id identifies it in our logs.', { cause: error })
}

/** Where the database says no. Kept in one place so services never parse driver errors. */
const UNIQUE_TARGETS: Array<[RegExp, ErrorCode, string]> = [
  [/username_key/, 'username_taken', 'A user with that username already exists (usernames are unique ignoring case).'],
  [/email_key/, 'email_taken', 'A user with that email address already exists (addresses are unique ignoring case).'],
  [/groups_name_key|groups\.name_key|groups_display_name|groups\.display_name/, 'group_exists', 'A group with that name already exists (names are unique ignoring case).']
]

/** PostgreSQL's connection_exception class, admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections. */
const PG_UNAVAILABLE = /^(08|57P0|53300)/
/** Sockets refused or gone (system errors' codes), SQLite's file locked or not openable. */
const NET_UNAVAILABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH', 'EPIPE', 'SQLITE_BUSY', 'SQLITE_LOCKED', 'SQLITE_CANTOPEN'])

export function mapDatabaseError (error: unknown): AppError | undefined {
  if (typeof error !== 'object' || error === null) return undefined
  const e = error as { code?: unknown, constraint?: unknown, message?: unknown }
  const code = typeof e.code === 'string' ? e.code : ''
  const message = typeof e.message === 'string' ? e.message : ''
  const isUnique = code === '23505' || code === 'SQLITE_CONSTRAINT_UNIQUE' || code === 'SQLITE_CONSTRAINT_PRIMARYKEY'
  if (isUnique) {
    const where = `${typeof e.constraint === 'string' ? e.constraint : ''} ${message}`
    for (const [pattern, appCode, detail] of UNIQUE_TARGETS) {
      if (pattern.test(where)) return new AppError(appCode, 409, detail, { cause: error })
    }
    return new AppError('conflict', 409, 'The change conflicts with an existing record.', { cause: error })
  }
  if (code === '23503' || code === 'SQLITE_CONSTRAINT_FOREIGNKEY') {
    return new AppError('conflict', 409, 'The change refers to a record that no longer exists.', { cause: error })
  }
  // What failed between us and PostgreSQL is classified where it happens (db/connection-failure.ts), never by its text here.
  if (error instanceof DatabaseConnectionError && error.kind === 'query_timeout') return databaseTooSlow(error)
  if (error instanceof DatabaseConnectionError || PG_UNAVAILABLE.test(code) || NET_UNAVAILABLE.has(code)) {
    return new AppError('database_unavailable', 503, 'The database is unavailable; try again shortly.', { cause: error, headers: { 'Retry-After': '5' } })
  }
  // ioredis, when the shared Redis (sign-in throttling, request limits) cannot be reached or does not answer in time.
  if ((error as { name?: unknown }).name === 'MaxRetriesPerRequestError' || /^(Connection is closed|Stream isn't writeable|Command timed out|Socket timeout)/.test(message)) {
    return new AppError('dependency_unavailable', 503, 'A service this one depends on is unavailable; try again shortly.', { cause: error, headers: { 'Retry-After': '5' } })
  }
  if (code === '40P01' || code === '40001') {
    return new AppError('conflict', 409, 'A concurrent change got in the way; retry the request.', { cause: error })
  }
  // The server's statement_timeout (query_canceled).
  if (code === '57014') return databaseTooSlow(error)
  return undefined
}

function databaseTooSlow (cause: unknown): AppError {
  return new AppError('database_unavailable', 503, 'The database took too long to answer; try again shortly.', { cause, headers: { 'Retry-After': '5' } })
}

/**
 * Node fails the request stream with ECONNRESET "aborted" when the client
 * hangs up before sending its whole body. Nobody is left to answer, and it is
 * not our failure (nor the database's, which the same code would otherwise suggest).
 */
function isClientAbort (error: unknown, request: FastifyRequest): boolean {
  return (error as { code?: unknown } | null)?.code === 'ECONNRESET' && request.raw.readableAborted
}

const JSON_HINT = 'send JSON with Content-Type: application/json'

/**
 * `curl -d '{…}'` sends JSON as application/x-www-form-urlencoded, and a bare
 * HTTP client may send no Content-Type at all: say so, instead of reporting a
 * field named `{"username": …}` or a media type nobody sent.
 */
function withContentTypeHint (appError: AppError, request: FastifyRequest): AppError {
  const type = request.headers['content-type']
  const essence = type?.split(';')[0]!.trim().toLowerCase()
  let detail: string | undefined
  if (appError.code === 'unsupported_media_type' && type === undefined) {
    detail = `The request has a body but no Content-Type; ${JSON_HINT}.`
  } else if (appError.code === 'validation_failed' && appError.errors?.some(e => e.in === 'body')) {
    const body = request.body
    if (type === undefined && body === undefined) {
      detail = `The request has no body; ${JSON_HINT}.`
    } else if (essence === 'application/x-www-form-urlencoded' && typeof body === 'object' && body !== null &&
        Object.keys(body).some(name => /^\s*[{[]/.test(name))) {
      detail = `The body looks like JSON but was sent as application/x-www-form-urlencoded (what curl -d sends unless told otherwise); ${JSON_HINT}.`
    }
  }
  if (detail === undefined) return appError
  return new AppError(appError.code, appError.status, detail, { cause: appError.cause, errors: appError.errors, headers: appError.headers, extensions: appError.extensions })
}

/**
 * Logs a 5xx answer under the request's id. A 503 is a condition the service
 * expects and names (too many hashes waiting, the database, Redis, LDAP or an
 * identity provider unavailable): a warning for operators, with its cause.
 * Anything else is a fault in gatehouse and logged as an error.
 */
export function logFailure (log: FastifyBaseLogger, appError: AppError | undefined, cause: unknown): void {
  if (appError !== undefined && appError.status < 500) return
  if (appError?.status === 503) {
    log.warn({ err: cause, code: appError.code }, 'request refused: a dependency is unavailable or the service is busy')
  } else {
    log.error({ err: cause, code: appError?.code ?? 'internal_error' }, 'request failed')
  }
}

/**
 * A body that does not match its schema is also checked against the route's
 * other rules (`bodyRules`, a password's), so the 422 lists all its problems
 * at once instead of the rest only after the schema's are fixed. A value the
 * schema already reported is not reported twice.
 */
function withBodyRules (appError: AppError, error: unknown, request: FastifyRequest): AppError {
  const rules = request.routeOptions.config.bodyRules
  if (rules === undefined || appError.code !== 'validation_failed' || (error as FastifyError | null)?.validationContext !== 'body') return appError
  const reported = new Set((appError.errors ?? []).map(e => e.pointer))
  const more = rules(request.body).filter(e => !reported.has(e.pointer))
  if (more.length === 0) return appError
  return new AppError(appError.code, appError.status, appError.detail, { cause: appError.cause, errors: [...(appError.errors ?? []), ...more], headers: appError.headers, extensions: appError.extensions })
}

/** A body over the limit: say the limit of this operation, and what raises it. */
function withBodyLimit (appError: AppError, error: unknown, request: FastifyRequest): AppError {
  if ((error as FastifyError | null)?.code !== 'FST_ERR_CTP_BODY_TOO_LARGE') return appError
  const limit = request.routeOptions.bodyLimit
  return new AppError(appError.code, appError.status,
    `The request body is larger than this operation accepts: at most ${limit} bytes. An operator can raise the limit with BODY_LIMIT_BYTES.`,
    { cause: appError.cause, headers: appError.headers })
}

export function registerErrorHandling (app: FastifyInstance): void {
  app.setErrorHandler((error: unknown, request: FastifyRequest, reply: FastifyReply) => {
    if (isClientAbort(error, request)) {
      request.log.info({ err: error }, 'client closed the connection before sending the whole request')
      return sendProblem(reply, new AppError('malformed_body', 400, 'The request ended before its body was complete.', { cause: error }))
    }
    const appError = withBodyLimit(withContentTypeHint(withBodyRules(toAppError(error), error, request), request), error, request)
    if (appError.status >= 500) {
      logFailure(request.log, appError, appError.cause ?? error)
    } else if (appError.cause !== undefined && appError.code === 'conflict') {
      request.log.warn({ err: appError.cause }, 'constraint violation')
    }
    return sendProblem(reply, appError)
  })

  app.setNotFoundHandler((request, reply) => {
    const allowed = allowedMethods(app, request)
    if (allowed.length > 0) {
      return sendProblem(reply, new AppError('method_not_allowed', 405, `${request.method} is not allowed here; allowed: ${allowed.join(', ')}.`, { headers: { Allow: allowed.join(', ') } }))
    }
    return sendProblem(reply, new AppError('route_not_found', 404, `No operation at ${request.method} ${request.url.split('?')[0] ?? ''}.`))
  })
}

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'] as const

function allowedMethods (app: FastifyInstance, request: FastifyRequest): string[] {
  const url = request.url.split('?')[0] ?? ''
  // A route of this method took the request and found nothing (a static file that is not there): that is 404, not 405.
  if (app.findRoute({ method: request.method as (typeof METHODS)[number], url }) !== null) return []
  return METHODS.filter(method => method !== request.method && app.findRoute({ method, url }) !== null)
}

/**
 * Headers every answer carries (system/http-policy.plugin.ts sets them in onSend); the two handlers
 * below answer outside any route, where no hook runs.
 */
const STANDING_HEADERS: Record<string, string> = {
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer'
}

/**
 * Fastify's `frameworkErrors`: a URL whose percent-encoding cannot be decoded,
 * or a path parameter longer than the router takes, found before routing.
 * No hook runs for these, so the headers every answer carries are set here,
 * `hsts` (config.hsts) over HTTPS as the HTTP policy's onSend sets it.
 */
export function answerFrameworkError (error: FastifyError, request: FastifyRequest, reply: FastifyReply, hsts: string | undefined): void {
  const appError = error.code === 'FST_ERR_MAX_PARAM_LENGTH'
    ? new AppError('validation_failed', 422, 'The request does not match the schema of this operation.', {
      errors: [{ in: 'path', pointer: '', detail: 'a path parameter is longer than this service accepts' }]
    })
    : toAppError(error)
  logFailure(request.log, appError, error)
  reply.headers({ ...STANDING_HEADERS, 'X-Request-Id': request.id })
  if (hsts !== undefined && request.protocol === 'https') reply.header('Strict-Transport-Security', hsts)
  sendProblem(reply, appError)
}

const CLIENT_ERRORS: Record<string, [ErrorCode, number, string]> = {
  HPE_HEADER_OVERFLOW: ['headers_too_large', 431, 'The request headers are larger than this service accepts.'],
  ERR_HTTP_REQUEST_TIMEOUT: ['request_timeout', 408, 'The request was not received in time (REQUEST_TIMEOUT_MS).']
}

/** The method of the request whose bytes Node could not parse, when they show its request line. */
function methodOf (socket: Socket, rawPacket: unknown): string | undefined {
  // Once the headers are parsed, Node has a response object for the request (the body may still be arriving).
  const response = (socket as Socket & { _httpMessage?: ServerResponse })._httpMessage
  if (response?.req !== undefined) return response.req.method
  if (!Buffer.isBuffer(rawPacket)) return undefined
  return /^([A-Z]+) \S+ HTTP\/1\.[01]\r?\n/.exec(rawPacket.subarray(0, 8192).toString('latin1'))?.[1]
}

/**
 * Fastify's `clientErrorHandler`: what Node's HTTP parser rejects before a
 * request exists (oversized headers, a request not received within
 * REQUEST_TIMEOUT_MS, bytes that are not HTTP). The answer is written to the
 * socket by hand, as a problem, then the connection is closed. A HEAD request
 * gets no body; nor does one whose request line is not in the packet at hand,
 * as it may have been HEAD.
 */
export function answerClientError (this: FastifyInstance, err: Error & { code?: string, rawPacket?: unknown }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  const [code, status, detail] = CLIENT_ERRORS[err.code ?? ''] ?? ['malformed_request', 400, 'The request is not well-formed HTTP/1.1.']
  // Not the error itself: it carries the raw bytes received, credentials included.
  this.log.info({ code, reason: err.code, remoteAddress: socket.remoteAddress }, 'refused a request before it was received whole')
  const response = (socket as Socket & { _httpMessage?: ServerResponse })._httpMessage
  // An answer is already on its way: cut it off, as Node does.
  if (response?.headersSent === true || !socket.writable) {
    socket.destroy(err)
    return
  }
  const method = methodOf(socket, err.rawPacket)
  const requestId = randomUUID()
  const body = method !== undefined && method !== 'HEAD' ? JSON.stringify(problemFor(new AppError(code, status, detail), requestId)) : ''
  const headers = {
    Connection: 'close',
    ...(body !== '' ? { 'Content-Type': 'application/problem+json; charset=utf-8' } : {}),
    'Content-Length': String(Buffer.byteLength(body)),
    'X-Request-Id': requestId,
    ...STANDING_HEADERS
  }
  socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n${Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('')}\r\n${body}`)
  socket.destroy(err)
}
