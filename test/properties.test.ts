import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import fc from 'fast-check'
import { sql } from 'kysely'
import { auth, dialects, useTestApp } from './helpers.ts'

const PROBLEM_KEYS = ['code', 'detail', 'request_id', 'status', 'title', 'type']

/** Field names the API knows, mixed with ones it does not, so generated bodies hit both paths. */
const fieldName = fc.oneof(
  fc.constantFrom('username', 'email', 'password', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'id', 'created_at', 'password_hash'),
  fc.string({ maxLength: 12 })
)
const value = fc.oneof(
  fc.string({ maxLength: 80 }),
  fc.constantFrom('admin', 'user', 'a@b.co', 'correct horse battery staple', ''),
  fc.integer(), fc.boolean(), fc.constant(null),
  fc.array(fc.string({ maxLength: 10 }), { maxLength: 4 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.string({ maxLength: 5 }), { maxKeys: 3 })
)
const body = fc.dictionary(fieldName, value, { maxKeys: 6 })

for (const dialect of dialects().slice(0, 1)) {
  describe(`arbitrary request bodies (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('never answer with a 5xx, and every error is a well-formed problem', async () => {
      const target = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: 'prop_target' } })).json()
      await fc.assert(fc.asyncProperty(body, fc.constantFrom('POST', 'PATCH'), async (payload, method) => {
        const res = await t.app.inject({
          method,
          url: method === 'POST' ? '/auth/api/users' : `/auth/api/users/${target.id}`,
          headers: { ...auth(t.adminKey), 'content-type': 'application/json' },
          payload: JSON.stringify(payload)
        })
        assert.ok(res.statusCode < 500, `${res.statusCode} for ${JSON.stringify(payload)}: ${res.body}`)
        if (res.statusCode >= 400) {
          assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
          const problem = res.json()
          for (const key of PROBLEM_KEYS) assert.ok(key in problem, `problem lacks ${key}`)
          assert.equal(problem.status, res.statusCode)
        } else {
          const user = res.json()
          assert.ok(!('password' in user) && !('password_hash' in user))
        }
      }), { numRuns: 300 })
    })

    it('never lets a mass-assigned read-only field reach the row', async () => {
      await fc.assert(fc.asyncProperty(fc.constantFrom('id', 'created_at', 'updated_at', 'password_hash', 'version', 'username_key'), fc.string({ maxLength: 20 }), async (field, junk) => {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: 'mass_assign', [field]: junk } })
        assert.equal(res.statusCode, 422)
        assert.ok(res.json().errors.some((e: { pointer: string }) => e.pointer === `/${field}`))
      }), { numRuns: 50 })
      assert.deepEqual((await t.app.inject({ url: '/auth/api/users?username=mass_assign', headers: auth(t.adminKey) })).json(), [])
    })
  })
}

for (const dialect of dialects()) {
  describe(`the list page, rendered by the database from each user's stored JSON (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('renders every user exactly as Get User does, whatever the text in it', async () => {
      const text = fc.string({ unit: 'binary', maxLength: 40 }).filter(s => !s.includes('\u0000'))
      await fc.assert(fc.asyncProperty(text, text, fc.array(fc.string({ unit: 'grapheme', minLength: 1, maxLength: 8 }), { maxLength: 3 }), fc.boolean(),
        async (first, last, groups, disabled) => {
          const created = await t.app.inject({
            method: 'POST',
            url: '/auth/api/users',
            headers: auth(t.adminKey),
            payload: { username: `p${Math.random().toString(36).slice(2, 12)}`, first_name: first, last_name: last, groups: [...new Set(groups)], disabled }
          })
          assert.equal(created.statusCode, 201, created.body)
          const user = created.json()
          const listed = await t.app.inject({ url: `/auth/api/users?username=${user.username}&limit=5`, headers: auth(t.adminKey) })
          assert.deepEqual(listed.json(), [user])
          const got = await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
          assert.deepEqual(got.json(), user)
        }), { numRuns: 60 })
    })
  })
}

for (const dialect of dialects().filter(d => d.name === 'postgres')) {
  describe('timestamps read from PostgreSQL', () => {
    const t = useTestApp(dialect)

    it('arrive as the toISOString() text JavaScript wrote, for any instant with milliseconds', async () => {
      const instant = fc.date({ min: new Date('0001-01-01T00:00:00.000Z'), max: new Date('9999-12-31T23:59:59.999Z'), noInvalidDate: true })
      await fc.assert(fc.asyncProperty(fc.array(instant, { minLength: 1, maxLength: 50 }), async (dates) => {
        const written = dates.map(d => d.toISOString())
        const { rows } = await sql<{ t: string }>`select w::timestamptz as t from unnest(${written}::text[]) with ordinality as x(w, n) order by n`.execute(t.app.db)
        assert.deepEqual(rows.map(r => r.t), written)
      }), { numRuns: 60 })
    })

    it('arrive right from a session in another time zone too (a pooler that drops the UTC setting)', async () => {
      for (const zone of ['Asia/Kolkata', 'America/St_Johns', 'Europe/Berlin']) {
        const got = await t.app.db.transaction().execute(async trx => {
          await sql`select set_config('TimeZone', ${zone}, true)`.execute(trx)
          return (await sql<{ t: string }>`select '2024-07-01T12:34:56.789Z'::timestamptz as t`.execute(trx)).rows[0]!.t
        })
        assert.equal(got, '2024-07-01T12:34:56.789Z', zone)
      }
    })

    it('keep microseconds PostgreSQL made itself to the millisecond, like Date would', async () => {
      const { rows } = await sql<{ t: string }>`select '2024-02-29 23:59:59.123456+00'::timestamptz as t`.execute(t.app.db)
      assert.equal(rows[0]!.t, '2024-02-29T23:59:59.123Z')
    })

    it('are listed exactly as Get User shows them, from the stored rendering (migration 0021), for any instant', async () => {
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: `ts${Math.random().toString(36).slice(2, 12)}` } })
      assert.equal(created.statusCode, 201, created.body)
      const { id, username } = created.json() as { id: string, username: string }
      const instant = fc.date({ min: new Date('0001-01-01T00:00:00.000Z'), max: new Date('9999-12-31T23:59:59.999Z'), noInvalidDate: true })
      await fc.assert(fc.asyncProperty(instant, fc.integer({ min: 0, max: 999 }), async (date, micros) => {
        // Microseconds too, as PostgreSQL's own now() writes them: both sides must cut them to the millisecond.
        await sql`update users set last_login_at = ${date.toISOString()}::timestamptz + make_interval(secs => ${micros} / 1000000.0) where id = ${id}`.execute(t.app.db)
        const listed = await t.app.inject({ url: `/auth/api/users?username=${username}&limit=1`, headers: auth(t.adminKey) })
        const got = await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
        assert.equal(listed.body, `[${JSON.stringify(got.json())}]`)
        assert.equal((got.json() as { last_login_at: string }).last_login_at, date.toISOString())
      }), { numRuns: 60 })
    })
  })
}
