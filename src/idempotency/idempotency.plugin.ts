import { createHash, type Hash } from 'node:crypto'
import { Transform, type Readable } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import type { Principal } from '../auth/principal.ts'
import { AppError } from '../errors.ts'
import { claimIdempotencyKey, finishIdempotentRequest, type HeldKey, type StoredAnswer } from './idempotency.service.ts'

/** The request header (draft-ietf-httpapi-idempotency-key-header), as Node names it. */
export const IDEMPOTENCY_KEY_HEADER = 'idempotency-key'
/** Sent with an answer given again to a retry, rather than made for this request. */
export const REPLAYED_HEADER = 'Idempotent-Replayed'
export const IDEMPOTENCY_KEY_MAX_LENGTH = 255
/** The headers of an answer that a retry gets again; the rest (request id, rate limits, …) are this request's own. */
const REPLAYED_ANSWER_HEADERS = ['content-type', 'location', 'etag']

/** An RFC 8941 sf-string, the draft's form: `"…"`, with `\"` and `\\` as the only escapes. */
const SF_STRING = /^"((?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\["\\])*)"$/
/** The bare form many clients send (Stripe's): visible ASCII without quotes or commas (which would join two fields). */
const BARE_KEY = /^[\x21\x23-\x2B\x2D-\x7E]+$/

/**
 * The key of an `Idempotency-Key` field value: the draft's sf-string
 * (`"8e03978e-…"`), or the same text sent bare. Either way 1 to 255 characters.
 */
export function parseIdempotencyKey (value: string): string {
  const text = value.trim()
  const quoted = SF_STRING.exec(text)
  const key = quoted !== null ? quoted[1]!.replace(/\\(["\\])/g, '$1') : BARE_KEY.test(text) ? text : undefined
  if (key === undefined || key.length === 0 || key.length > IDEMPOTENCY_KEY_MAX_LENGTH) {
    throw new AppError('validation_failed', 422, 'The request does not match the schema of this operation.', {
      errors: [{
        in: 'header',
        pointer: `/${IDEMPOTENCY_KEY_HEADER}`,
        detail: `must be one key of 1 to ${IDEMPOTENCY_KEY_MAX_LENGTH} characters: a quoted string ("…", printable ASCII) or the same without quotes (no spaces or commas)`
      }]
    })
  }
  return key
}

/** Whose keys these are: one API key's, or one user's through any of their sessions. */
function scopeOf (principal: Principal): string {
  return principal.type === 'session' ? `user:${principal.userId!}` : `api_key:${principal.id}`
}

function pathOf (request: FastifyRequest): string {
  return request.url.split('?', 1)[0]!
}

function mediaTypeOf (request: FastifyRequest): string {
  return (request.headers['content-type'] ?? '').split(';', 1)[0]!.trim().toLowerCase()
}

interface KeyedRequest {
  key: string
  /** The fingerprint being made: method, path, media type, then the body. */
  fingerprint: Hash
  held?: HeldKey
  finished?: boolean
}

/**
 * `config: { idempotent: true }` on a route (with a `scope`) makes it
 * retry-safe: a request with an `Idempotency-Key` claims the key before its
 * body is validated, and its answer is stored when it is sent, so a retry
 * with the same key and body gets that answer again (docs/api.md,
 * "Retry-safe writes"). Only those routes get the hooks, and only requests
 * that send the header touch the table.
 */
/** Answers kept for a retry in place of the one sent; see replayWith. */
const replayBodies = new WeakMap<FastifyRequest, unknown>()

/**
 * Keeps `body` (JSON), not the answer being sent, for a retry with the same
 * Idempotency-Key: for an answer holding a secret that must never be stored
 * (an invitation's link and code, kept only as digests). The retry gets the
 * same status and headers, without the secret.
 */
export function replayWith (request: FastifyRequest, body: unknown): void {
  replayBodies.set(request, body)
}

export default fp(async function idempotencyPlugin (app: FastifyInstance) {
  const keyed = new WeakMap<FastifyRequest, KeyedRequest>()

  /**
   * Starts the fingerprint, and feeds it the body's bytes as the parser reads
   * them. A multipart body is read by busboy from the raw request, and its
   * boundary is chosen anew by most clients at each attempt: its fields are
   * fingerprinted once parsed (see claimKey).
   */
  async function fingerprintBody (request: FastifyRequest, _reply: FastifyReply, payload: Readable): Promise<Readable> {
    const value = request.headers[IDEMPOTENCY_KEY_HEADER]
    if (value === undefined) return payload
    const key = parseIdempotencyKey(Array.isArray(value) ? value.join(', ') : value)
    const mediaType = mediaTypeOf(request)
    const fingerprint = createHash('sha256').update(`${request.method}\n${pathOf(request)}\n${mediaType}\n`)
    keyed.set(request, { key, fingerprint })
    if (mediaType === '' || mediaType === 'multipart/form-data') return payload
    const tap = new Transform({
      transform (chunk: Buffer, _encoding, done) {
        fingerprint.update(chunk)
        done(null, chunk)
      }
    })
    payload.on('error', (error) => { tap.destroy(error) })
    return payload.pipe(tap)
  }

  async function claimKey (request: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
    const state = keyed.get(request)
    if (state === undefined) return
    if (mediaTypeOf(request) === 'multipart/form-data') {
      const fields = Object.entries((request.body ?? {}) as Record<string, unknown>).sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0)
      state.fingerprint.update(JSON.stringify(fields))
    }
    const id = { scope: scopeOf(request.principal!), method: request.method, path: pathOf(request), key: state.key }
    const claim = await claimIdempotencyKey(app.db, id, state.fingerprint.digest('hex'))
    if ('held' in claim) {
      state.held = claim.held
      return
    }
    const { statusCode, headers, body } = claim.replay
    return await reply.code(statusCode).headers(headers).header(REPLAYED_HEADER, 'true').send(body)
  }

  async function storeAnswer (request: FastifyRequest, reply: FastifyReply, payload: unknown): Promise<unknown> {
    const state = keyed.get(request)
    if (state?.held === undefined || state.finished === true) return payload
    state.finished = true
    // A streamed answer is not kept: the key is freed instead (no idempotent route streams today).
    const body = replayBodies.has(request) ? Buffer.from(JSON.stringify(replayBodies.get(request)), 'utf8') : bytesOf(payload)
    let answer: StoredAnswer | undefined
    if (body !== undefined) {
      const headers: Record<string, string> = {}
      for (const name of REPLAYED_ANSWER_HEADERS) {
        const value = reply.getHeader(name)
        if (value !== undefined) headers[name] = String(value)
      }
      answer = { statusCode: reply.statusCode, headers, body }
    }
    try {
      await finishIdempotentRequest(app.db, state.held, answer)
    } catch (error) {
      // The answer still goes out. The key stays in progress until its lease ends; a retry after that runs the request again.
      request.log.warn({ err: error }, 'could not record the answer given to an Idempotency-Key')
    }
    return payload
  }

  app.addHook('onRoute', (route: RouteOptions) => {
    if (route.config?.idempotent !== true) return
    if (route.config.scope === undefined) {
      throw new Error(`${String(route.method)} ${route.url}: an idempotent route needs a scope (keys are kept per credential)`)
    }
    route.preParsing = [...asArray(route.preParsing), fingerprintBody]
    // First of the route's own: its form coercion, and the schema's validation after it, are answers the key keeps too.
    route.preValidation = [claimKey, ...asArray(route.preValidation)]
    route.onSend = [...asArray(route.onSend), storeAnswer]
  })
}, { name: 'idempotency' })

/** The bytes of a serialized answer; undefined for a stream. */
function bytesOf (payload: unknown): Buffer | undefined {
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  if (typeof payload === 'string') return Buffer.from(payload)
  return Buffer.isBuffer(payload) ? payload : undefined
}

function asArray<T> (value: T | T[] | undefined): T[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value]
}
