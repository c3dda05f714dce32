import assert from 'node:assert/strict'
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { after, describe, it } from 'node:test'
import { createDb } from '../src/db/database.ts'
import { defaultConfig } from '../src/config.ts'
import { crashTestsSkipped, dialects, dropSchema } from './helpers.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'
import { startService, waitReady } from './service-process.ts'

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-webhooks-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

for (const dialect of dialects()) {
  describe(`webhooks survive kill -9 (${dialect.name})`, { skip: crashTestsSkipped() }, () => {
    const schema = `gh_crash_${randomBytes(5).toString('hex')}`
    const databaseUrl = dialect.url ?? `sqlite:${join(tmp, `${schema}.db`)}`
    const children: ChildProcess[] = []
    const receiver = new Receiver()
    after(async () => {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      await receiver.close()
      if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
    })

    it('loses no delivery pending or in flight when the service is killed, once it is started again', async () => {
      const url = await receiver.listen()
      let up = false
      // Until the crash, the receiver holds every request open: those deliveries are claimed and in flight.
      receiver.answer = () => up ? 200 : 'hang'
      const adminKey = `gatehouse_${randomBytes(24).toString('hex')}`
      const port = await freePort()
      const base = `http://127.0.0.1:${port}/auth`
      const env = {
        DATABASE_URL: databaseUrl,
        ...(dialect.url !== undefined ? { DATABASE_SCHEMA: schema } : {}),
        HOST: '127.0.0.1',
        PORT: String(port),
        LOG_LEVEL: 'warn',
        GATEHOUSE_ADMIN_API_KEY: adminKey,
        WEBHOOK_ALLOW_PRIVATE: 'true',
        WEBHOOK_POLL_INTERVAL_MS: '50',
        WEBHOOK_RETRY_BASE_MS: '100',
        // A claim's lease is twice this plus a second: what a crashed worker's claims wait before another takes them.
        WEBHOOK_TIMEOUT_MS: '1000',
        WEBHOOK_CONCURRENCY: '4'
      }
      const headers = { 'x-api-key': adminKey, 'content-type': 'application/json' }

      const first = startService(env)
      children.push(first)
      await waitReady(base)
      const hook = await fetch(`${base}/api/webhooks`, { method: 'POST', headers, body: JSON.stringify({ url, event_types: ['user.created'] }) })
      assert.equal(hook.status, 201, await hook.clone().text())
      const users: string[] = []
      for (let i = 0; i < 20; i++) {
        const res = await fetch(`${base}/api/users`, { method: 'POST', headers, body: JSON.stringify({ username: `crash${i}_${randomBytes(3).toString('hex')}` }) })
        assert.equal(res.status, 201)
        users.push(((await res.json()) as { id: string }).id)
      }
      await waitFor('deliveries in flight', () => receiver.received.length >= 4)
      first.kill('SIGKILL')
      await once(first, 'exit')

      // Every delivery is still owed: none was answered.
      const db = createDb(defaultConfig({ databaseUrl, ...(dialect.url !== undefined ? { databaseSchema: schema } : {}) }))
      try {
        const pending = await db.selectFrom('webhook_deliveries').select(['status', 'locked_until']).execute()
        assert.equal(pending.length, 20)
        assert.ok(pending.every(d => d.status === 'pending'))
        assert.ok(pending.some(d => d.locked_until !== null), 'some deliveries were claimed when the service died')
      } finally {
        await db.destroy()
      }

      up = true
      receiver.releaseHanging()
      const second = startService(env)
      children.push(second)
      await waitReady(base)
      const events = (await (await fetch(`${base}/api/events?type=user.created&limit=100`, { headers })).json()) as Array<{ id: string, target: { id: string } }>
      const eventIds = events.filter(e => users.includes(e.target.id)).map(e => e.id)
      assert.equal(eventIds.length, 20)
      await waitFor('every event delivered after the restart', () => eventIds.every(id => receiver.accepted().has(id)), 30_000)
      const accepted = receiver.accepted()
      for (const id of eventIds) assert.equal(accepted.get(id), 1, `event ${id} accepted ${accepted.get(id)} times`)
      second.kill('SIGTERM')
      const [code] = await once(second, 'exit') as [number | null]
      assert.equal(code, 0)
    })
  })
}
