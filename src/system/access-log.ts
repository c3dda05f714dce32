import type { FastifyReply, FastifyRequest } from 'fastify'
import type { DestinationStream, LoggerOptions } from 'pino'
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

/** The one line a finished request writes, at info (so LOG_LEVEL and a route's own logLevel decide whether it is written). */
export function logAccess (request: FastifyRequest, reply: FastifyReply): void {
  request.log.info({ req: request, res: reply, responseTime: reply.elapsedTime }, ACCESS_MESSAGE)
}
