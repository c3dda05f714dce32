/**
 * Role-CLI runs in the audit trail (ASVS 16.3.2, security-checks L2★):
 * `gatehouse db-user` and `users create|delete --db-user` report a role they
 * created or dropped in the service's database, and gatehouse records it as
 * an event whose actor is the reporting key. The CLI's side, against a real
 * PostgreSQL, is in cli-db-user.test.ts.
 */
import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'
import { waitFor } from './polling.ts'
import { Receiver } from './webhook-receiver.ts'

for (const dialect of dialects()) {
  describe(`Record a Database Role Change (${dialect.name})`, () => {
    const t = useTestApp(dialect, { webhookAllowPrivate: true, webhookPollIntervalMs: 50 })
    const report = async (payload: object, headers = auth(t.adminKey)): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method: 'POST', url: '/auth/api/database-roles/changes', headers, payload })

    it('records a created role as database_role.created, with the reporting key as actor and the privileges in a fixed order', async () => {
      const userId = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('role') } })).json().id as string
      const res = await report({ action: 'created', role: 'ada_lovelace', privileges: ['login', 'createdb'], database: 'db.example.internal:5432/pipeline', user_id: userId })
      assert.equal(res.statusCode, 201, res.body)
      const event = res.json()
      assert.equal(event.type, 'database_role.created')
      assert.equal(event.actor.type, 'api_key')
      assert.deepEqual(event.target, { type: 'user', id: userId })
      assert.deepEqual(event.data, { role: 'ada_lovelace', database: 'db.example.internal:5432/pipeline', privileges: ['createdb', 'login'], user_id: userId })
      const listed = (await t.app.inject({ url: '/auth/api/events?type=database_role.created', headers: auth(t.adminKey) })).json()
      assert.deepEqual(listed[0], event)

      const dropped = await report({ action: 'dropped', role: 'ada_lovelace', database: 'db.example.internal:5432/pipeline' })
      assert.equal(dropped.statusCode, 201, dropped.body)
      assert.equal(dropped.json().type, 'database_role.dropped')
      assert.deepEqual(dropped.json().data, { role: 'ada_lovelace', database: 'db.example.internal:5432/pipeline' })
      assert.equal(dropped.json().target, null, 'a role dropped without a user (gatehouse db-user drop) has no target')
    })

    it('is for admin credentials only, and refuses a report no CLI run could make (422), recording nothing', async () => {
      const reader = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: uniqueName('w'), scopes: ['users:write', 'events:read'] } })).json()
      const good = { action: 'dropped', role: 'grace', database: 'db:5432/pipeline' }
      assert.equal((await report(good, auth(reader.key))).statusCode, 403)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/database-roles/changes', payload: good })).statusCode, 401)
      for (const [body, pointer] of [
        [{ ...good, action: 'created' }, '/privileges'],
        [{ ...good, action: 'created', privileges: ['createdb'] }, '/privileges'],
        [{ ...good, privileges: ['login'] }, '/privileges'],
        [{ ...good, role: 'postgres' }, '/role'],
        [{ ...good, role: 'pg_monitor' }, '/role'],
        [{ ...good, role: 'Not.A.Role' }, '/role'],
        [{ ...good, database: 'postgres://admin:secret@db:5432/pipeline' }, '/database'],
        [{ ...good, action: 'altered' }, '/action']
      ] as const) {
        const res = await report(body)
        assert.equal(res.statusCode, 422, JSON.stringify(body))
        assert.ok((res.json().errors as Array<{ pointer: string }>).some(e => e.pointer === pointer), `${JSON.stringify(body)}: ${res.body}`)
      }
      const recorded = (await t.app.inject({ url: '/auth/api/events?type=database_role.dropped', headers: auth(t.adminKey) })).json() as Array<{ data: { role: string } }>
      assert.ok(!recorded.some(e => ['grace', 'postgres', 'pg_monitor'].includes(e.data.role)))
    })

    it('is delivered to a webhook subscribed to database_role.*, as GET /api/events shows it', async () => {
      const receiver = new Receiver()
      try {
        const url = await receiver.listen()
        const hook = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(t.adminKey), payload: { url, event_types: ['database_role.*'] } })
        assert.equal(hook.statusCode, 201, hook.body)
        const event = (await report({ action: 'dropped', role: 'hopper', database: 'db:5432/pipeline' })).json()
        await waitFor('the delivery of database_role.dropped', () => receiver.accepted().has(event.id as string))
        assert.deepEqual(JSON.parse(receiver.received.find(r => r.id === event.id)!.body), event)
      } finally {
        await receiver.close()
      }
    })
  })
}
