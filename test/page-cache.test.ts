import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import pg from 'pg'
import { PageCache } from '../src/users/page-cache.ts'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

interface ListedUser { id: string, username: string, first_name: string | null, last_login_at: string | null }

async function page (t: TestApp, query = 'limit=50&sort=-created_at'): Promise<ListedUser[]> {
  const res = await t.app.inject({ url: `/auth/api/users?${query}`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

/** The same page read twice, so that a cache, if any, holds it before the write under test. */
async function pageTwice (t: TestApp, query?: string): Promise<ListedUser[]> {
  const first = await page(t, query)
  assert.deepEqual(await page(t, query), first)
  return first
}

for (const dialect of dialects()) {
  describe(`list pages after writes (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('shows a created, changed, signed-in and deleted user in the very next page read', async () => {
      await pageTwice(t)
      const username = uniqueName('fresh')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD } })
      assert.equal(created.statusCode, 201, created.body)
      const id = created.json().id as string
      assert.equal((await pageTwice(t))[0]?.username, username)

      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { first_name: 'Renamed' } })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.equal((await pageTwice(t))[0]?.first_name, 'Renamed')

      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
      assert.equal(login.statusCode, 200, login.body)
      assert.notEqual((await pageTwice(t))[0]?.last_login_at, null)

      const deleted = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
      assert.equal(deleted.statusCode, 204, deleted.body)
      assert.ok(!(await page(t)).some(user => user.id === id))
    })

    if (dialect.url !== undefined) {
      it('shows a change another instance commits to the same database in the next page read', async () => {
        const username = uniqueName('elsewhere')
        const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })
        assert.equal(created.statusCode, 201, created.body)
        assert.equal((await pageTwice(t))[0]?.first_name, null)
        const other = new pg.Client({ connectionString: dialect.url, options: `-c search_path=${t.config.databaseSchema!}` })
        await other.connect()
        try {
          const changed = await other.query('update users set first_name = $1, version = version + 1 where id = $2', ['FromElsewhere', created.json().id])
          assert.equal(changed.rowCount, 1)
        } finally {
          await other.end()
        }
        assert.equal((await page(t))[0]?.first_name, 'FromElsewhere')
      })
    }

    it('lists a user exactly as Get User answers, from the stored rendering and, when that is missing, from the columns', async () => {
      const username = uniqueName('rendered')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, first_name: 'Quote " and \\ back', groups: ['a', 'b'] } })
      assert.equal(created.statusCode, 201, created.body)
      const id = created.json().id as string
      const listedText = async (): Promise<string> => {
        const res = await t.app.inject({ url: '/auth/api/users?limit=1&sort=-created_at', headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 200, res.body)
        return res.body
      }
      const expected = async (): Promise<string> => {
        const res = await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 200, res.body)
        return `[${JSON.stringify(res.json())}]`
      }
      assert.equal(await listedText(), await expected())
      const removed = await t.app.db.deleteFrom('user_json').where('user_id', '=', id).executeTakeFirst()
      assert.equal(removed.numDeletedRows, 1n)
      assert.equal(await listedText(), await expected())
      // A change to a listed field writes the rendering again.
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { last_name: 'Stored' } })
      assert.equal(patched.statusCode, 200, patched.body)
      const stored = await t.app.db.selectFrom('user_json').select('json').where('user_id', '=', id).executeTakeFirst()
      assert.equal(`[${stored?.json ?? ''}]`, await expected())
      assert.equal(await listedText(), await expected())
    })

    it('answers filters given in any order with the same page, and different filters with their own', async () => {
      const username = uniqueName('filtered')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, role: 'user', first_name: 'Filtered' } })
      assert.equal(created.statusCode, 201, created.body)
      const a = await pageTwice(t, `limit=5&role=user&q=${username}`)
      const b = await pageTwice(t, `q=${username}&limit=5&role=user`)
      assert.deepEqual(a.map(user => user.username), [username])
      assert.deepEqual(b, a)
      assert.deepEqual(await page(t, `limit=5&role=admin&q=${username}`), [])
    })
  })
}

describe('list pages after another connection writes the same SQLite file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gatehouse-page-cache-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'gatehouse.db')
  const t = useTestApp({ name: 'sqlite', url: undefined }, { databaseUrl: `sqlite:${file}` })

  it('shows a change committed by another connection (the CLI, another process) in the next page read', async () => {
    const username = uniqueName('elsewhere')
    const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })
    assert.equal(created.statusCode, 201, created.body)
    assert.equal((await pageTwice(t))[0]?.first_name, null)

    // The binding the product loads on this Node version (src/db/sqlite-binding.ts).
    const other = new Sqlite(file)
    try {
      const changed = other.prepare('update users set first_name = ?, version = version + 1 where id = ?').run('FromElsewhere', created.json().id)
      assert.equal(changed.changes, 1)
    } finally {
      other.close()
    }
    assert.equal((await page(t))[0]?.first_name, 'FromElsewhere')
  })
})

describe('PageCache', () => {
  const rendered = (text: string): { json: string, next: undefined } => ({ json: text, next: undefined })

  it('serves a page only under the stamp it was stored with', () => {
    const cache = new PageCache(1024 * 1024)
    cache.set('k', '1:1', rendered('[1]'))
    assert.deepEqual(cache.get('k', '1:1'), rendered('[1]'))
    assert.equal(cache.get('k', '2:1'), undefined)
    // A miss under another stamp also drops the entry: it can never be served again.
    assert.equal(cache.get('k', '1:1'), undefined)
    assert.equal(cache.size, 0)
  })

  it('rests after a streak of misses, so a database written all the time costs no stamp reads, and looks again afterwards', () => {
    const cache = new PageCache(1024 * 1024, { missStreak: 3, restMs: 1000 })
    cache.set('k', '1', rendered('[1]'))
    assert.ok(cache.get('k', '1', 0) !== undefined)
    // Two misses, then a hit: the streak starts again.
    assert.equal(cache.get('a', '1', 0), undefined)
    assert.equal(cache.get('b', '1', 0), undefined)
    assert.ok(cache.get('k', '1', 0) !== undefined)
    assert.equal(cache.resting(0), false)
    // Three in a row (the stamp moved on every write).
    for (const stamp of ['2', '3', '4']) assert.equal(cache.get('k', stamp, 10), undefined)
    assert.equal(cache.resting(10), true)
    assert.equal(cache.resting(1009), true)
    assert.equal(cache.resting(1010), false)
    cache.set('k', '4', rendered('[4]'))
    assert.deepEqual(cache.get('k', '4', 1010), rendered('[4]'))
  })

  it('drops the least recently used pages beyond its byte budget, and never keeps an oversized one', () => {
    // Each entry below is 2 * (1 + 98) = 198 bytes; the budget holds 8 of them, and no entry over 200 bytes.
    const cache = new PageCache(1600)
    const body = (n: number): string => `[${String(n).padEnd(96, ' ')}]`
    for (const key of ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']) cache.set(key, 's', rendered(body(1)))
    assert.equal(cache.size, 8)
    assert.ok(cache.get('a', 's') !== undefined)
    cache.set('i', 's', rendered(body(2)))
    assert.equal(cache.size, 8)
    assert.equal(cache.get('b', 's'), undefined, 'b was the least recently used')
    assert.ok(cache.get('a', 's') !== undefined)
    cache.set('j', 's', rendered('x'.repeat(100)))
    assert.equal(cache.get('j', 's'), undefined, 'an entry over an eighth of the budget is not kept')
    assert.equal(cache.size, 8)
  })
})
