import { randomUUID } from 'node:crypto'
import type { Server } from 'node:http'
import { LogController, type FastifyBaseLogger, type FastifyHttpOptions, type FastifyServerOptions } from 'fastify'
import type { Config } from '../config.ts'
import { answerClientError, answerFrameworkError } from '../errors.ts'
import { trustFunction, withForwarding } from '../lib/forwarded.ts'
import { schemaController } from '../lib/schema-compilers.ts'
import { canonicalScimUrl } from '../scim/scim.routes.ts'
import { logAccess, loggerOptions } from './access-log.ts'
import type { LogDestination } from './log-destination.ts'

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/

/**
 * The Fastify server's options: limits and timeouts from the settings, the
 * schema compilers, how a request is named, and how what is refused before a
 * request exists is answered.
 */
export function serverOptions (config: Config, logger: FastifyServerOptions['logger'] | undefined, destination: LogDestination | { write: (line: string) => void }): FastifyHttpOptions<Server, FastifyBaseLogger> {
  const forwarding = config.trustProxy !== false ? trustFunction(config.trustProxy) : undefined
  return {
    logger: logger ?? loggerOptions(config.logLevel, destination),
    schemaController,
    bodyLimit: config.bodyLimitBytes,
    requestTimeout: config.requestTimeoutMs,
    // Node's own deadline for the headers (60 s), checked every 30 s, would
    // otherwise hold a slow client for up to 90 s whatever REQUEST_TIMEOUT_MS says.
    http: { requestTimeout: config.requestTimeoutMs, headersTimeout: config.requestTimeoutMs, connectionsCheckingInterval: 1000 },
    // What is refused before routing (an undecodable URL) or before a request
    // exists (oversized headers, a timeout) is answered as a problem too.
    // No hook runs for these, so their access line is written here.
    frameworkErrors: (error, request, reply) => {
      const seen = forwarding !== undefined ? withForwarding(request, forwarding) : request
      answerFrameworkError(error, seen, reply, config.hsts)
      logAccess(seen, reply)
    },
    clientErrorHandler: answerClientError,
    trustProxy: config.trustProxy,
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    requestIdHeader: false,
    genReqId: (req) => {
      const given = req.headers['x-request-id']
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID()
    },
    return503OnClosing: true,
    // SCIM endpoint names in any case (scim/scim.routes.ts); every other URL as it came.
    rewriteUrl: (req) => canonicalScimUrl(req.url ?? '/', config.basePath),
    // One line per request (written in onResponse, system/http-policy.plugin.ts) instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true }),
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 200 }
  }
}
