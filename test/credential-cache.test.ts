import assert from 'node:assert/strict'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import pg from 'pg'
import { buildApp } from '../src/app.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { defaultConfig } from '../src/config.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { waitFor } from './polling.ts'

// A minute: longer than any test waits, so only an invalidation (never the
// entry running out) can make a change take effect in these tests.
const TTL_MS = 60_000
// How long another instance may take to hear of a change (NOTIFY, or SQLite's
// data_version read once a second); generous for a loaded 2-core machine.
const ACROSS_INSTANCES_MS = 15_000

async function createKey (t: TestApp, body: Record<string, unknown> = { name: uniqueName('key'), scopes: ['users:read'] }): Promise<{ id: string, key: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: body })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function createUser (t: TestApp, role: 'admin' | 'user' = 'user'): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, role } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function signIn (app: FastifyTypeBox, username: string): Promise<Record<string, string>> {
  const res = await app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  assert.equal(res.statusCode, 200, res.body)
  return { authorization: `Bearer ${res.json().token as string}` }
}

async function status (app: FastifyTypeBox, url: string, headers: Record<string, string>): Promise<number> {
  return (await app.inject({ url, headers })).statusCode
}

/** Asks until the answer is `expected`, for at most `withinMs`; returns how long that took. */
async function until (app: FastifyTypeBox, url: string, headers: Record<string, string>, expected: number, withinMs: number): Promise<number> {
  const started = Date.now()
  for (;;) {
    const got = await status(app, url, headers)
    if (got === expected) return Date.now() - started
    if (Date.now() - started > withinMs) assert.fail(`still ${got} (expected ${expected}) after ${withinMs} ms`)
    await new Promise(resolve => setTimeout(resolve, 25))
  }
}

/** How many credentials the app holds checked. */
function cached (app: FastifyTypeBox): number {
  return app.credentials.size
}

for (const dialect of dialects()) {
  describe(`credential cache, one instance (${dialect.name})`, () => {
    let t: TestApp
    before(async () => {
      t = await createTestApp(dialect, { credentialCacheTtlMs: TTL_MS })
      // The listener connects in the background; until it listens, nothing is cached (CI's stop 13 run asserted too early).
      if (dialect.name === 'postgres') await waitFor('the instance listens for credential changes', () => t.app.credentials.enabled, 20_000)
    })
    after(async () => { await t?.app.close() })

    it('keeps a checked API key, and a revoked one stops working at the next request', async () => {
      const key = await createKey(t)
      // Asked again if a notice of an earlier change (the test app's own set-up) emptied the cache meanwhile.
      await waitFor('the key is cached after its use', async () => await status(t.app, '/auth/api/users?limit=1', auth(key.key)) === 200 && cached(t.app) > 0)
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })).statusCode, 204)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', auth(key.key)), 401)
    })

    it('a rotated key stops working at the next request', async () => {
      const key = await createKey(t)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', auth(key.key)), 200)
      const rotated = await t.app.inject({ method: 'POST', url: `/auth/api/api-keys/${key.id}/rotate`, headers: auth(t.adminKey), payload: {} })
      assert.equal(rotated.statusCode, 200, rotated.body)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', auth(key.key)), 401)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', auth(rotated.json().key)), 200)
    })

    it('a disabled user\'s session stops working at the next request', async () => {
      const user = await createUser(t)
      const bearer = await signIn(t.app, user.username)
      assert.equal(await status(t.app, '/auth/api/verify', bearer), 200)
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { disabled: true } })
      assert.equal(await status(t.app, '/auth/api/verify', bearer), 401)
    })

    it('an admin made a user loses admin rights at the next request', async () => {
      await createUser(t, 'admin') // so the one demoted is not the last admin
      const admin = await createUser(t, 'admin')
      const bearer = await signIn(t.app, admin.username)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', bearer), 200)
      assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${admin.id}`, headers: auth(t.adminKey), payload: { role: 'user' } })).statusCode, 200)
      assert.equal(await status(t.app, '/auth/api/users?limit=1', bearer), 403)
    })

    /**
     * PostgreSQL: waits until every credential notice sent before now has reached the app. A notice of our own,
     * sent after them, empties the cache when it arrives; one listening connection gets notices in the order
     * their transactions committed, so once ours has emptied it, an earlier test's late notice cannot come after.
     * Returns the generation that notice made. SQLite: nothing is in flight (one in-memory connection).
     */
    async function settleNotices (): Promise<number> {
      if (dialect.name === 'postgres') {
        const generation = t.app.credentials.generation()
        const client = new pg.Client({ connectionString: dialect.url })
        await client.connect()
        try {
          await client.query('select pg_notify($1, $2)', ['gatehouse_credentials', t.config.databaseSchema])
        } finally {
          await client.end()
        }
        await waitFor('the app hears the marker notice', () => t.app.credentials.generation() > generation, 20_000)
      }
      return t.app.credentials.generation()
    }

    it('a sign-in leaves the cache full: the gate goes on answering from it during a sign-in storm', async () => {
      const gate = await createUser(t)
      const bearer = await signIn(t.app, gate.username)
      const other = await createUser(t)
      await settleNotices()
      await waitFor('the session is cached after its use', async () => await status(t.app, '/auth/api/verify', bearer) === 200 && cached(t.app) > 0)
      const generation = t.app.credentials.generation()
      const size = cached(t.app)
      await signIn(t.app, other.username)
      assert.equal(t.app.credentials.generation(), generation, 'the sign-in emptied the cache in this process')
      assert.equal(cached(t.app), size)
      // A notice the sign-in sent would arrive before the marker and empty the cache once more.
      assert.equal(await settleNotices(), generation + (dialect.name === 'postgres' ? 1 : 0), 'the sign-in sent a credential notice')
    })

    it('a write that changes no credential row leaves the cache as it is (ending the sessions of a user who has none)', async () => {
      const user = await createUser(t)
      await settleNotices()
      await waitFor('the admin key is cached after its use', async () => await status(t.app, '/auth/api/users?limit=1', auth(t.adminKey)) === 200 && cached(t.app) > 0)
      const generation = t.app.credentials.generation()
      const ended = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions`, headers: auth(t.adminKey) })
      assert.equal(ended.statusCode, 200, ended.body)
      assert.equal(ended.json().ended, 0)
      assert.equal(t.app.credentials.generation(), generation)
      // The same request once the user has a session ends it, and that empties the cache.
      const bearer = await signIn(t.app, user.username)
      const again = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions`, headers: auth(t.adminKey) })
      assert.equal(again.json().ended, 1)
      assert.ok(t.app.credentials.generation() > generation, 'ending a session emptied the cache')
      assert.equal(await status(t.app, '/auth/api/verify', bearer), 401)
    })

    if (dialect.name === 'postgres') {
      it('a sign-in sends no credential notice to the other instances; disabling a user still does', async () => {
        const schema = t.config.databaseSchema!
        const listener = new pg.Client({ connectionString: dialect.url })
        const notices: string[] = []
        listener.on('notification', message => { if (message.channel === 'gatehouse_credentials') notices.push(message.payload ?? '') })
        await listener.connect()
        try {
          await listener.query('LISTEN gatehouse_credentials')
          // Notices reach a listener in the order their transactions committed: once the marker sent after
          // the sign-in has arrived, a notice from the sign-in would have arrived before it.
          const roundTrip = async (marker: string): Promise<string[]> => {
            await listener.query('select pg_notify($1, $2)', ['gatehouse_credentials', marker])
            await waitFor(`the marker ${marker} arrives`, () => notices.includes(marker), 20_000)
            return notices.splice(0).filter(payload => payload === schema)
          }
          const user = await createUser(t)
          await roundTrip('before')
          await signIn(t.app, user.username)
          assert.deepEqual(await roundTrip('after-sign-in'), [])
          assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { disabled: true } })).statusCode, 200)
          assert.ok((await roundTrip('after-disable')).length > 0, 'disabling the user notified the instances')
        } finally {
          await listener.end()
        }
      })
    }
  })
}

for (const dialect of dialects()) {
  describe(`credential cache, two instances on one database (${dialect.name})`, () => {
    let a: TestApp
    let b: FastifyTypeBox
    let dir: string | undefined
    before(async () => {
      let overrides = {}
      if (dialect.name === 'sqlite') {
        dir = await mkdtemp(join(tmpdir(), 'gatehouse-cache-'))
        overrides = { databaseUrl: `sqlite:${join(dir, 'shared.db')}` }
      }
      a = await createTestApp(dialect, { credentialCacheTtlMs: TTL_MS, ...overrides })
      b = await buildApp({ config: defaultConfig({ ...a.config }), logger: false })
      await b.ready()
      if (dialect.name === 'postgres') {
        // The listener connects in the background; until it listens, B caches nothing.
        await waitFor('instance B listens for credential changes', () => b.credentials.enabled, 20_000)
      }
    })
    after(async () => {
      await b?.close()
      await a?.app.close()
      if (dir !== undefined) await rm(dir, { recursive: true, force: true })
    })

    it('a key revoked on A stops working on B, which had it cached', async () => {
      const key = await createKey(a)
      // Asked again if a notice of an earlier change (the apps' own set-up) emptied B's cache meanwhile.
      await waitFor('B caches the key', async () => await status(b, '/auth/api/users?limit=1', auth(key.key)) === 200 && cached(b) > 0)
      await a.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(a.adminKey) })
      await until(b, '/auth/api/users?limit=1', auth(key.key), 401, ACROSS_INSTANCES_MS)
    })

    it('a user disabled on A is signed out on B', async () => {
      const user = await createUser(a)
      const bearer = await signIn(b, user.username)
      assert.equal(await status(b, '/auth/api/verify', bearer), 200)
      await a.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(a.adminKey), payload: { disabled: true } })
      await until(b, '/auth/api/verify', bearer, 401, ACROSS_INSTANCES_MS)
    })

    it('a user deleted on A is signed out on B', async () => {
      const user = await createUser(a)
      const bearer = await signIn(b, user.username)
      assert.equal(await status(b, '/auth/api/verify', bearer), 200)
      assert.equal((await a.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}`, headers: auth(a.adminKey) })).statusCode, 204)
      await until(b, '/auth/api/verify', bearer, 401, ACROSS_INSTANCES_MS)
    })

    it('an admin demoted on A loses admin rights on B', async () => {
      await createUser(a, 'admin') // so the one demoted is not the last admin
      const admin = await createUser(a, 'admin')
      const bearer = await signIn(b, admin.username)
      assert.equal(await status(b, '/auth/api/users?limit=1', bearer), 200)
      assert.equal((await a.app.inject({ method: 'PATCH', url: `/auth/api/users/${admin.id}`, headers: auth(a.adminKey), payload: { role: 'user' } })).statusCode, 200)
      await until(b, '/auth/api/users?limit=1', bearer, 403, ACROSS_INSTANCES_MS)
    })

    if (dialect.name === 'postgres') {
      it('while B\'s listener is cut off, B checks the database on every request, and caches again once it is back', async () => {
        const key = await createKey(a)
        assert.equal(await status(b, '/auth/api/users?limit=1', auth(key.key)), 200)
        const admin = new pg.Client({ connectionString: dialect.url })
        await admin.connect()
        try {
          await admin.query("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'gatehouse-credential-listener'")
        } finally {
          await admin.end()
        }
        await waitFor('B notices its listener is gone', () => !b.credentials.enabled, 20_000)
        await a.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(a.adminKey) })
        // No notice can reach B now; it must not answer from what it had.
        assert.equal(await status(b, '/auth/api/users?limit=1', auth(key.key)), 401)
        await waitFor('B listens again', () => b.credentials.enabled, 20_000)
        const next = await createKey(a)
        assert.equal(await status(b, '/auth/api/users?limit=1', auth(next.key)), 200)
        await a.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${next.id}`, headers: auth(a.adminKey) })
        await until(b, '/auth/api/users?limit=1', auth(next.key), 401, ACROSS_INSTANCES_MS)
      })
    }
  })
}
