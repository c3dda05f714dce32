import assert from 'node:assert/strict'
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net'
import { after, before, describe, it, type TestContext } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { eventually } from './polling.ts'
import { NO_REDIS, TEST_REDIS_URL, testRedisAddress, testRedisUrlVia } from './redis.ts'

/**
 * A TCP proxy on 127.0.0.1 in front of a real server that can go dark the way a
 * partitioned network does: it stops moving bytes in both directions without
 * closing anything, and keeps accepting connections it never forwards. Bytes
 * sent meanwhile wait in the socket buffers and flow once it resumes, as TCP
 * retransmission would deliver them after the partition heals.
 */
class BlackholeProxy {
  private readonly pairs = new Set<{ client: Socket, upstream: Socket | undefined }>()
  private dark = false
  /** Connections accepted while dark: the client tried to open new ones during the stall. */
  acceptedWhileDark = 0
  private constructor (private readonly server: Server, private readonly target: { host: string, port: number }) {}

  static async start (target: { host: string, port: number }): Promise<BlackholeProxy> {
    const server = createServer()
    const proxy = new BlackholeProxy(server, target)
    server.on('connection', client => { proxy.accept(client) })
    await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
    return proxy
  }

  get port (): number {
    return (this.server.address() as AddressInfo).port
  }

  private accept (client: Socket): void {
    const pair = { client, upstream: undefined as Socket | undefined }
    this.pairs.add(pair)
    client.on('error', () => {})
    client.on('close', () => {
      pair.upstream?.destroy()
      this.pairs.delete(pair)
    })
    // Explicitly paused, so the data listener added on linking does not start the flow.
    client.pause()
    if (this.dark) this.acceptedWhileDark++
    else this.link(pair)
  }

  private link (pair: { client: Socket, upstream: Socket | undefined }): void {
    const { client } = pair
    const upstream = connect(this.target)
    pair.upstream = upstream
    upstream.on('error', () => {})
    upstream.on('close', () => { client.destroy() })
    client.on('data', chunk => upstream.write(chunk))
    upstream.on('data', chunk => client.write(chunk))
    client.on('end', () => upstream.end())
    upstream.on('end', () => client.end())
    client.resume()
  }

  blackhole (): void {
    this.dark = true
    for (const { client, upstream } of this.pairs) {
      client.pause()
      upstream?.pause()
    }
  }

  resume (): void {
    this.dark = false
    for (const pair of this.pairs) {
      if (pair.upstream === undefined) {
        this.link(pair)
      } else {
        pair.client.resume()
        pair.upstream.resume()
      }
    }
  }

  /**
   * The network comes back for new connections only: those open during the
   * stall stay dark for good, as after a failover or a lost NAT entry.
   */
  resumeNewOnly (): void {
    this.dark = false
  }

  /** Connections open through the proxy now, linked or held. */
  get open (): number {
    return this.pairs.size
  }

  /** The far end goes away abruptly: every connection is reset. */
  cut (): void {
    for (const { client, upstream } of this.pairs) {
      client.resetAndDestroy()
      upstream?.destroy()
    }
  }

  async close (): Promise<void> {
    for (const { client, upstream } of this.pairs) {
      client.destroy()
      upstream?.destroy()
    }
    await new Promise<void>(resolve => this.server.close(() => resolve()))
  }
}

/** Runs a request and measures it; a request still unanswered after `limitMs` fails the test instead of hanging it. */
async function timed<T = LightMyRequestResponse> (limitMs: number, request: () => Promise<T>): Promise<{ res: T, ms: number }> {
  const started = performance.now()
  let timer: NodeJS.Timeout | undefined
  const res = await Promise.race([
    request(),
    new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${limitMs} ms`)), limitMs)
    })
  ]).finally(() => clearTimeout(timer))
  return { res, ms: Math.round(performance.now() - started) }
}

function assertUnavailable (res: LightMyRequestResponse, code: 'database_unavailable' | 'dependency_unavailable'): void {
  assert.equal(res.statusCode, 503, res.body)
  assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
  assert.equal(res.json().code, code)
  assert.match(String(res.headers['retry-after']), /^\d+$/)
}

/**
 * Waits until the app reports Redis and the database ready, so that what a
 * test measures is the stall it makes, not a first connection still being
 * set up on a loaded machine.
 */
async function untilReady (t: TestApp): Promise<void> {
  await eventually(10_000, async () => {
    const ready = await t.app.inject({ url: '/auth/readyz' })
    assert.equal(ready.statusCode, 200, ready.body)
  })
}

/** How much later than its deadline an answer may come on a loaded two-core machine. */
const SLACK_MS = 700

const REDIS_TIMEOUT_MS = 500

for (const dialect of dialects()) {
  describe(`a Redis that stops answering (${dialect.name})`, () => {
    let proxy: BlackholeProxy | undefined
    let t: TestApp
    let user: { username: string }

    before(async () => {
      if (TEST_REDIS_URL === undefined) return
      proxy = await BlackholeProxy.start(testRedisAddress())
      // The per-address budget is off so that sign-in reaches Redis through its failure counter, not the request limit.
      t = await createTestApp(dialect, { redisUrl: testRedisUrlVia('127.0.0.1', proxy.port), redisCommandTimeoutMs: REDIS_TIMEOUT_MS, rateLimitPerAddress: 0 })
      await untilReady(t)
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD } })
      assert.equal(created.statusCode, 201, created.body)
      user = created.json()
    })
    after(async () => {
      proxy?.resume()
      await t?.app.close()
      await proxy?.close()
    })

    const signIn = async (): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })
    const listUsers = async (): Promise<LightMyRequestResponse> =>
      await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) })

    it('answers rate-limited requests and sign-in 503 dependency_unavailable with Retry-After within the command timeout', async (ctx: TestContext) => {
      if (proxy === undefined) return ctx.skip(NO_REDIS)
      assert.equal((await listUsers()).statusCode, 200)
      assert.equal((await signIn()).statusCode, 200)
      proxy.blackhole()
      const limit = REDIS_TIMEOUT_MS + SLACK_MS
      const list = await timed(limit + 5000, listUsers)
      assertUnavailable(list.res, 'dependency_unavailable')
      const login = await timed(limit + 5000, signIn)
      assertUnavailable(login.res, 'dependency_unavailable')
      ctx.diagnostic(`503 after ${list.ms} ms (list), ${login.ms} ms (sign-in); deadline ${REDIS_TIMEOUT_MS} ms`)
      assert.ok(list.ms <= limit, `list answered after ${list.ms} ms`)
      assert.ok(login.ms <= limit, `sign-in answered after ${login.ms} ms`)
      // Requests that need only the database are not held up.
      assert.equal((await timed(limit, async () => await t.app.inject({ url: '/auth/api/version' }))).res.statusCode, 200)
    })

    it('reports Redis unavailable from /readyz within its bound while the database stays ok', async (ctx: TestContext) => {
      if (proxy === undefined) return ctx.skip(NO_REDIS)
      const { res, ms } = await timed(2000 + SLACK_MS, async () => await t.app.inject({ url: '/auth/readyz' }))
      ctx.diagnostic(`readyz 503 after ${ms} ms`)
      assert.equal(res.statusCode, 503, res.body)
      assert.deepEqual(res.json().checks, { database: 'ok', redis: 'unavailable' })
      assert.ok(res.headers['retry-after'])
    })

    it('serves again, and /readyz is ready, once Redis answers again', async (ctx: TestContext) => {
      if (proxy === undefined) return ctx.skip(NO_REDIS)
      proxy.resume()
      await eventually(5000, async () => {
        assert.equal((await listUsers()).statusCode, 200)
        assert.equal((await signIn()).statusCode, 200)
        const ready = await t.app.inject({ url: '/auth/readyz' })
        assert.equal(ready.statusCode, 200, ready.body)
        assert.deepEqual(ready.json().checks, { database: 'ok', redis: 'ok' })
      })
    })

    it('drops a connection that stays silent and serves again over a new one', async (ctx: TestContext) => {
      if (proxy === undefined) return ctx.skip(NO_REDIS)
      assert.equal((await listUsers()).statusCode, 200)
      proxy.blackhole()
      assertUnavailable((await timed(REDIS_TIMEOUT_MS + SLACK_MS + 5000, listUsers)).res, 'dependency_unavailable')
      proxy.resumeNewOnly()
      const started = performance.now()
      await eventually(5000, async () => { assert.equal((await listUsers()).statusCode, 200) })
      ctx.diagnostic(`serving again after ${Math.round(performance.now() - started)} ms`)
      proxy.resume()
    })
  })
}

describe('a Redis that stops answering, under the per-address request limit', () => {
  it('answers unauthenticated requests 503 dependency_unavailable within the command timeout, and shuts down while Redis is silent', async (ctx: TestContext) => {
    if (TEST_REDIS_URL === undefined) return ctx.skip(NO_REDIS)
    const proxy = await BlackholeProxy.start(testRedisAddress())
    const t = await createTestApp(dialects()[0]!, { redisUrl: testRedisUrlVia('127.0.0.1', proxy.port), redisCommandTimeoutMs: REDIS_TIMEOUT_MS })
    let closed = false
    try {
      const version = async (): Promise<LightMyRequestResponse> => await t.app.inject({ url: '/auth/api/version', remoteAddress: '192.0.2.77' })
      await untilReady(t)
      assert.equal((await version()).statusCode, 200)
      proxy.blackhole()
      const { res, ms } = await timed(REDIS_TIMEOUT_MS + SLACK_MS + 5000, version)
      ctx.diagnostic(`503 after ${ms} ms`)
      assertUnavailable(res, 'dependency_unavailable')
      assert.ok(ms <= REDIS_TIMEOUT_MS + SLACK_MS, `answered after ${ms} ms`)
      proxy.resume()
      await eventually(5000, async () => { assert.equal((await version()).statusCode, 200) })
      proxy.blackhole()
      const shutdown = await timed(REDIS_TIMEOUT_MS + SLACK_MS + 5000, async () => { await t.app.close() })
      closed = true
      ctx.diagnostic(`closed after ${shutdown.ms} ms`)
      assert.ok(shutdown.ms <= REDIS_TIMEOUT_MS + SLACK_MS, `closed after ${shutdown.ms} ms`)
    } finally {
      proxy.resume()
      if (!closed) await t.app.close()
      await proxy.close()
    }
  })
})

const pgDialect = dialects().find(d => d.name === 'postgres')

describe('a PostgreSQL that stops answering', { skip: pgDialect === undefined ? 'TEST_DATABASE_URL is not set' : false }, () => {
  const QUERY_TIMEOUT_MS = 800
  const ACQUIRE_TIMEOUT_MS = 600
  let proxy: BlackholeProxy
  let t: TestApp
  let userId: string

  before(async () => {
    const real = new URL(pgDialect!.url!)
    proxy = await BlackholeProxy.start({ host: real.hostname, port: Number(real.port || 5432) })
    const proxied = new URL(real)
    proxied.hostname = '127.0.0.1'
    proxied.port = String(proxy.port)
    // The schema is created and dropped through the real server (helpers.ts); the app talks through the proxy.
    t = await createTestApp(pgDialect!, {
      databaseUrl: proxied.toString(),
      databaseStatementTimeoutMs: 500,
      databaseQueryTimeoutMs: QUERY_TIMEOUT_MS,
      databaseAcquireTimeoutMs: ACQUIRE_TIMEOUT_MS
    })
    const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD } })
    assert.equal(created.statusCode, 201, created.body)
    userId = created.json().id
  })
  after(async () => {
    proxy.resume()
    await t?.app.close()
    await proxy.close()
  })

  const getUser = async (): Promise<LightMyRequestResponse> => await t.app.inject({ url: `/auth/api/users/${userId}`, headers: auth(t.adminKey) })
  const listUsers = async (): Promise<LightMyRequestResponse> => await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })
  // A request may first wait for a connection, then for its query.
  const limit = ACQUIRE_TIMEOUT_MS + QUERY_TIMEOUT_MS + SLACK_MS

  it('answers requests on established connections 503 database_unavailable with Retry-After within the query timeout', async (ctx: TestContext) => {
    // Warm the pool so requests meet connections that were open before the stall.
    await Promise.all([getUser(), listUsers(), getUser()]).then(all => { for (const r of all) assert.equal(r.statusCode, 200, r.body) })
    proxy.blackhole()
    const answers = await Promise.all([timed(limit + 5000, getUser), timed(limit + 5000, listUsers), timed(limit + 5000, getUser)])
    ctx.diagnostic(`503 after ${answers.map(a => a.ms).join(', ')} ms; deadlines: query ${QUERY_TIMEOUT_MS} ms, acquire ${ACQUIRE_TIMEOUT_MS} ms`)
    for (const { res, ms } of answers) {
      assertUnavailable(res, 'database_unavailable')
      assert.ok(ms <= limit, `answered after ${ms} ms`)
    }
  })

  it('answers later requests 503 within the acquire timeout while the stall lasts', async (ctx: TestContext) => {
    const answers = await Promise.all(Array.from({ length: 4 }, async () => await timed(limit + 5000, getUser)))
    ctx.diagnostic(`503 after ${answers.map(a => a.ms).join(', ')} ms`)
    for (const { res, ms } of answers) {
      assertUnavailable(res, 'database_unavailable')
      assert.ok(ms <= limit, `answered after ${ms} ms`)
    }
  })

  it('reports the database unavailable from /readyz within its bound', async (ctx: TestContext) => {
    const { res, ms } = await timed(2000 + SLACK_MS, async () => await t.app.inject({ url: '/auth/readyz' }))
    ctx.diagnostic(`readyz 503 after ${ms} ms`)
    assert.equal(res.statusCode, 503, res.body)
    assert.equal(res.json().checks.database, 'unavailable')
  })

  it('serves again once the database answers again', async () => {
    proxy.resume()
    await eventually(5000, async () => {
      assert.equal((await getUser()).statusCode, 200)
      assert.equal((await listUsers()).statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/readyz' })).statusCode, 200)
    })
  })

  it('gives up connections whose query timed out, so it serves again when only new connections get through', async (ctx: TestContext) => {
    await Promise.all([getUser(), listUsers(), getUser()]).then(all => { for (const r of all) assert.equal(r.statusCode, 200, r.body) })
    proxy.blackhole()
    assertUnavailable((await timed(limit + 5000, getUser)).res, 'database_unavailable')
    proxy.resumeNewOnly()
    const started = performance.now()
    await eventually(5000, async () => { assert.equal((await getUser()).statusCode, 200) })
    ctx.diagnostic(`serving again after ${Math.round(performance.now() - started)} ms`)
    proxy.resume()
  })

  it('answers 503, and keeps running, when the stalled connections are then reset', async (ctx: TestContext) => {
    // An error event nobody listens for would end a real process; here it would only be reported.
    const escaped: unknown[] = []
    const onEscape = (error: unknown): void => { escaped.push(error) }
    process.on('uncaughtException', onEscape)
    try {
      assert.equal((await getUser()).statusCode, 200)
      proxy.blackhole()
      const pending = timed(limit + 5000, getUser)
      await new Promise(resolve => setTimeout(resolve, 100))
      proxy.cut()
      const { res, ms } = await pending
      ctx.diagnostic(`503 after ${ms} ms`)
      assertUnavailable(res, 'database_unavailable')
      proxy.resume()
      await eventually(5000, async () => { assert.equal((await getUser()).statusCode, 200) })
    } finally {
      process.off('uncaughtException', onEscape)
    }
    assert.deepEqual(escaped.map(String), [])
  })
})

/**
 * The same stall met by requests that need a connection the pool does not
 * have: every connection is reset and the proxy then holds new ones without
 * forwarding a byte, so each request waits out node-postgres' connect timeout
 * (pooled or pipelined). Every kind of operation, at every door, answers 503
 * database_unavailable with Retry-After, not 500.
 */
describe('a PostgreSQL that stops answering new connections', { skip: pgDialect === undefined ? 'TEST_DATABASE_URL is not set' : false }, () => {
  const QUERY_TIMEOUT_MS = 800
  const ACQUIRE_TIMEOUT_MS = 600
  let proxy: BlackholeProxy
  let t: TestApp
  let scimKey: string
  let userId: string
  let username: string
  let consoleCookie: string

  before(async () => {
    const real = new URL(pgDialect!.url!)
    proxy = await BlackholeProxy.start({ host: real.hostname, port: Number(real.port || 5432) })
    const proxied = new URL(real)
    proxied.hostname = '127.0.0.1'
    proxied.port = String(proxy.port)
    t = await createTestApp(pgDialect!, {
      databaseUrl: proxied.toString(),
      databaseStatementTimeoutMs: 500,
      databaseQueryTimeoutMs: QUERY_TIMEOUT_MS,
      databaseAcquireTimeoutMs: ACQUIRE_TIMEOUT_MS,
      // Nothing answered from memory: each request below goes to the database.
      credentialCacheTtlMs: 0
    })
    username = uniqueName('admin')
    const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD, role: 'admin' } })
    assert.equal(created.statusCode, 201, created.body)
    userId = created.json().id
    const key = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'idp', scopes: ['scim'] } })
    assert.equal(key.statusCode, 201, key.body)
    scimKey = key.json().key
    const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
    assert.equal(login.statusCode, 200, login.body)
    consoleCookie = `gatehouse_session=${(login.json() as { token: string }).token}`
  })
  after(async () => {
    proxy.resume()
    await t?.app.close()
    await proxy.close()
  })

  const scim = { 'content-type': 'application/scim+json' }
  const operations: Array<{ name: string, ok: number, scim?: true, page?: true, run: () => Promise<LightMyRequestResponse> }> = [
    { name: 'read: GET /api/users', ok: 200, run: async () => await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) }) },
    { name: 'read: GET /api/users/{id}', ok: 200, run: async () => await t.app.inject({ url: `/auth/api/users/${userId}`, headers: auth(t.adminKey) }) },
    { name: 'write: POST /api/users', ok: 201, run: async () => await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName() } }) },
    { name: 'sign-in: POST /api/login', ok: 200, run: async () => await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } }) },
    {
      name: 'SCIM: POST /scim/v2/Users',
      ok: 201,
      scim: true,
      run: async () => await t.app.inject({ method: 'POST', url: '/auth/scim/v2/Users', headers: { ...scim, ...auth(scimKey) }, payload: { schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'], userName: uniqueName('scim') } })
    },
    {
      name: 'SCIM: GET /scim/v2/Users?filter=',
      ok: 200,
      scim: true,
      run: async () => await t.app.inject({ url: `/auth/scim/v2/Users?filter=${encodeURIComponent(`userName eq "${username}"`)}`, headers: auth(scimKey) })
    },
    { name: 'console page: GET /admin/users', ok: 200, page: true, run: async () => await t.app.inject({ url: '/auth/admin/users', headers: { cookie: consoleCookie } }) }
  ]
  // A request may wait for a connection, then for a query on it.
  const limit = ACQUIRE_TIMEOUT_MS + QUERY_TIMEOUT_MS + SLACK_MS

  const assertEveryOneUnavailable = async (ctx: TestContext): Promise<void> => {
    const answers = await Promise.all(operations.map(async op => ({ op, ...(await timed(limit + 10_000, op.run)) })))
    ctx.diagnostic(answers.map(({ op, res, ms }) => `${op.name}: ${res.statusCode} after ${ms} ms`).join('; '))
    for (const { op, res } of answers) {
      assert.equal(res.statusCode, 503, `${op.name}: ${res.body}`)
      assert.match(String(res.headers['retry-after']), /^\d+$/, op.name)
      if (op.scim === true) {
        assert.match(res.headers['content-type'] as string, /^application\/scim\+json/, op.name)
        const body = res.json() as { schemas: string[], status: string, detail: string }
        assert.deepEqual([body.schemas, body.status, typeof body.detail], [['urn:ietf:params:scim:api:messages:2.0:Error'], '503', 'string'], op.name)
      } else if (op.page === true) {
        assert.match(res.headers['content-type'] as string, /^text\/html/, op.name)
      } else {
        assertUnavailable(res, 'database_unavailable')
      }
      // How long each took is in the diagnostic above; the bound is timed()'s deadline, not a timing assertion
      // (the argon2 hashing of other suites beside this one can stretch any answer on a loaded machine).
    }
  }
  const assertEveryOneServed = async (): Promise<void> => {
    for (const op of operations) assert.equal((await op.run()).statusCode, op.ok, op.name)
  }

  it('answers every kind of operation 503 database_unavailable with Retry-After within the connect timeout', async (ctx: TestContext) => {
    await assertEveryOneServed()
    proxy.blackhole()
    // Every open connection goes: what the pool and the read pipelines hold is reset, and new ones are held unanswered.
    proxy.cut()
    await eventually(5000, async () => { assert.equal(proxy.open, 0) })
    await assertEveryOneUnavailable(ctx)
    assert.ok(proxy.acceptedWhileDark > 0, 'the requests had to open new connections')
  })

  it('serves every kind of operation again once new connections get through', async () => {
    proxy.resume()
    await eventually(10_000, assertEveryOneServed)
  })

  it('answers every kind of operation 503 database_unavailable within the query timeout when its open connections go silent', async (ctx: TestContext) => {
    await assertEveryOneServed()
    const accepted = proxy.acceptedWhileDark
    proxy.blackhole()
    await assertEveryOneUnavailable(ctx)
    ctx.diagnostic(`${proxy.acceptedWhileDark - accepted} new connection(s) tried during the stall`)
    proxy.resume()
    await eventually(10_000, assertEveryOneServed)
  })
})
