import { Type } from 'typebox'
import type { Redis } from 'ioredis'
import type { FastifyTypeBox } from '../lib/http.ts'
import { pingDb, dialectOf } from '../db/database.ts'
import { problems } from '../lib/openapi.ts'
import { RELEASE } from './release.ts'

export { RELEASE }

const SEMVER = '^[0-9]+\\.[0-9]+\\.[0-9]+(-[0-9A-Za-z.-]+)?$'

const Version = Type.Object({
  name: Type.Literal('gatehouse'),
  version: Type.String({ maxLength: 64, pattern: SEMVER, description: 'This release.', examples: [RELEASE] }),
  api_prefix: Type.String({ maxLength: 16, pattern: '^/[a-z]+$', description: 'Where the current paths live.', examples: ['/api'] }),
  legacy_release: Type.String({ maxLength: 64, pattern: SEMVER, description: 'The release whose paths are still served as deprecated aliases.' }),
  database: Type.Union([Type.Literal('sqlite'), Type.Literal('postgres')])
})

const Health = Type.Object({
  // Typed as a string for the handlers; documented as the three values it takes.
  status: Type.Unsafe<string>({ type: 'string', enum: ['ok', 'ready', 'unavailable'] }),
  checks: Type.Optional(Type.Record(Type.String(), Type.String({ maxLength: 400, pattern: '^[^\\r\\n]*$', description: '`ok` or `unavailable`; for `mail`, `ok`, `unchecked` (not tried yet) or the reason its last attempt failed.' }), {
    description: 'Each dependency (`database`, `redis`) and its state; with SMTP configured also `mail`, which is reported but does not decide readiness.'
  }))
})

const READY_TIMEOUT_MS = 2000

/** 'ok' if the probe succeeds within the readiness bound; a stalled dependency must not stall /readyz. */
async function probe (check: Promise<unknown>): Promise<'ok' | 'unavailable'> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<'unavailable'>(resolve => { timer = setTimeout(resolve, READY_TIMEOUT_MS, 'unavailable') })
  try {
    return await Promise.race([check.then(() => 'ok' as const, () => 'unavailable' as const), late])
  } finally {
    clearTimeout(timer)
  }
}

export default async function systemRoutes (app: FastifyTypeBox, options: { redis: Redis | undefined }): Promise<void> {
  app.get('/api/version', {
    schema: {
      tags: ['system'],
      operationId: 'get_version',
      summary: 'Version',
      description: 'The running release, where its current paths live, and which database it runs on.',
      response: { 200: Version, ...problems() }
    }
  }, async () => ({ name: 'gatehouse' as const, version: RELEASE, api_prefix: '/api', legacy_release: '3.6.1', database: dialectOf(app.db) }))

  app.get('/healthz', {
    schema: { tags: ['system'], operationId: 'healthz', summary: 'Liveness', description: 'The process is up. Does not touch the database.', response: { 200: Health, ...problems() } },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async () => ({ status: 'ok' }))

  app.get('/readyz', {
    schema: {
      tags: ['system'],
      operationId: 'readyz',
      summary: 'Readiness',
      description: 'Ready to serve: the database, and Redis when configured, each answer within 2 s (`checks` names them). ' +
        '503 otherwise, so a load balancer stops sending traffic here. With SMTP configured, `checks.mail` is `ok` or the reason this ' +
        'instance\'s last attempt to reach the SMTP server failed (docs/email.md#when-mail-fails); it does not decide readiness.',
      response: { 200: Health, 503: Health, ...problems() }
    },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async (_request, reply) => {
    const [database, redis] = await Promise.all([probe(pingDb(app.db)), options.redis === undefined ? undefined : probe(options.redis.ping())])
    const checks: Record<string, string> = redis === undefined ? { database } : { database, redis }
    // Mail that cannot go waits in the outbox, and every flow still works: told here, but no reason to take this instance out.
    const mail = app.mail === undefined ? undefined : app.mail.health ?? 'unchecked'
    if (Object.values(checks).some(state => state !== 'ok')) {
      return await reply.code(503).header('Retry-After', '5').send({ status: 'unavailable', checks: mail === undefined ? checks : { ...checks, mail } })
    }
    return { status: 'ready', checks: mail === undefined ? checks : { ...checks, mail } }
  })
}
