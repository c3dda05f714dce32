import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it } from 'node:test'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import pg from 'pg'
import { sql } from 'kysely'
import { PageCache } from '../src/users/page-cache.ts'
import type { UserPage } from '../src/users/users.repository.ts'
import type { User } from '../src/users/users.schemas.ts'
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

    it('lists a user exactly as Get User answers, in every order and after a change', async () => {
      const username = uniqueName('rendered')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, first_name: 'Quote " and \\ back', groups: ['a', 'b'] } })
      assert.equal(created.statusCode, 201, created.body)
      const id = created.json().id as string
      // The newest user first in both orders.
      const listedText = async (): Promise<string> => {
        const texts = await Promise.all(['-created_at', '-updated_at'].map(async sort => {
          const res = await t.app.inject({ url: `/auth/api/users?limit=1&sort=${sort}`, headers: auth(t.adminKey) })
          assert.equal(res.statusCode, 200, res.body)
          return res.body
        }))
        assert.equal(texts[1], texts[0])
        return texts[0]!
      }
      const expected = async (): Promise<string> => {
        const res = await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 200, res.body)
        return `[${res.body}]`
      }
      assert.equal(await listedText(), await expected())
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { last_name: 'Stored' } })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.equal(await listedText(), await expected())
      assert.match(await listedText(), /"last_name":"Stored"/)
    })

    it('never shows a change a transaction still in progress has made, even to a page read while it is open', async () => {
      const username = uniqueName('pending')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, first_name: 'Committed' } })
      assert.equal(created.statusCode, 201, created.body)
      const id = created.json().id as string
      const firstNameListed = async (read: Promise<ListedUser[]>): Promise<string | null | undefined> => (await read).find(user => user.id === id)?.first_name
      assert.equal(await firstNameListed(pageTwice(t)), 'Committed')
      let readDuring: Promise<ListedUser[]> | undefined
      await assert.rejects(t.app.db.transaction().execute(async trx => {
        await sql`update users set first_name = 'Uncommitted' where id = ${id}`.execute(trx)
        readDuring = page(t)
        // On SQLite the read waits for the one connection until the transaction ends; either way it has had
        // every chance to run inside it before the transaction is rolled back.
        await Promise.race([readDuring.catch(() => {}), new Promise(resolve => setTimeout(resolve, 300))])
        throw new Error('rolled back by the test')
      }), /rolled back by the test/)
      assert.equal(await firstNameListed(readDuring!), 'Committed')
      assert.equal(await firstNameListed(page(t)), 'Committed')
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

/** The body of an answer that must have this status. */
function json (res: { statusCode: number, body: string }, status: number): any {
  assert.equal(res.statusCode, status, res.body)
  return res.body === '' ? undefined : JSON.parse(res.body)
}

/** Page reads this app's page cache has answered from itself so far (its Prometheus counter). */
async function cacheHits (t: TestApp): Promise<number> {
  const res = await t.app.inject({ url: '/auth/metrics' })
  assert.equal(res.statusCode, 200, res.body)
  const match = /^gatehouse_users_page_cache_lookups_total\{result="hit"\} (\d+)$/m.exec(res.body)
  return match === null ? 0 : Number(match[1])
}

/** Reads the page and says whether the page cache served it. */
async function servedFromCache (t: TestApp, query?: string): Promise<boolean> {
  const before = await cacheHits(t)
  await page(t, query)
  return await cacheHits(t) === before + 1
}

for (const dialect of dialects()) {
  describe(`list pages after a write through each door (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('shows a user SCIM creates, changes and deletes in the very next page read', async () => {
      const made = json(await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'idp', scopes: ['scim'] } }), 201)
      const scim = async (method: 'POST' | 'PATCH' | 'DELETE', path: string, payload?: object) => await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${made.key as string}`, 'content-type': 'application/scim+json' },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
      await pageTwice(t)
      const userName = uniqueName('scimdoor')
      const created = json(await scim('POST', '/Users', { schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'], userName, name: { givenName: 'Ada' }, active: true }), 201)
      assert.equal((await pageTwice(t))[0]?.username, userName)
      json(await scim('PATCH', `/Users/${created.id as string}`, {
        schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', path: 'name.givenName', value: 'Grace' }]
      }), 200)
      assert.equal((await pageTwice(t))[0]?.first_name, 'Grace')
      json(await scim('DELETE', `/Users/${created.id as string}`), 204)
      assert.ok(!(await page(t)).some(user => user.id === created.id))
    })

    it('shows a group renamed, joined and left through the API in the next group= page read', async () => {
      const member = json(await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('member') } }), 201)
      const name = uniqueName('crew')
      const group = json(await t.app.inject({ method: 'POST', url: '/auth/api/groups', headers: auth(t.adminKey), payload: { display_name: name, member_ids: [member.id] } }), 201)
      assert.deepEqual((await pageTwice(t, `group=${name}`)).map(user => user.id), [member.id])
      json(await t.app.inject({ method: 'DELETE', url: `/auth/api/groups/${group.id as string}/members/${member.id as string}`, headers: auth(t.adminKey) }), 204)
      assert.deepEqual(await pageTwice(t, `group=${name}`), [])
      json(await t.app.inject({ method: 'POST', url: `/auth/api/groups/${group.id as string}/members`, headers: auth(t.adminKey), payload: { user_ids: [member.id] } }), 200)
      assert.deepEqual((await pageTwice(t, `group=${name}`)).map(user => user.id), [member.id])
      json(await t.app.inject({
        method: 'PATCH', url: `/auth/api/groups/${group.id as string}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { display_name: `${name}-renamed` }
      }), 200)
      assert.deepEqual(await page(t, `group=${name}`), [])
    })

    it('serves the page again from the cache when nothing was written, and lets many writers at once finish', async () => {
      await pageTwice(t)
      assert.ok(await servedFromCache(t))
      const users = await Promise.all(Array.from({ length: 12 }, async () =>
        json(await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('busy') } }), 201) as { id: string }))
      const name = uniqueName('busygroup')
      // Changes to different users, to the same users through a group, and to the group at once: none waits forever, none fails.
      const results = await Promise.all([
        ...users.map(async (user, i) => await t.app.inject({
          method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { first_name: `Busy${i}`, groups: [name] }
        })),
        t.app.inject({ method: 'POST', url: '/auth/api/groups', headers: auth(t.adminKey), payload: { display_name: `${name}-other`, member_ids: users.map(user => user.id) } })
      ])
      for (const res of results) assert.ok(res.statusCode === 200 || res.statusCode === 201, res.body)
      const listed = await page(t, `limit=50&sort=-created_at&group=${name}`)
      assert.deepEqual(listed.map(user => user.first_name).sort(), users.map((_, i) => `Busy${i}`).sort())
    })
  })
}

if (dialects().some(dialect => dialect.url !== undefined)) {
  const url = dialects().find(dialect => dialect.url !== undefined)!.url!
  describe('list pages on PostgreSQL: what moves the change stamp and what does not', () => {
    const t = useTestApp({ name: 'postgres', url })
    const otherDatabase = `gatehouse_stamp_other_${randomBytes(4).toString('hex')}`
    const connect = async (database?: string): Promise<pg.Client> => {
      const target = new URL(url)
      if (database !== undefined) target.pathname = `/${database}`
      const client = new pg.Client({ connectionString: target.toString(), options: database === undefined ? `-c search_path=${t.config.databaseSchema!}` : undefined })
      await client.connect()
      return client
    }
    before(async () => {
      const admin = await connect()
      try { await admin.query(`create database "${otherDatabase}"`) } finally { await admin.end() }
    })
    after(async () => {
      const admin = await connect()
      try { await admin.query(`drop database if exists "${otherDatabase}"`) } finally { await admin.end() }
    })

    it('keeps serving the cached page while other databases of the server commit', async () => {
      const other = await connect(otherDatabase)
      try {
        await other.query('create table elsewhere (n int)')
        await pageTwice(t)
        for (let i = 0; i < 5; i++) await other.query('insert into elsewhere values ($1)', [i])
        assert.ok(await servedFromCache(t), 'a commit in another database must not move the stamp')
      } finally {
        await other.end()
      }
    })

    it('keeps serving the cached page across writes to other tables and sign-in bookkeeping, and not across a sign-in', async () => {
      const username = uniqueName('bookkeeping')
      json(await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD } }), 201)
      await pageTwice(t)
      json(await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: uniqueName('key'), scopes: ['admin'] } }), 201)
      assert.ok(await servedFromCache(t), 'an API key (and its event) changes no users page')
      // A wrong password counts a failure on the user's row; no page shows the count.
      json(await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: 'not the password at all' } }), 401)
      assert.ok(await servedFromCache(t), 'a failed sign-in changes no users page')
      json(await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } }), 200)
      assert.equal(await servedFromCache(t), false, 'a sign-in sets last_login_at, which the page shows')
    })

    it('shows inserts, updates, deletes and a TRUNCATE made by SQL from another connection in the next page read', async () => {
      const sqlUser = uniqueName('bysql')
      const other = await connect()
      try {
        await pageTwice(t)
        await other.query(`insert into users (id, username, username_key, role, groups, disabled, version, created_at, updated_at)
          values (gen_random_uuid(), $1, $1, 'user', '["bysql"]', false, 1, now() + interval '1 day', now())`, [sqlUser])
        const [inserted] = (await pageTwice(t)).filter(user => user.username === sqlUser)
        assert.ok(inserted !== undefined, 'the inserted user is on the page')
        await other.query('update users set first_name = $1 where id = $2', ['BySql', inserted.id])
        assert.equal((await pageTwice(t)).find(user => user.id === inserted.id)?.first_name, 'BySql')
        const group = await other.query<{ id: string }>(`insert into groups (id, display_name, name_key, version, created_at, updated_at)
          values (gen_random_uuid(), $1, lower($1), 1, now(), now()) returning id`, [`${sqlUser}-g`])
        await other.query('insert into group_members (group_id, user_id) values ($1, $2)', [group.rows[0]!.id, inserted.id])
        assert.deepEqual((await pageTwice(t, `group=${sqlUser}-g`)).map(user => user.id), [inserted.id])
        await other.query('truncate group_members')
        assert.deepEqual(await pageTwice(t, `group=${sqlUser}-g`), [])
        await other.query('delete from users where id = $1', [inserted.id])
        assert.ok(!(await page(t)).some(user => user.id === inserted.id))
      } finally {
        await other.end()
      }
    })

    it('shows a transaction that commits after a later one did, in the page read after its commit', async () => {
      const [first, second] = await Promise.all(['early', 'late'].map(async prefix =>
        json(await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(prefix) } }), 201) as { id: string }))
      const a = await connect()
      const b = await connect()
      try {
        await a.query('begin')
        await a.query('update users set first_name = $1 where id = $2', ['Early', first!.id])
        await b.query('begin')
        await b.query('update users set first_name = $1 where id = $2', ['Late', second!.id])
        await b.query('commit')
        // Cached under a stamp that counts b's commit but not a's, which is still open.
        const between = await pageTwice(t)
        assert.equal(between.find(user => user.id === second!.id)?.first_name, 'Late')
        assert.equal(between.find(user => user.id === first!.id)?.first_name, null)
        await a.query('commit')
        assert.equal((await page(t)).find(user => user.id === first!.id)?.first_name, 'Early')
      } finally {
        await a.end()
        await b.end()
      }
    })

    it('lets many open transactions that change users and memberships commit at once, each one seen', async () => {
      const ids = await Promise.all(Array.from({ length: 8 }, async () =>
        (json(await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('together') } }), 201) as { id: string }).id))
      const group = json(await t.app.inject({ method: 'POST', url: '/auth/api/groups', headers: auth(t.adminKey), payload: { display_name: uniqueName('together') } }), 201) as { id: string, display_name: string }
      await pageTwice(t)
      const clients = await Promise.all(ids.map(async () => await connect()))
      try {
        // All open at once, each holding its user's row, then all committing at once: every one bumps the stamp at its commit.
        await Promise.all(clients.map(async (client, i) => {
          await client.query('begin')
          await client.query('update users set last_name = $1 where id = $2', [`Together${i}`, ids[i]])
          await client.query('insert into group_members (group_id, user_id) values ($1, $2)', [group.id, ids[i]])
        }))
        await Promise.all(clients.map(async client => await client.query('commit')))
      } finally {
        await Promise.all(clients.map(async client => await client.end()))
      }
      const listed = await page(t, `limit=50&group=${group.display_name}`)
      assert.deepEqual(listed.map(user => user.id).sort(), [...ids].sort())
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
  const rendered = (text: string): UserPage => ({ users: [{ username: text }] as unknown as User[], next: undefined })

  it('serves a page only under the stamp it was stored with', () => {
    const cache = new PageCache(1024 * 1024)
    cache.set('k', '1:1', rendered('1'))
    assert.deepEqual(cache.get('k', '1:1'), rendered('1'))
    assert.equal(cache.get('k', '2:1'), undefined)
    // A miss under another stamp also drops the entry: it can never be served again.
    assert.equal(cache.get('k', '1:1'), undefined)
    assert.equal(cache.size, 0)
  })

  it('rests after a streak of misses, so a database written all the time costs no stamp reads, and looks again afterwards', () => {
    const cache = new PageCache(1024 * 1024, { missStreak: 3, restMs: 1000 })
    cache.set('k', '1', rendered('1'))
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
    cache.set('k', '4', rendered('4'))
    assert.deepEqual(cache.get('k', '4', 1010), rendered('4'))
  })

  it('drops the least recently used pages beyond its byte budget, and never keeps an oversized one', () => {
    // An entry of a one-letter key and one user with a username of n characters counts 2 + 64 + 2n bytes (sizeOf):
    // 200 for 67 characters. The budget holds 8 of them, and no entry over 200 bytes.
    const cache = new PageCache(1600)
    const body = (n: number): string => String(n).padEnd(67, ' ')
    for (const key of ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']) cache.set(key, 's', rendered(body(1)))
    assert.equal(cache.size, 8)
    assert.ok(cache.get('a', 's') !== undefined)
    cache.set('i', 's', rendered(body(2)))
    assert.equal(cache.size, 8)
    assert.equal(cache.get('b', 's'), undefined, 'b was the least recently used')
    assert.ok(cache.get('a', 's') !== undefined)
    cache.set('j', 's', rendered('x'.repeat(68)))
    assert.equal(cache.get('j', 's'), undefined, 'an entry over an eighth of the budget is not kept')
    assert.equal(cache.size, 8)
  })
})
