import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it, type TestContext } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import { auth, createTestApp, dialects, uniqueName, type TestApp } from './helpers.ts'
import { eventually } from './polling.ts'

const postgres = dialects().find(d => d.name === 'postgres')
const PAGE = 10
const USERS = 120

/** The start of the page statement (users.repository.ts pageQuery) as Kysely writes it: what a backend that read a page last ran. */
const PAGE_STATEMENT = 'select "users"."id", "users"."username", %'
/** Connections of the app's pool in this file. */
const POOL_SIZE = 2

/** Every page of the list, walked one after another through the Link header: the reference the concurrent reads must match. */
async function walk (t: TestApp): Promise<Array<{ url: string, body: string }>> {
  const pages: Array<{ url: string, body: string }> = []
  let url: string | undefined = `/auth/api/users?limit=${PAGE}`
  while (url !== undefined) {
    const res: LightMyRequestResponse = await t.app.inject({ url, headers: auth(t.adminKey) })
    assert.equal(res.statusCode, 200, res.body)
    pages.push({ url, body: res.body })
    url = /<([^>]+)>; rel="next"/.exec(String(res.headers.link ?? ''))?.[1]
  }
  return pages
}

/**
 * A write that changes no user but moves the users page stamp (migration 0019
 * counts groups too), so that the pages read next are read from the database
 * and not answered by the page cache.
 */
async function missPageCache (t: TestApp): Promise<void> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/groups', headers: auth(t.adminKey), payload: { display_name: uniqueName('stamp') } })
  assert.equal(res.statusCode, 201, res.body)
}

async function withClient<T> (work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: postgres!.url })
  await client.connect()
  try {
    return await work(client)
  } finally {
    await client.end()
  }
}

/** The backends of this app's connections (found by their application_name) that have run the page statement. */
async function pageBackends (applicationName: string): Promise<number[]> {
  return await withClient(async client => (await client.query<{ pid: number }>(
    'select pid from pg_stat_activity where application_name = $1 and query like $2', [applicationName, PAGE_STATEMENT])).rows.map(row => row.pid))
}

describe('reads on the PostgreSQL pool', { skip: postgres === undefined ? 'TEST_DATABASE_URL is not set' : false }, () => {
  const applicationName = `gh_pooled_${randomBytes(4).toString('hex')}`
  let t: TestApp
  let reference: Array<{ url: string, body: string }>

  before(async () => {
    const url = new URL(postgres!.url!)
    url.searchParams.set('application_name', applicationName)
    // A short statement timeout for the lock below; the client's deadline a little beyond it, as by default.
    t = await createTestApp(postgres!, { databaseUrl: url.toString(), databasePoolSize: POOL_SIZE, databaseStatementTimeoutMs: 400, databaseQueryTimeoutMs: 1400 })
    const users = Array.from({ length: USERS }, () => ({ username: uniqueName('pooled'), email: `${uniqueName('mail')}@example.com` }))
    const imported = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users } })
    assert.equal(imported.statusCode, 200, imported.body)
    reference = await walk(t)
    assert.equal(reference.length, USERS / PAGE)
  })
  after(async () => { await t?.app.close() })

  it('answers every page of many concurrent requests with its own users, from no more backends than the pool holds', async () => {
    await missPageCache(t)
    // Twice each page at once, so that requests wait for the pool's few connections.
    const requests = [...reference, ...reference]
    const answers = await Promise.all(requests.map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
    answers.forEach((res, i) => {
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.body, requests[i]!.body, `${requests[i]!.url} answered another page`)
    })
    const backends = await pageBackends(applicationName)
    assert.ok(backends.length >= 1 && backends.length <= POOL_SIZE, `the page statement ran on ${backends.length} backends`)
  })

  it('replaces a pooled connection whose backend is ended, and serves on without an error escaping', async (ctx: TestContext) => {
    const escaped: unknown[] = []
    const onEscape = (error: unknown): void => { escaped.push(error) }
    process.on('uncaughtException', onEscape)
    process.on('unhandledRejection', onEscape)
    try {
      await missPageCache(t)
      await Promise.all(reference.slice(0, 6).map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
      const ended = await pageBackends(applicationName)
      assert.ok(ended.length > 0)
      await withClient(async client => { await client.query('select pg_terminate_backend(pid) from unnest($1::int[]) as pid', [ended]) })
      // Requests sent before the connection's end is noticed may fail (503); the pool must then open new connections.
      await missPageCache(t)
      const during = await Promise.all(reference.slice(0, 6).map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
      for (const res of during) assert.ok(res.statusCode === 200 || res.json().code === 'database_unavailable', res.body)
      ctx.diagnostic(`right after the backends ended: ${during.map(res => res.statusCode).join(', ')}`)
      await eventually(5000, async () => {
        const answers = await Promise.all(reference.map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
        answers.forEach((res, i) => { assert.equal(res.body, reference[i]!.body) })
      })
      const now = await pageBackends(applicationName)
      assert.ok(now.every(pid => !ended.includes(pid)), 'the ended backends are not in use')
    } finally {
      process.off('uncaughtException', onEscape)
      process.off('unhandledRejection', onEscape)
    }
    assert.deepEqual(escaped.map(String), [])
  })

  it('answers the reads queued behind a statement held up by a lock 503 within the query timeout, then serves again', async (ctx: TestContext) => {
    await missPageCache(t)
    await withClient(async locker => {
      await locker.query('begin')
      // What a migration takes: every read of the table waits for it.
      await locker.query(`lock table ${t.config.databaseSchema!}.users in access exclusive mode`)
      try {
        const started = performance.now()
        const answers = await Promise.all(reference.slice(0, 8).map(async ({ url }) => {
          const res = await t.app.inject({ url, headers: auth(t.adminKey) })
          return { res, ms: performance.now() - started }
        }))
        ctx.diagnostic(`answered after ${answers.map(a => Math.round(a.ms)).join(', ')} ms`)
        for (const { res, ms } of answers) {
          assert.equal(res.statusCode, 503, res.body)
          assert.equal(res.json().code, 'database_unavailable')
          // Each waits at most its own deadline, however many requests are ahead of it for a connection.
          assert.ok(ms <= t.config.databaseQueryTimeoutMs + 700, `answered after ${Math.round(ms)} ms`)
        }
      } finally {
        await locker.query('rollback')
      }
    })
    await eventually(5000, async () => {
      const answers = await Promise.all(reference.map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
      answers.forEach((res, i) => { assert.equal(res.body, reference[i]!.body) })
    })
  })
})
