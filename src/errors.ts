import { STATUS_CODES } from 'node:http'
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'

/**
 * The stable error codes of the API. Clients branch on these; never rename one.
 * Each is documented in docs/errors.md.
 */
export type ErrorCode =
  | 'validation_failed'
  | 'malformed_body'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'route_not_found'
  | 'method_not_allowed'
  | 'unauthenticated'
  | 'forbidden'
  | 'user_not_found'
  | 'api_key_not_found'
  | 'username_taken'
  | 'email_taken'
  | 'last_admin'
  | 'precondition_failed'
  | 'invalid_cursor'
  | 'password_too_short'
  | 'password_too_long'
  | 'password_contains_username'
  | 'password_too_common'
  | 'password_hash_unsupported'
  | 'password_hash_out_of_bounds'
  | 'import_failed'
  | 'invalid_credentials'
  | 'csrf_rejected'
  | 'conflict'
  | 'rate_limited'
  | 'server_busy'
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
    }
    return { in: part, pointer, detail }
  })
}

function escapePointer (token: string): string {
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
  FST_PARTS_LIMIT: ['payload_too_large', 413, 'The form has more parts than this service accepts.'],
  FST_FILES_LIMIT: ['validation_failed', 422, 'File uploads are not accepted; send form fields only.'],
  FST_FIELDS_LIMIT: ['payload_too_large', 413, 'The form has more fields than this service accepts.'],
  FST_PROTO_VIOLATION: ['malformed_body', 400, 'The body contains a forbidden property name.'],
  FST_ERR_BAD_URL: ['route_not_found', 404, 'The URL could not be decoded.']
}

function toAppError (error: unknown): AppError {
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
  if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return new AppError(e.statusCode === 429 ? 'rate_limited' : 'malformed_body', e.statusCode, e.statusCode === 429 ? 'Too many requests; slow down.' : 'The request could not be processed.', { cause: error })
  }
  return new AppError('internal_error', 500, 'Something went wrong on our side. The request id identifies it in our logs.', { cause: error })
}

/** Where the database says no. Kept in one place so services never parse driver errors. */
const UNIQUE_TARGETS: Array<[RegExp, ErrorCode, string]> = [
  [/username_key/, 'username_taken', 'A user with that username already exists (usernames are unique ignoring case).'],
  [/email_key/, 'email_taken', 'A user with that email address already exists (addresses are unique ignoring case).']
]

const PG_UNAVAILABLE = /^(08|57P0|53300)/
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
  if (PG_UNAVAILABLE.test(code) || NET_UNAVAILABLE.has(code) ||
      /timeout exceeded when trying to connect|Connection terminated|connect ECONNREFUSED/.test(message)) {
    return new AppError('database_unavailable', 503, 'The database is unavailable; try again shortly.', { cause: error, headers: { 'Retry-After': '5' } })
  }
  // ioredis, when the shared Redis (sign-in throttling, request limits) cannot be reached.
  if ((error as { name?: unknown }).name === 'MaxRetriesPerRequestError' || /^Connection is closed|Stream isn't writeable/.test(message)) {
    return new AppError('dependency_unavailable', 503, 'A service this one depends on is unavailable; try again shortly.', { cause: error, headers: { 'Retry-After': '5' } })
  }
  if (code === '40P01' || code === '40001') {
    return new AppError('conflict', 409, 'A concurrent change got in the way; retry the request.', { cause: error })
  }
  if (code === '57014') {
    return new AppError('database_unavailable', 503, 'The database took too long to answer; try again shortly.', { cause: error, headers: { 'Retry-After': '5' } })
  }
  return undefined
}

export function registerErrorHandling (app: FastifyInstance): void {
  app.setErrorHandler((error: unknown, request: FastifyRequest, reply: FastifyReply) => {
    const appError = toAppError(error)
    if (appError.status >= 500) {
      request.log.error({ err: appError.cause ?? error, code: appError.code }, 'request failed')
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
  return METHODS.filter(method => method !== request.method && app.findRoute({ method, url }) !== null)
}
