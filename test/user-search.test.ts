import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import fc from 'fast-check'
import { sql } from 'kysely'
import { auth, dialects, useTestApp } from './helpers.ts'
import type { TestApp } from './helpers.ts'

/**
 * `q=` is answered through trigram indexes (migration 0016): FTS5 on SQLite,
 * pg_trgm on PostgreSQL. Whatever the index, the answer must be exactly a
 * case-insensitive substring match over username, email, first and last
 * name, as the plain scan gave, page after page.
 *
 * The names mix letters in both cases with LIKE's wildcards and escape, quotes
 * (FTS5's phrase syntax), spaces and characters of two and three bytes. Only
 * lower-case non-ASCII letters: SQLite's lower() folds ASCII alone and
 * PostgreSQL's the whole of Unicode, a difference older than the indexes
 * (docs/users.md).
 */
const ALPHABET = ['a', 'b', 'c', 'A', 'B', 'C', '%', '_', '\\', ' ', '"', '\'', 'é', '日', '*', '-']
const text = (maxLength: number, minLength = 0): fc.Arbitrary<string> =>
  fc.array(fc.constantFrom(...ALPHABET), { minLength, maxLength }).map(chars => chars.join(''))
const USERNAME_CHARS = ['a', 'b', 'c', 'A', 'B', 'C', '.', '_', '-', '@', '1']

interface Person { id: string, username: string, email: string | null, first_name: string | null, last_name: string | null, role: string, groups: string[], disabled: boolean }

const person = fc.record({
  tail: fc.array(fc.constantFrom(...USERNAME_CHARS), { minLength: 0, maxLength: 6 }).map(c => c.join('')),
  email: fc.option(fc.array(fc.constantFrom('a', 'b', 'c', 'A', 'B', '_', '%'), { minLength: 0, maxLength: 5 }).map(c => `x${c.join('')}x`), { nil: null }),
  first_name: fc.option(text(8), { nil: null }),
  last_name: fc.option(text(8), { nil: null }),
  role: fc.constantFrom('user', 'admin'),
  groups: fc.subarray(['searchers', 'finders']),
  disabled: fc.boolean()
})

/** What the search means, computed here: any of the four fields, lower-cased, contains the lower-cased needle. */
function matches (user: Person, q: string): boolean {
  const needle = q.toLowerCase()
  return [user.username, user.email, user.first_name, user.last_name].some(field => field !== null && field.toLowerCase().includes(needle))
}

async function listAll (t: TestApp, query: string, limit = 7): Promise<string[]> {
  const ids: string[] = []
  let url: string | undefined = `/auth/api/users?limit=${limit}&${query}`
  for (let pages = 0; url !== undefined; pages++) {
    assert.ok(pages < 1000, 'paging ends')
    const res: LightMyRequestResponse = await t.app.inject({ url, headers: auth(t.adminKey) })
    assert.equal(res.statusCode, 200, res.body)
    ids.push(...res.json().map((u: { id: string }) => u.id))
    const link = res.headers.link as string | undefined
    const next: string | undefined = link !== undefined ? /^<([^>]+)>; rel="next"$/.exec(link)![1] : undefined
    url = next
  }
  return ids
}

for (const dialect of dialects()) {
  describe(`users search by q (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const people = new Map<string, Person>()
    let serial = 0

    it('returns exactly the users whose username, email or names contain the text, ignoring case, in every sort, filter and page', async () => {
      const sort = fc.constantFrom('created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at')
      // A needle from the alphabet, or a piece of a name already there (so that long needles find someone too).
      const needle = fc.oneof(text(5, 1), fc.tuple(fc.nat(), fc.nat(), fc.integer({ min: 1, max: 6 })).map(([which, start, length]) => {
        const names = [...people.values()].flatMap(p => [p.username, p.email, p.first_name, p.last_name]).filter((n): n is string => n !== null && n !== '')
        if (names.length === 0) return 'abc'
        const name = [...names[which % names.length]!]
        const from = start % name.length
        return name.slice(from, from + length).join('') || 'a'
      }))
      const change = fc.record({ which: fc.nat(), first_name: fc.option(text(8), { nil: null }), remove: fc.boolean() })

      // The users pile up from run to run, so a shrunk case would not replay alone: the first failure is reported as it was.
      // The other filters narrow a search: on PostgreSQL they are applied to the trigram indexes' candidates (users.repository.ts).
      const filters = fc.record({
        role: fc.option(fc.constantFrom('user', 'admin'), { nil: undefined }),
        group: fc.option(fc.constantFrom('searchers', 'finders'), { nil: undefined }),
        disabled: fc.option(fc.boolean(), { nil: undefined })
      })
      await fc.assert(fc.asyncProperty(fc.array(person, { maxLength: 6 }), fc.option(change, { nil: undefined }), needle, sort, filters,
        async (newcomers, edit, q, order, filter) => {
          for (const p of newcomers) {
            serial += 1
            const username = `s${serial}z${p.tail}`
            const res = await t.app.inject({
              method: 'POST',
              url: '/auth/api/users',
              headers: auth(t.adminKey),
              payload: { username, email: p.email === null ? null : `${p.email}${serial}@Example.COM`, first_name: p.first_name, last_name: p.last_name, role: p.role, groups: p.groups, disabled: p.disabled }
            })
            assert.equal(res.statusCode, 201, res.body)
            const created = res.json() as Person
            people.set(created.id, created)
          }
          // Renames and deletions must reach the index too (SQLite keeps it by trigger).
          if (edit !== undefined && people.size > 0) {
            const target = [...people.values()][edit.which % people.size]!
            // Only users are deleted: the last admin may not be.
            if (edit.remove && target.role === 'user') {
              const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${target.id}`, headers: auth(t.adminKey) })
              assert.equal(res.statusCode, 204, res.body)
              people.delete(target.id)
            } else if (!edit.remove) {
              const res = await t.app.inject({
                method: 'PATCH',
                url: `/auth/api/users/${target.id}`,
                headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' },
                payload: { first_name: edit.first_name }
              })
              assert.equal(res.statusCode, 200, res.body)
              people.set(target.id, res.json() as Person)
            }
          }
          const filterQuery = Object.entries(filter).filter(([, value]) => value !== undefined).map(([name, value]) => `&${name}=${String(value)}`).join('')
          // The same list unsearched, in the same order, with the matching users kept: the order and paging must agree too.
          const everyone = await listAll(t, `sort=${order}${filterQuery}`)
          const expected = everyone.filter(id => people.has(id) && matches(people.get(id)!, q))
          const found = await listAll(t, `sort=${order}${filterQuery}&q=${encodeURIComponent(q)}`)
          assert.deepEqual(found, expected, `q=${JSON.stringify(q)} sort=${order}${filterQuery}`)
        }), { numRuns: 120, endOnFailure: true, includeErrorInReport: true })
    })

    it('pages a needle thousands of users hold exactly as one few hold (SQLite walks the sort order past 2,000 candidates)', async () => {
      const stem = `many${Date.now().toString(36)}`
      for (let batch = 0; batch < 3; batch++) {
        const users = Array.from({ length: 1000 }, (_, i) => ({ username: `${stem}_${batch}_${i}`, last_name: i % 4 === 0 ? 'Rare' : 'Ubiquitous' }))
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { atomic: true, users } })
        assert.equal(res.statusCode, 200, res.body.slice(0, 500))
      }
      for (const order of ['created_at', '-username']) {
        const everyone = await listAll(t, `sort=${order}`, 1000)
        const page = async (id: string): Promise<{ username: string, last_name: string | null }> => (await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()
        const found = await listAll(t, `sort=${order}&q=UBIQUIT`, 100)
        assert.equal(found.length, 2250)
        // Those found are in the list's order, and are the ones holding it.
        const positions = found.map(id => everyone.indexOf(id))
        assert.deepEqual(positions, [...positions].sort((a, b) => a - b))
        for (const id of [found[0]!, found[1124]!, found[2249]!]) assert.equal((await page(id)).last_name, 'Ubiquitous')
      }
    })
  })
}

for (const dialect of dialects()) {
  describe(`users search by q, once the database knows which trigrams are common (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('finds exactly the users holding a needle whether its trigrams are common, rare or both', async () => {
      // 300 users whose names share most of their trigrams (`tal`…`ow0` in all of them, `w01` in a third,
      // `mossley` in nine in ten), so that ANALYZE counts those as common (PostgreSQL, migration 0022):
      // a needle is then asked of the indexes by its rare part only, or not at all when it has none.
      const users = Array.from({ length: 300 }, (_, i) => ({
        username: `Tallow${String(i).padStart(4, '0')}`,
        email: i % 3 === 0 ? `t${i}@tallow.example` : null,
        last_name: i % 10 === 0 ? 'Quarrington' : 'Mossley'
      }))
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { atomic: true, users } })
      assert.equal(res.statusCode, 200, res.body.slice(0, 500))
      await sql`analyze users`.execute(t.app.db)
      const people = new Map<string, Person>()
      for (const order of ['created_at', '-username']) {
        const everyone = await listAll(t, `sort=${order}`, 100)
        for (const id of everyone) {
          if (!people.has(id)) people.set(id, (await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json())
        }
        for (const q of ['low0123', 'LOW012', 'tallow01', 'allow02', 'mossley', 'ossle', 'quarrington', 'rington', 'w0299', 'tallow.example', '@tallow', 'ow0', 'zzz', 'low0 12']) {
          const expected = everyone.filter(id => matches(people.get(id)!, q))
          const found = await listAll(t, `sort=${order}&q=${encodeURIComponent(q)}`, 7)
          assert.deepEqual(found, expected, `q=${q} sort=${order}`)
          assert.ok(q === 'zzz' || q === 'low0 12' || found.length > 0, `q=${q} finds someone`)
        }
      }
    })
  })
}
