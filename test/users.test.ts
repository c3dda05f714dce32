import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

for (const dialect of dialects()) {
  describe(`users (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const post = async (body: unknown, key = t.adminKey) =>
      await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(key), payload: body as object })

    it('creates a user with 201, Location and ETag, and never returns the password', async () => {
      const username = uniqueName('Ada')
      const res = await post({ username, password: GOOD_PASSWORD, email: `${username}@Example.com`, first_name: 'Ada', groups: ['etl', 'ops'] })
      assert.equal(res.statusCode, 201, res.body)
      const user = res.json()
      assert.match(user.id, UUID)
      assert.equal(res.headers.location, `/auth/api/users/${user.id}`)
      assert.equal(res.headers.etag, '"1"')
      assert.equal(user.username, username)
      assert.equal(user.email, `${username}@Example.com`)
      assert.equal(user.role, 'user')
      assert.deepEqual(user.groups, ['etl', 'ops'])
      assert.equal(user.disabled, false)
      assert.equal(user.last_login_at, null)
      assert.ok(user.password_changed_at)
      assert.ok(!('password' in user) && !('password_hash' in user))
      assert.ok(!res.body.includes('argon2'))
    })

    it('stores an argon2id hash with at least m=19456 t=2 p=1', async () => {
      const username = uniqueName()
      await post({ username, password: GOOD_PASSWORD })
      const row = await t.app.db.selectFrom('users').select('password_hash').where('username', '=', username).executeTakeFirstOrThrow()
      const match = /^\$argon2id\$v=19\$m=(\d+),t=(\d+),p=(\d+)\$/.exec(row.password_hash ?? '')
      assert.ok(match, row.password_hash ?? 'no hash')
      assert.ok(Number(match[1]) >= 19456 && Number(match[2]) >= 2 && Number(match[3]) >= 1)
    })

    it('accepts form-urlencoded fields, as 3.6.1 clients send them', async () => {
      const username = uniqueName()
      const res = await t.app.inject({
        method: 'POST',
        url: '/auth/api/users',
        headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' },
        payload: new URLSearchParams({ username, password: GOOD_PASSWORD, disabled: 'true', groups: 'etl' }).toString()
      })
      assert.equal(res.statusCode, 201, res.body)
      assert.equal(res.json().disabled, true)
      assert.deepEqual(res.json().groups, ['etl'])
    })

    it('accepts multipart/form-data fields', async () => {
      const username = uniqueName()
      const form = new FormData()
      form.set('username', username)
      form.set('password', GOOD_PASSWORD)
      form.set('first_name', 'Grace')
      const request = new Request('http://x/', { method: 'POST', body: form })
      const res = await t.app.inject({
        method: 'POST',
        url: '/auth/api/users',
        headers: { ...auth(t.adminKey), 'content-type': request.headers.get('content-type')! },
        payload: Buffer.from(await request.arrayBuffer())
      })
      assert.equal(res.statusCode, 201, res.body)
      assert.equal(res.json().first_name, 'Grace')
    })

    it('rejects unknown and read-only fields with 422 and their JSON pointers, and creates nothing', async () => {
      const username = uniqueName()
      const res = await post({ username, id: '01900000-0000-7000-8000-000000000000', password_hash: 'x', created_at: '2020-01-01T00:00:00Z', is_admin: true })
      assert.equal(res.statusCode, 422)
      assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
      const problem = res.json()
      assert.equal(problem.code, 'validation_failed')
      const pointers = problem.errors.map((e: { pointer: string }) => e.pointer).sort()
      assert.deepEqual(pointers, ['/created_at', '/id', '/is_admin', '/password_hash'])
      const list = await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })
      assert.deepEqual(list.json(), [])
    })

    it('rejects invalid values with 422: bad username, bad email, too-long names', async () => {
      for (const body of [
        { username: 'has space' },
        { username: '' },
        { username: 'x'.repeat(65) },
        { username: uniqueName(), email: 'not-an-email' },
        { username: uniqueName(), first_name: 'x'.repeat(201) },
        { username: uniqueName(), role: 'root' },
        { username: uniqueName(), groups: [''] }
      ]) {
        const res = await post(body)
        assert.equal(res.statusCode, 422, JSON.stringify(body))
        assert.equal(res.json().code, 'validation_failed')
      }
    })

    it('takes JSON values exactly as sent: null or a string for a boolean is 422, not a coerced value', async () => {
      const created = (await post({ username: uniqueName() })).json()
      for (const payload of [{ disabled: null }, { disabled: 'true' }, { disabled: 0 }, { groups: null }, { groups: 'etl' }, { first_name: 5 }]) {
        const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${created.id}`, headers: auth(t.adminKey), payload })
        assert.equal(res.statusCode, 422, JSON.stringify(payload))
        assert.equal(res.json().errors[0].pointer, `/${Object.keys(payload)[0]}`)
      }
      assert.equal((await post({ username: uniqueName(), disabled: 'false' })).statusCode, 422)
      const after = await t.app.inject({ url: `/auth/api/users/${created.id}`, headers: auth(t.adminKey) })
      assert.deepEqual(after.json(), created)
    })

    it('applies the password policy with a code per rule', async () => {
      const username = uniqueName('grace')
      const cases: Array<[string, string]> = [
        ['short', 'password_too_short'],
        ['x'.repeat(257), 'password_too_long'],
        [`my-${username.toUpperCase()}-pass`, 'password_contains_username']
      ]
      for (const [password, code] of cases) {
        const res = await post({ username, password })
        assert.equal(res.statusCode, 422)
        assert.equal(res.json().code, code)
        assert.equal(res.json().errors[0].pointer, '/password')
      }
      // Composition rules do not exist: a long passphrase is fine.
      assert.equal((await post({ username, password: 'correct horse battery staple' })).statusCode, 201)
    })

    it('reports a broken password rule in the same 422 as the schema\'s problems, on create and update', async () => {
      const pointersOf = (res: LightMyRequestResponse): Record<string, string> => {
        assert.equal(res.statusCode, 422, res.body)
        assert.equal(res.json().code, 'validation_failed')
        return Object.fromEntries((res.json().errors as Array<{ pointer: string, detail: string }>).map(e => [e.pointer, e.detail]))
      }
      const username = uniqueName('grace')
      const tooShort = pointersOf(await post({ username, email: 'not-an-address', password: 'short' }))
      assert.equal(tooShort['/email'], 'must match format "email"')
      assert.equal(tooShort['/password'], 'is shorter than 8 characters')
      const named = pointersOf(await post({ username, email: 'not-an-address', password: `${username}-and-more` }))
      assert.equal(named['/password'], 'contains the username')
      const form = pointersOf(await t.app.inject({
        method: 'POST',
        url: '/auth/api/users',
        headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' },
        payload: new URLSearchParams({ username: 'no spaces', password: 'password' }).toString()
      }))
      assert.ok(form['/username'] !== undefined && form['/password'] === 'is a commonly used password', JSON.stringify(form))

      const created = (await post({ username: uniqueName() })).json()
      const patch = pointersOf(await t.app.inject({
        method: 'PATCH',
        url: `/auth/api/users/${created.id}`,
        headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' },
        payload: JSON.stringify({ role: 'owner', password: 'short' })
      }))
      assert.ok(patch['/role'] !== undefined && patch['/password'] === 'is shorter than 8 characters', JSON.stringify(patch))
      // A password the schema itself refuses is reported once, by the schema.
      const untyped = await post({ username: uniqueName(), email: 'not-an-address', password: 12345 })
      assert.deepEqual((untyped.json().errors as Array<{ pointer: string }>).filter(e => e.pointer === '/password').length, 1)
      // Nothing was created by any of these.
      const found = await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })
      assert.deepEqual(found.json(), [])
    })

    it('rejects a duplicate username ignoring case with 409 username_taken', async () => {
      const username = uniqueName('Case')
      assert.equal((await post({ username })).statusCode, 201)
      const res = await post({ username: username.toUpperCase() })
      assert.equal(res.statusCode, 409)
      assert.equal(res.json().code, 'username_taken')
    })

    it('rejects a duplicate email ignoring case with 409 email_taken', async () => {
      const email = `${uniqueName()}@example.com`
      assert.equal((await post({ username: uniqueName(), email })).statusCode, 201)
      const res = await post({ username: uniqueName(), email: email.toUpperCase() })
      assert.equal(res.statusCode, 409)
      assert.equal(res.json().code, 'email_taken')
    })

    it('gives exactly one 201 and one 409 for two concurrent creates of one name', async () => {
      const username = uniqueName('race')
      const results = await Promise.all([post({ username, password: GOOD_PASSWORD }), post({ username: username.toUpperCase(), password: GOOD_PASSWORD })])
      assert.deepEqual(results.map(r => r.statusCode).sort(), [201, 409])
      assert.equal(results.find(r => r.statusCode === 409)!.json().code, 'username_taken')
    })

    it('gets a user by the id from the list, with its ETag', async () => {
      const username = uniqueName()
      await post({ username })
      const list = await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })
      const [listed] = list.json()
      const res = await t.app.inject({ url: `/auth/api/users/${listed.id}`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200)
      assert.deepEqual(res.json(), listed)
      assert.equal(res.headers.etag, '"1"')
    })

    it('answers 404 user_not_found for an unknown id and 422 for a malformed one', async () => {
      const missing = await t.app.inject({ url: '/auth/api/users/01900000-0000-7000-8000-000000000000', headers: auth(t.adminKey) })
      assert.equal(missing.statusCode, 404)
      assert.equal(missing.json().code, 'user_not_found')
      const malformed = await t.app.inject({ url: '/auth/api/users/not-a-uuid', headers: auth(t.adminKey) })
      assert.equal(malformed.statusCode, 422)
      assert.equal(malformed.json().errors[0].in, 'path')
    })

    it('patches with merge-patch semantics: set, clear with null, keep absent', async () => {
      const created = (await post({ username: uniqueName(), email: `${uniqueName()}@example.com`, first_name: 'Old', last_name: 'Name' })).json()
      const res = await t.app.inject({
        method: 'PATCH',
        url: `/auth/api/users/${created.id}`,
        headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' },
        payload: JSON.stringify({ first_name: 'New', email: null, groups: ['a'] })
      })
      assert.equal(res.statusCode, 200, res.body)
      const user = res.json()
      assert.equal(user.first_name, 'New')
      assert.equal(user.email, null)
      assert.equal(user.last_name, 'Name')
      assert.deepEqual(user.groups, ['a'])
      assert.equal(res.headers.etag, '"2"')
      assert.ok(user.updated_at > created.updated_at || user.updated_at === created.updated_at)
    })

    it('answers a patch that changes nothing with the same version and no event', async () => {
      const created = await post({ username: uniqueName(), first_name: 'Same' })
      const id = created.json().id
      const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: auth(t.adminKey), payload: { first_name: 'Same' } })
      assert.equal(res.statusCode, 200)
      assert.equal(res.headers.etag, created.headers.etag)
      assert.deepEqual(res.json(), created.json())
      const events = (await t.app.inject({ url: `/auth/api/events?target_id=${id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(events.map((e: { type: string }) => e.type), ['user.created'])
    })

    it('rejects read-only fields and null for required fields in a patch with 422, leaving the row unchanged', async () => {
      const created = (await post({ username: uniqueName() })).json()
      for (const payload of [{ id: created.id }, { created_at: '2020-01-01T00:00:00Z' }, { username: null }, { role: null }, { password_hash: 'x' }]) {
        const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${created.id}`, headers: auth(t.adminKey), payload })
        assert.equal(res.statusCode, 422, JSON.stringify(payload))
      }
      const after = await t.app.inject({ url: `/auth/api/users/${created.id}`, headers: auth(t.adminKey) })
      assert.deepEqual(after.json(), created)
    })

    it('refuses a stale If-Match with 412 and accepts the current one', async () => {
      const created = await post({ username: uniqueName() })
      const id = created.json().id
      const first = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'if-match': created.headers.etag as string }, payload: { first_name: 'A' } })
      assert.equal(first.statusCode, 200)
      const stale = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'if-match': created.headers.etag as string }, payload: { first_name: 'B' } })
      assert.equal(stale.statusCode, 412)
      assert.equal(stale.json().code, 'precondition_failed')
      const staleDelete = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'if-match': '"1"' } })
      assert.equal(staleDelete.statusCode, 412)
      const current = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'if-match': first.headers.etag as string } })
      assert.equal(current.statusCode, 204)
    })

    it('deletes a user by the id taken from the list, then 404s', async () => {
      const username = uniqueName()
      await post({ username })
      const [listed] = (await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).json().filter((u: { username: string }) => u.username === username)
      const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${listed.id}`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 204)
      assert.equal(res.body, '')
      const again = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${listed.id}`, headers: auth(t.adminKey) })
      assert.equal(again.statusCode, 404)
      assert.equal(again.json().code, 'user_not_found')
    })

    it('serves the 3.6.1 paths with the same handlers and deprecation headers', async () => {
      const username = uniqueName('legacy')
      const created = await t.app.inject({ method: 'POST', url: '/auth/users', headers: auth(t.adminKey), payload: { username } })
      assert.equal(created.statusCode, 201)
      const id = created.json().id
      assert.equal(created.headers.location, `/auth/users/${id}`)
      assert.match(created.headers.deprecation as string, /^@\d+$/)
      assert.ok(!Number.isNaN(Date.parse(created.headers.sunset as string)))
      assert.equal(created.headers.link, '</auth/api/users>; rel="successor-version"')
      const list = await t.app.inject({ url: '/auth/users', headers: auth(t.adminKey) })
      assert.ok(list.json().some((u: { id: string }) => u.id === id))
      const got = await t.app.inject({ url: `/auth/users/${id}`, headers: auth(t.adminKey) })
      assert.equal(got.headers.link, `</auth/api/users/${id}>; rel="successor-version"`)
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/users/${id}`, headers: auth(t.adminKey), payload: { last_name: 'L' } })
      assert.equal(patched.json().last_name, 'L')
      const deleted = await t.app.inject({ method: 'DELETE', url: `/auth/users/${id}`, headers: auth(t.adminKey) })
      assert.equal(deleted.statusCode, 204)
      const current = await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
      assert.equal(current.statusCode, 404)
      assert.equal(current.headers.deprecation, undefined)
    })

    it('rejects a body type the operation does not take with 415', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'text/plain' }, payload: 'username=x' })
      assert.equal(res.statusCode, 415)
      assert.equal(res.json().code, 'unsupported_media_type')
      const created = (await post({ username: uniqueName() })).json()
      const form = await t.app.inject({
        method: 'PATCH',
        url: `/auth/api/users/${created.id}`,
        headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' },
        payload: 'first_name=x'
      })
      assert.equal(form.statusCode, 415)
    })
  })

  describe(`listing users (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const names: string[] = []

    it('sets up 25 users', async () => {
      for (let i = 0; i < 25; i++) {
        const username = `list${String(i).padStart(2, '0')}`
        names.push(username)
        const res = await t.app.inject({
          method: 'POST',
          url: '/auth/api/users',
          headers: auth(t.adminKey),
          payload: {
            username,
            email: `${username}@example.com`,
            first_name: i % 5 === 0 ? 'Fifth' : 'Other',
            role: i === 3 ? 'admin' : 'user',
            groups: i % 2 === 0 ? ['even'] : ['odd'],
            disabled: i === 7
          }
        })
        assert.equal(res.statusCode, 201)
      }
    })

    it('returns every user with no parameters (seed rule 1)', async () => {
      const res = await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200)
      assert.match(res.headers['content-type'] as string, /^application\/json/)
      const users = res.json()
      assert.equal(users.length, 25)
      assert.deepEqual(users.map((u: { username: string }) => u.username), names)
    })

    it('pages with limit and an opaque cursor in Link rel="next", seeing each user once', async () => {
      const seen: string[] = []
      let url: string | undefined = '/auth/api/users?limit=10&API_KEY=' + t.adminKey
      let pages = 0
      while (url !== undefined) {
        const res: LightMyRequestResponse = await t.app.inject({ url })
        assert.equal(res.statusCode, 200, res.body)
        seen.push(...res.json().map((u: { username: string }) => u.username))
        const link = res.headers.link as string | undefined
        assert.ok(link === undefined || !link.includes('API_KEY'), 'the Link header must not repeat a credential')
        url = link !== undefined ? /^<([^>]+)>; rel="next"$/.exec(link)![1] + '&API_KEY=' + t.adminKey : undefined
        pages++
      }
      assert.equal(pages, 3)
      assert.deepEqual(seen, names)
    })

    it('sorts by username descending and pages consistently', async () => {
      const first = await t.app.inject({ url: '/auth/api/users?limit=20&sort=-username', headers: auth(t.adminKey) })
      const next = /^<([^>]+)>; rel="next"$/.exec(first.headers.link as string)![1]!
      const second = await t.app.inject({ url: next, headers: auth(t.adminKey) })
      const all = [...first.json(), ...second.json()].map((u: { username: string }) => u.username)
      assert.deepEqual(all, [...names].reverse())
    })

    it('filters by q, role, group, disabled, username and email', async () => {
      const get = async (query: string) => (await t.app.inject({ url: `/auth/api/users?${query}`, headers: auth(t.adminKey) })).json().map((u: { username: string }) => u.username)
      assert.deepEqual(await get('q=FIFTH'), ['list00', 'list05', 'list10', 'list15', 'list20'])
      assert.deepEqual(await get('q=list1'), names.filter(n => n.startsWith('list1')))
      assert.deepEqual(await get('role=admin'), ['list03'])
      assert.deepEqual(await get('disabled=true'), ['list07'])
      assert.equal((await get('group=even')).length, 13)
      assert.deepEqual(await get('username=LIST04'), ['list04'])
      assert.deepEqual(await get('email=List04@Example.com'), ['list04'])
      assert.deepEqual(await get('q=%25'), [], 'LIKE wildcards in q are literal')
      assert.deepEqual(await get('group=odd&role=user&limit=3'), ['list01', 'list05', 'list07'])
    })

    it('pages correctly when names contain the text that separates users in the JSON', async () => {
      const tricky = [',{"id":"x', ', {"id" : "y', '"}]', '\\",{\\"id\\":\\"']
      const ids: string[] = []
      for (const [i, name] of tricky.entries()) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: `tricky${i}`, first_name: name, last_name: name, groups: ['tricky'] } })
        assert.equal(res.statusCode, 201, res.body)
        ids.push(res.json().id)
      }
      const seen: Array<{ id: string, first_name: string }> = []
      let url: string | undefined = '/auth/api/users?group=tricky&limit=1'
      while (url !== undefined) {
        const res: LightMyRequestResponse = await t.app.inject({ url, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 200, res.body)
        seen.push(...res.json())
        const link = res.headers.link as string | undefined
        url = link !== undefined ? /^<([^>]+)>/.exec(link)![1] : undefined
      }
      assert.deepEqual(seen.map(u => u.id), ids)
      assert.deepEqual(seen.map(u => u.first_name), tricky)
    })

    it('rejects a tampered cursor, an unknown parameter and an out-of-range limit with 422', async () => {
      for (const query of ['limit=10&cursor=bm9wZQ', 'limit=0', 'limit=1001', 'limt=5', 'sort=password']) {
        const res = await t.app.inject({ url: `/auth/api/users?${query}`, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 422, query)
      }
      const cursorForOtherSort = /cursor=([^&>]+)/.exec((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) })).headers.link as string)![1]
      const res = await t.app.inject({ url: `/auth/api/users?limit=1&sort=username&cursor=${cursorForOtherSort}`, headers: auth(t.adminKey) })
      assert.equal(res.json().code, 'invalid_cursor')
    })

    it('streams a list longer than one internal batch without losing or repeating a user', async () => {
      const many = 1200
      const start = Date.now()
      await t.app.db.transaction().execute(async trx => {
        for (let i = 0; i < many; i++) {
          const username = `bulk${String(i).padStart(5, '0')}`
          await trx.insertInto('users').values({
            id: `01900000-0000-7000-8000-${String(i).padStart(12, '0')}`,
            username,
            username_key: username,
            email: null,
            email_key: null,
            first_name: null,
            last_name: null,
            role: 'user',
            groups: '[]',
            disabled: false,
            password_hash: null,
            version: 1,
            created_at: new Date(start - (many - i) * 1000).toISOString(),
            updated_at: new Date(start).toISOString(),
            last_login_at: null,
            password_changed_at: null
          }).execute()
        }
      })
      const res = await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })
      const users = res.json()
      assert.equal(users.length, many + 29)
      assert.equal(new Set(users.map((u: { id: string }) => u.id)).size, many + 29)
      assert.equal(users[0].username, 'bulk00000')
    })
  })

  describe(`listing users beyond ASCII (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('sends pages of users with names beyond ASCII byte for byte as Get User answers them, in every sort order and page size', async () => {
      // Two, three and four bytes in UTF-8 (a surrogate pair in JavaScript): SQLite's pages go out as the database's bytes, PostgreSQL's as text.
      const names = ['Zoë', 'Ünal ☃', 'Łucja 𝄞', '李 雷', 'Ana 😀']
      const ids: string[] = []
      for (const [i, name] of names.entries()) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: `utf${i}`, first_name: name, last_name: name, groups: ['utf', name] } })
        assert.equal(res.statusCode, 201, res.body)
        ids.push(res.json().id)
      }
      const single = new Map<string, Buffer>()
      for (const id of ids) {
        const res = await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 200, res.body)
        single.set(id, res.rawPayload)
      }
      for (const sort of ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at']) {
        for (const limit of [1, 2, 50]) {
          let url: string | undefined = `/auth/api/users?group=utf&sort=${sort}&limit=${limit}`
          const seen: string[] = []
          while (url !== undefined) {
            const res: LightMyRequestResponse = await t.app.inject({ url, headers: auth(t.adminKey) })
            assert.equal(res.statusCode, 200, res.body)
            const listed = (res.json() as Array<{ id: string }>).map(user => user.id)
            const expected = Buffer.concat([Buffer.from('['), ...listed.flatMap((id, k) => [...k > 0 ? [Buffer.from(',')] : [], single.get(id)!]), Buffer.from(']')])
            assert.deepEqual(res.rawPayload, expected, `${sort}, limit ${limit}`)
            assert.equal(Number(res.headers['content-length']), expected.length)
            seen.push(...listed)
            const link = res.headers.link as string | undefined
            url = link !== undefined ? /^<([^>]+)>/.exec(link)![1] : undefined
          }
          assert.deepEqual([...seen].sort(), [...ids].sort(), `${sort}, limit ${limit}`)
        }
      }
    })
  })
}
