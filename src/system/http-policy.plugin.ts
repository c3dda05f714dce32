import fp from 'fastify-plugin'
import { errorCodes } from 'fastify'
import cookie from '@fastify/cookie'
import formbody from '@fastify/formbody'
import multipart from '@fastify/multipart'
import type { Redis } from 'ioredis'
import { AppError } from '../errors.ts'
import type { FastifyTypeBox } from '../lib/http.ts'
import { jsonParserWithPosition } from '../lib/json-body.ts'
import { rejectNulBytes } from '../lib/nul-bytes.ts'
import { rejectPrototypeNames } from '../lib/object-keys.ts'
import { secretParamsOf } from '../lib/query-string.ts'
import { logAccess } from './access-log.ts'
import rateLimitPlugin from './rate-limit.plugin.ts'

/** When the 3.6.1 paths were deprecated: the first release that serves /api. */
const DEPRECATED_AT = new Date('2026-11-01T00:00:00Z')

export interface HttpPolicyOptions {
  redis: Redis | undefined
  /** True once the stop has begun (lib/request-drain.ts). */
  stopping: () => boolean
}

/**
 * What every request meets, whatever its route: its id, the rate limits,
 * the bodies the service reads and refuses, the headers every answer
 * carries, and one access line when it is answered.
 */
async function httpPolicy (app: FastifyTypeBox, { redis, stopping }: HttpPolicyOptions): Promise<void> {
  const { config } = app
  // First of all hooks: a request the limiter (or anything else) refuses still names itself.
  app.addHook('onRequest', async (request, reply) => { reply.header('X-Request-Id', request.id) })

  await app.register(cookie)
  await app.register(rateLimitPlugin, { redis })
  await app.register(formbody, { bodyLimit: config.bodyLimitBytes })
  await app.register(multipart, {
    attachFieldsToBody: 'keyValues',
    limits: { files: 0, fields: 50, fieldSize: config.bodyLimitBytes, parts: 50, fieldNameSize: 100 }
  })
  // Fastify's own JSON parsing, with syntax errors that say where (lib/json-body.ts).
  const parseJson = jsonParserWithPosition(app)
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson)
  app.addContentTypeParser('application/merge-patch+json', { parseAs: 'string', bodyLimit: config.bodyLimitBytes }, parseJson)
  // After multipart's own preValidation hook, which is where a multipart body is parsed.
  app.addHook('preValidation', rejectNulBytes)
  app.addHook('preValidation', rejectPrototypeNames)

  app.addHook('onResponse', async (request, reply) => {
    logAccess(request, reply)
    // Node discards the rest of a body only when nothing began to read it. A
    // multipart upload refused part-way (a file part, too many fields) was begun
    // by busboy and then dropped: the connection stopped reading, and the
    // client's next request on it waited for REQUEST_TIMEOUT_MS and got 408.
    // Discarding the rest as Node would keeps the connection in step; the
    // request timeout still bounds how long that reading may take.
    const raw = request.raw
    if (!raw.complete && !raw.destroyed) {
      raw.unpipe()
      raw.removeAllListeners('data')
      raw.resume()
    }
  })
  app.addHook('onRequest', async (request) => {
    const secrets = request.routeOptions.config.secretsInBody === true ? secretParamsOf(request.url) : []
    if (secrets.length === 0) return
    const names = [...new Set(secrets)].map(name => JSON.stringify(name.slice(0, 64))).join(', ')
    throw new AppError('credentials_in_query', 400, `Send ${names} in the body, not in the URL: addresses are kept in logs and browser history. Treat what the URL held as exposed.`)
  })
  app.addHook('preParsing', async (request, reply, payload) => {
    const type = request.headers['content-type']
    if (type === undefined) return payload
    const essence = type.split(';')[0]!.trim().toLowerCase()
    const accepts = request.routeOptions.config.accepts
    if (accepts !== undefined && !accepts.includes(essence)) {
      throw new AppError('unsupported_media_type', 415, `This operation takes ${accepts.join(', ')}; got ${essence}.`)
    }
    // Fastify holds the bodies it reads itself (JSON, forms) to the route's
    // limit; busboy reads multipart bodies and knows only its per-part limits,
    // so a larger one was read to its end. One declared over the limit is
    // refused before it is read, and, as Fastify does, the connection is closed
    // rather than read on to the end of that body.
    if (essence === 'multipart/form-data' && Number(request.headers['content-length']) > request.routeOptions.bodyLimit) {
      reply.header('Connection', 'close')
      throw new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE()
    }
    return payload
  })
  const successorOffset = config.basePath.length
  const hsts = config.hsts
  app.addHook('onSend', async (request, reply, payload) => {
    // A request answered during a shutdown ends its connection: a client keeping
    // it open would otherwise hold the shutdown until the cap (server.ts).
    if (stopping()) reply.header('Connection', 'close')
    reply.header('Cache-Control', 'no-store')
    reply.header('X-Content-Type-Options', 'nosniff')
    // Only over HTTPS (directly, or through TRUST_PROXY's X-Forwarded-Proto): RFC 6797 bars it from plain HTTP answers.
    if (hsts !== undefined && request.protocol === 'https') reply.header('Strict-Transport-Security', hsts)
    // Pages with forms set their own (see sessions/login-page.ts); everything else sends no Referer at all.
    if (!reply.hasHeader('Referrer-Policy')) reply.header('Referrer-Policy', 'no-referrer')
    if (request.routeOptions.config.legacy === true) {
      const path = request.url.split('?')[0]!
      reply.header('Deprecation', `@${Math.floor(DEPRECATED_AT.getTime() / 1000)}`)
      reply.header('Sunset', config.legacySunset.toUTCString())
      reply.header('Link', appendLink(reply.getHeader('Link'), `<${config.basePath}/api${path.slice(successorOffset)}>; rel="successor-version"`))
    }
    return payload
  })
}

function appendLink (existing: unknown, link: string): string {
  return typeof existing === 'string' && existing !== '' ? `${existing}, ${link}` : link
}

export default fp(httpPolicy, { name: 'gatehouse-http-policy' })
