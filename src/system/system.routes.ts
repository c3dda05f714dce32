import { readFileSync } from 'node:fs'
import { Type } from 'typebox'
import type { FastifyTypeBox } from '../app.ts'
import { pingDb, dialectOf } from '../db/database.ts'
import { problems } from '../lib/openapi.ts'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

/** The release this build is: `GET /api/version` and the OpenAPI `info.version`. */
export const RELEASE = pkg.version

const Version = Type.Object({
  name: Type.Literal('gatehouse'),
  version: Type.String({ description: 'This release.', examples: [RELEASE] }),
  api_prefix: Type.String({ description: 'Where the current paths live.', examples: ['/api'] }),
  legacy_release: Type.String({ description: 'The release whose paths are still served as deprecated aliases.' }),
  database: Type.Union([Type.Literal('sqlite'), Type.Literal('postgres')])
})

const Health = Type.Object({
  status: Type.String(),
  checks: Type.Optional(Type.Record(Type.String(), Type.String()))
})

const READY_TIMEOUT_MS = 2000

export default async function systemRoutes (app: FastifyTypeBox): Promise<void> {
  app.get('/api/version', {
    schema: { tags: ['system'], operationId: 'get_version', summary: 'Version', response: { 200: Version } }
  }, async () => ({ name: 'gatehouse' as const, version: RELEASE, api_prefix: '/api', legacy_release: '3.6.1', database: dialectOf(app.db) }))

  app.get('/healthz', {
    schema: { tags: ['system'], operationId: 'healthz', summary: 'Liveness', description: 'The process is up. Does not touch the database.', response: { 200: Health } },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async () => ({ status: 'ok' }))

  app.get('/readyz', {
    schema: {
      tags: ['system'],
      operationId: 'readyz',
      summary: 'Readiness',
      description: 'Ready to serve: the database answers within 2 s. 503 otherwise, so a load balancer stops sending traffic here.',
      response: { 200: Health, 503: Health, ...problems() }
    },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async (_request, reply) => {
    const ok = await Promise.race([
      pingDb(app.db).then(() => true, () => false),
      new Promise<boolean>(resolve => setTimeout(resolve, READY_TIMEOUT_MS, false).unref())
    ])
    if (!ok) return await reply.code(503).header('Retry-After', '5').send({ status: 'unavailable', checks: { database: 'unavailable' } })
    return { status: 'ready', checks: { database: 'ok' } }
  })
}
