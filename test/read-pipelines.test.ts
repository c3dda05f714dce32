import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it, type TestContext } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import { loadConfig } from '../src/config.ts'
import { auth, createTestApp, dialects, uniqueName, type TestApp } from './helpers.ts'
import { eventually } from './polling.ts'

const postgres = dialects().find(d => d.name === 'postgres')
const PAGE = 10
const USERS = 120

/** The page statement as db/prepared.ts names it on PostgreSQL: what each read pipeline's backend last ran. */
const PAGE_STATEMENT = '/* prepared */ select \'[\' || string_agg(%'

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

describe('DATABASE_READ_PIPELINES', () => {
  it('defaults to 4, takes 0 (every read on a pooled connection) to 64, and refuses anything else', () => {
    assert.equal(loadConfig({}).databaseReadPipelines, 4)
    assert.equal(loadConfig({ DATABASE_READ_PIPELINES: '0' }).databaseReadPipelines, 0)
    assert.equal(loadConfig({ DATABASE_READ_PIPELINES: '64' }).databaseReadPipelines, 64)
    assert.throws(() => loadConfig({ DATABASE_READ_PIPELINES: '65' }), /DATABASE_READ_PIPELINES must be 0 \(none\) to 64/)
    assert.throws(() => loadConfig({ DATABASE_READ_PIPELINES: '-1' }), /DATABASE_READ_PIPELINES/)
    assert.throws(() => loadConfig({ DATABASE_POOL_SIZE: '0' }), /DATABASE_POOL_SIZE must be at least 1/)
  })
})

describe('short reads pipelined on a few PostgreSQL connections', { skip: postgres === undefined ? 'TEST_DATABASE_URL is not set' : false }, () => {
  const applicationName = `gh_pipelines_${randomBytes(4).toString('hex')}`
  let t: TestApp
  let reference: Array<{ url: string, body: string }>

  before(async () => {
    const url = new URL(postgres!.url!)
    url.searchParams.set('application_name', applicationName)
    // A short statement timeout for the lock below; the client's deadline a little beyond it, as by default.
    t = await createTestApp(postgres!, { databaseUrl: url.toString(), databaseReadPipelines: 2, databaseStatementTimeoutMs: 400, databaseQueryTimeoutMs: 1400 })
    const users = Array.from({ length: USERS }, () => ({ username: uniqueName('piped'), email: `${uniqueName('mail')}@example.com` }))
    const imported = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users } })
    assert.equal(imported.statusCode, 200, imported.body)
    reference = await walk(t)
    assert.equal(reference.length, USERS / PAGE)
  })
  after(async () => { await t?.app.close() })

  it('answers every page of many concurrent requests with its own users, from no more backends than pipelines', async () => {
    await missPageCache(t)
    // Twice each page at once, so that statements queue on both pipelines behind one another.
    const requests = [...reference, ...reference]
    const answers = await Promise.all(requests.map(async ({ url }) => await t.app.inject({ url, headers: auth(t.adminKey) })))
    answers.forEach((res, i) => {
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.body, requests[i]!.body, `${requests[i]!.url} answered another page`)
    })
    const backends = await pageBackends(applicationName)
    assert.ok(backends.length >= 1 && backends.length <= 2, `the page statement ran on ${backends.length} backends`)
  })

  it('replaces a pipelined connection whose backend is ended, and serves on without an error escaping', async (ctx: TestContext) => {
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
      // Requests sent before the connection's end is noticed may fail (503); the pipelines must then be opened again.
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
          // Each waits at most its own client-side deadline, however many statements are ahead of it on its connection.
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
