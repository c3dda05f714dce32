import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { CompiledQuery } from 'kysely'
import { listEventsQuery } from '../src/events/events.repository.ts'
import { newId } from '../src/lib/ids.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

for (const dialect of dialects()) {
  describe(`events (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const events = async (query = '') => (await t.app.inject({ url: `/auth/api/events?${query}`, headers: auth(t.adminKey) })).json()

    it('records create, update and delete with actor, target, request id, client address and changes', async () => {
      const username = uniqueName()
      const created = await t.app.inject({
        method: 'POST',
        url: '/auth/api/users',
        headers: { ...auth(t.adminKey), 'x-request-id': 'req-create-1' },
        payload: { username, password: GOOD_PASSWORD, email: `${username}@example.com` }
      })
      const user = created.json()
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { first_name: 'New', password: 'another long passphrase' } })
      await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })

      const log = await events(`target_id=${user.id}`)
      assert.deepEqual(log.map((e: { type: string }) => e.type), ['user.deleted', 'user.updated', 'user.created'])
      const [deleted, updated, createdEvent] = log
      assert.equal(createdEvent.request_id, 'req-create-1')
      assert.equal(created.headers['x-request-id'], 'req-create-1')
      assert.equal(createdEvent.actor.type, 'api_key')
      assert.match(createdEvent.actor.id, /^[0-9a-f-]{36}$/)
      assert.deepEqual(createdEvent.target, { type: 'user', id: user.id })
      assert.equal(createdEvent.client_ip, '127.0.0.1')
      assert.equal(createdEvent.data.username, username)
      assert.equal(createdEvent.data.password, '[redacted]')
      assert.deepEqual(updated.data.changes.first_name, { from: null, to: 'New' })
      assert.equal(updated.data.changes.password, '[redacted]')
      assert.equal(deleted.data.username, username)
      const everything = JSON.stringify(log)
      assert.ok(!everything.includes(GOOD_PASSWORD) && !everything.includes('another long passphrase') && !everything.includes('argon2'))
    })

    it('writes no event when the change fails, and no change without its event', async () => {
      const before = (await events('limit=1000')).length
      const username = uniqueName()
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })).statusCode, 201)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })).statusCode, 409)
      assert.equal((await events('limit=1000')).length, before + 1)

      // Make the event insert fail inside the transaction: the user insert must roll back with it.
      await t.app.db.schema.alterTable('events').renameTo('events_away').execute()
      try {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: 'orphan_attempt' } })
        assert.equal(res.statusCode, 500)
        assert.ok(!res.body.includes('events'), 'a 5xx never leaks internals')
      } finally {
        await t.app.db.schema.alterTable('events_away').renameTo('events').execute()
      }
      const orphan = await t.app.inject({ url: '/auth/api/users?username=orphan_attempt', headers: auth(t.adminKey) })
      assert.deepEqual(orphan.json(), [])
    })

    it('records key creation, rotation and revocation without the secret', async () => {
      const key = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'ev' } })).json()
      const rotated = (await t.app.inject({ method: 'POST', url: `/auth/api/api-keys/${key.id}/rotate`, headers: auth(t.adminKey) })).json()
      await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })
      const log = await events(`target_id=${key.id}`)
      assert.deepEqual(log.map((e: { type: string }) => e.type), ['api_key.revoked', 'api_key.rotated', 'api_key.created'])
      const text = JSON.stringify(log)
      assert.ok(!text.includes(key.key) && !text.includes(rotated.key))
    })

    it('filters by type, actor and time, and pages newest first with a cursor', async () => {
      for (let i = 0; i < 5; i++) {
        await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('page') } })
      }
      const all = await events('type=user.created&limit=1000')
      assert.ok(all.length >= 5)
      assert.ok(all.every((e: { type: string }) => e.type === 'user.created'))
      const ids = all.map((e: { id: string }) => e.id)
      assert.deepEqual(ids, [...ids].sort().reverse(), 'newest first')

      const paged: string[] = []
      let url: string | undefined = '/auth/api/events?type=user.created&limit=2'
      while (url !== undefined) {
        const res: { json: () => Array<{ id: string }>, headers: Record<string, unknown> } = await t.app.inject({ url, headers: auth(t.adminKey) })
        paged.push(...res.json().map(e => e.id))
        const link = res.headers.link as string | undefined
        url = link !== undefined ? /^<([^>]+)>/.exec(link)![1] : undefined
      }
      assert.deepEqual(paged, ids)

      const actor = all[0].actor.id
      assert.ok((await events(`actor_id=${actor}`)).length >= 5)
      assert.deepEqual(await events('since=2999-01-01T00:00:00Z'), [])
      assert.ok((await events('until=2999-01-01T00:00:00Z&limit=1')).length === 1)
    })

    it('reads a time range far back in a long log through the occurred_at index, and pages it', async () => {
      // An app of its own: 20,000 events would crowd the other tests' pages.
      const own = await createTestApp(dialect)
      try {
        const start = Date.parse('2020-01-01T00:00:00Z')
        const rows = Array.from({ length: 20_000 }, (_, i) => ({
          id: newId(), type: 'user.updated', occurred_at: new Date(start + i * 60_000).toISOString(), actor_type: 'system', actor_id: null, target_type: null, target_id: null, request_id: null, client_ip: null, data: '{}'
        }))
        for (let i = 0; i < rows.length; i += 500) await own.app.db.insertInto('events').values(rows.slice(i, i + 500)).execute()
        await own.app.db.executeQuery(CompiledQuery.raw('analyze'))

        // The first day: 1,440 events, the oldest of the log.
        const range = { since: '2020-01-01T00:00:00Z', until: '2020-01-02T00:00:00Z' }
        const query = listEventsQuery(own.app.db, range, 100, undefined).compile()
        const explain = dialect.name === 'sqlite' ? 'explain query plan ' : 'explain '
        const plan = (await own.app.db.executeQuery(CompiledQuery.raw(explain + query.sql, [...query.parameters]))).rows
        assert.match(JSON.stringify(plan), /events_occurred_at_idx/, JSON.stringify(plan))

        const seen: string[] = []
        let url: string | undefined = `/auth/api/events?since=${range.since}&until=${range.until}&limit=1000`
        while (url !== undefined) {
          const res: { json: () => Array<{ occurred_at: string }>, headers: Record<string, unknown> } = await own.app.inject({ url, headers: auth(own.adminKey) })
          seen.push(...res.json().map(e => e.occurred_at))
          const link = res.headers.link as string | undefined
          url = link !== undefined ? /^<([^>]+)>/.exec(link)![1] : undefined
        }
        assert.equal(seen.length, 1440)
        assert.deepEqual(seen, rows.slice(0, 1440).map(r => r.occurred_at).reverse(), 'every event of the range once, newest first')
        const ranged = await own.app.inject({ url: `/auth/api/events?since=${range.since}&limit=1`, headers: auth(own.adminKey) })
        const cursor = /cursor=([^>&]+)/.exec(String(ranged.headers.link))![1]!
        const mixed = await own.app.inject({ url: `/auth/api/events?cursor=${cursor}`, headers: auth(own.adminKey) })
        assert.equal(mixed.statusCode, 422)
        assert.equal(mixed.json().code, 'invalid_cursor')
      } finally {
        await own.app.close()
      }
    })

    it('rejects an unknown filter with 422 rather than ignoring it', async () => {
      const res = await t.app.inject({ url: '/auth/api/events?typ=user.created', headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 422)
      assert.equal(res.json().errors[0].pointer, '/typ')
    })

    it('has no operation that edits or deletes an event', async () => {
      const [latest] = await events('limit=1')
      for (const method of ['PATCH', 'PUT', 'DELETE'] as const) {
        const res = await t.app.inject({ method, url: `/auth/api/events/${latest.id}`, headers: auth(t.adminKey) })
        assert.equal(res.statusCode, 404)
      }
    })
  })
}
