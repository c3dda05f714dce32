import type { FastifyReply, FastifyRequest } from 'fastify'
import pino, { type DestinationStream, type LoggerOptions } from 'pino'
import { isSecretParam } from '../lib/query-string.ts'

/**
 * Request log lines carry the path, never a secret given in the query string
 * (a password, `API_KEY`, a one-time code or link token; isSecretParam), on
 * any route: the name is matched decoded and ignoring case, as the parser
 * that takes it reads it (`API%5FKEY=` and `%41PI_KEY=` are the same
 * parameter, and so are `Password=` and `password=`).
 */
export function redactUrl (url: string): string {
  const start = url.indexOf('?')
  if (start === -1) return url
  return url.slice(0, start + 1) + url.slice(start + 1).split('&')
    .map(pair => isSecretParam(pair) ? `${pair.split('=', 1)[0]!}=[redacted]` : pair)
    .join('&')
}

/** How a request and its reply appear in a log line (the access line, and any line that names them). */
const serializers = {
  req: (req: FastifyRequest) => ({ method: req.method, url: redactUrl(req.url), remoteAddress: req.ip }),
  res: (res: FastifyReply) => ({ statusCode: res.statusCode })
}

/** The production logger's options: pino, one JSON line per entry. */
export function loggerOptions (level: string, stream: DestinationStream): LoggerOptions & { stream: DestinationStream } {
  return {
    level,
    stream,
    redact: { paths: ['req.headers.authorization', 'req.headers["x-api-key"]', 'req.headers.cookie'], censor: '[redacted]' },
    serializers
  }
}

export const ACCESS_MESSAGE = 'request completed'

const { chindingsSym } = pino.symbols
const INFO = 30

/**
 * The access line of a finished request, byte for byte as `request.log.info({
 * req, res, responseTime }, ACCESS_MESSAGE)` writes it with loggerOptions (its
 * test compares the two), or undefined when the request's logger does not
 * write info lines (LOG_LEVEL, or a route's own logLevel).
 *
 * Rendered here rather than by pino because every request pays for it: pino
 * walks the object, runs the serializers and the redaction and stringifies
 * each value. With this line the uncached users page cost 0.954 of its CPU
 * per response with pino's (median of eight interleaved rounds, 100,000
 * users; bench/README.md, "Issue 20: the access line and the memory map").
 * Everything else is logged by pino. The request's own bindings (pid,
 * hostname, reqId) are pino's, already rendered by its child logger.
 */
export function accessLine (request: FastifyRequest, reply: FastifyReply): string | undefined {
  // Fastify's type of a logger leaves out what pino's loggers have.
  const log = request.log as unknown as pino.Logger & Record<symbol, string>
  if (!log.isLevelEnabled('info')) return undefined
  const chindings = log[chindingsSym]
  const req = serializers.req(request)
  return `{"level":${INFO},"time":${Date.now()}${chindings},"req":{"method":${JSON.stringify(req.method)},"url":${JSON.stringify(req.url)}${remoteAddress(req.remoteAddress)}},"res":{"statusCode":${reply.statusCode}},"responseTime":${finite(reply.elapsedTime)},"msg":"${ACCESS_MESSAGE}"}\n`
}

/** pino leaves out a field whose value is undefined (a request whose socket is gone has no address). */
function remoteAddress (address: string | undefined): string {
  return address === undefined ? '' : `,"remoteAddress":${JSON.stringify(address)}`
}

/** pino writes a number that is not finite as null. */
function finite (value: number): string {
  return Number.isFinite(value) ? String(value) : 'null'
}
