/**
 * The baseline of `npm run bench` (bench/list-users.ts): Fastify with default options and no
 * logger, one route returning a fixed array of 50 users, serialized with the
 * very same response schema as gatehouse's list (`Type.Array(User)`).
 * Started as a child process: `PORT=… node --import tsx bench/bare-server.ts`.
 *
 * With BARE_PAGE_DB=<database URL> (`sqlite:<file>` or `postgres://…`, with
 * BARE_PAGE_SCHEMA for a PostgreSQL schema) it is the floor of the
 * uncached page: no hooks, no credential, no log line, no page cache; the
 * route decodes the request's `cursor` and answers the page that gatehouse's
 * own repository read returns for it (`listUsers`, the very statement the
 * service runs on a miss), serialized by the same response schema. What gatehouse costs
 * above this is its request pipeline; what this costs above the fixed page is
 * the read (and, at its lower rate, the kernel's wake-ups: bench/README.md).
 */
import Fastify from 'fastify'
import { Type } from 'typebox'
import { User } from '../src/users/users.schemas.ts'
import { listUsers, toUser } from '../src/users/users.repository.ts'
import { createDb } from '../src/db/database.ts'
import { defaultConfig } from '../src/config.ts'
import { decodeCursor } from '../src/lib/paging.ts'
import { seedRow, USERS_PATH } from './fixtures.ts'

const ITEMS = 50

const port = Number(process.env.PORT ?? '0')
const users = Array.from({ length: ITEMS }, (_, i) => toUser(seedRow(i)))

const app = Fastify()
const pageDb = process.env.BARE_PAGE_DB
if (pageDb !== undefined) {
  // gatehouse's defaults otherwise: the same pool a PostgreSQL page waits on, the same SQLite settings.
  const db = createDb(defaultConfig({ databaseUrl: pageDb, databaseSchema: process.env.BARE_PAGE_SCHEMA }))
  app.get<{ Querystring: { cursor?: string, limit?: string } }>(USERS_PATH, { schema: { response: { 200: Type.Array(User) } } }, async (request) => {
    const { cursor, limit } = request.query
    const after = cursor === undefined ? undefined : decodeCursor(cursor, 'created_at', ['timestamp', 'uuid']) as [string, string]
    return (await listUsers(db, {}, 'created_at', Number(limit ?? ITEMS), after)).users
  })
} else {
  app.get(USERS_PATH, { schema: { response: { 200: Type.Array(User) } } }, async () => users)
}

// A clean exit on SIGTERM, so `--cpu-prof` gets to write its profile.
process.once('SIGTERM', () => {
  app.close().then(() => process.exit(0), () => process.exit(1))
})

const address = await app.listen({ host: '127.0.0.1', port })
process.stdout.write(`bare server listening at ${address}\n`)
