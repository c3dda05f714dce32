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
import { crashTestsSkipped, dialects, dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'
import { startService, waitReady } from './service-process.ts'
import { SmtpTestServer } from './smtp-server.ts'

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-mail-crash-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

for (const dialect of dialects()) {
  describe(`mail survives kill -9 (${dialect.name})`, { skip: crashTestsSkipped() }, () => {
    const schema = `gh_mailcrash_${randomBytes(5).toString('hex')}`
    const databaseUrl = dialect.url ?? `sqlite:${join(tmp, `${schema}.db`)}`
    const children: ChildProcess[] = []
    let smtp: SmtpTestServer | undefined
    after(async () => {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      await smtp?.close()
      if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
    })

    it('loses no message queued or in flight when the service is killed, and sends each once it is started again', async () => {
      smtp = await SmtpTestServer.start()
      // Until the crash the server never greets: the messages claimed are held in flight.
      smtp.mode = 'stall'
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
        SMTP_URL: smtp.url,
        NODE_EXTRA_CA_CERTS: smtp.writeCertificate(join(tmp, `${schema}.pem`)),
        MAIL_FROM: 'gatehouse@example.test',
        PUBLIC_URL: 'https://pipelines.example.test/auth',
        MAIL_NOTICES: 'password_changed',
        MAIL_POLL_INTERVAL_MS: '50',
        MAIL_RETRY_BASE_MS: '100',
        // A claim's lease is three times this plus 5 s: what a crashed worker's claims wait before another takes them.
        MAIL_TIMEOUT_MS: '2000'
      }
      const headers = { 'x-api-key': adminKey, 'content-type': 'application/json' }

      const first = startService(env)
      children.push(first)
      await waitReady(base)
      const addresses: string[] = []
      for (let i = 0; i < 10; i++) {
        const username = `crash${i}_${randomBytes(3).toString('hex')}`
        const created = await fetch(`${base}/api/users`, { method: 'POST', headers, body: JSON.stringify({ username, email: `${username}@example.test`, password: GOOD_PASSWORD }) })
        assert.equal(created.status, 201)
        const { id } = (await created.json()) as { id: string }
        const changed = await fetch(`${base}/api/users/${id}`, { method: 'PATCH', headers: { ...headers, 'content-type': 'application/merge-patch+json' }, body: JSON.stringify({ password: `${GOOD_PASSWORD} 2` }) })
        assert.equal(changed.status, 200)
        addresses.push(`${username}@example.test`)
      }
      const db = createDb(defaultConfig({ databaseUrl, ...(dialect.url !== undefined ? { databaseSchema: schema } : {}) }))
      try {
        // The worker is in the middle of an SMTP conversation, holding its claim: kill it there. Its claim is
        // what says so (the start-up SMTP check also connects, so a connection alone does not).
        await waitFor('a message in flight', async () =>
          smtp!.connections >= 1 && (await db.selectFrom('mail_outbox').select('id').where('locked_until', 'is not', null).executeTakeFirst()) !== undefined)
        first.kill('SIGKILL')
        await once(first, 'exit')

        const rows = await db.selectFrom('mail_outbox').select(['status', 'locked_until', 'payload']).execute()
        assert.equal(rows.length, 10)
        assert.ok(rows.every(m => m.status === 'pending' && m.payload !== null))
        assert.ok(rows.some(m => m.locked_until !== null), 'a message was claimed when the service died')
      } finally {
        await db.destroy()
      }

      smtp.mode = 'accept'
      smtp.releaseStalled()
      const second = startService(env)
      children.push(second)
      await waitReady(base)
      await waitFor('every message sent after the restart', () => addresses.every(a => smtp!.mailTo(a).length > 0), 30_000)
      for (const address of addresses) {
        const received = smtp.mailTo(address)
        assert.equal(received.length, 1, `${address} received ${received.length} messages`)
        assert.equal(received[0]!.secure, true)
        assert.equal(received[0]!.subject, 'gatehouse: your password was changed')
      }
      second.kill('SIGTERM')
      const [code] = await once(second, 'exit') as [number | null]
      assert.equal(code, 0)
    })

    it('mails a password-reset request taken by an instance killed right after its 202, once a delivering instance starts', async () => {
      const server = await SmtpTestServer.start()
      try {
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
          SMTP_URL: server.url,
          NODE_EXTRA_CA_CERTS: server.writeCertificate(join(tmp, `${schema}-reset.pem`)),
          MAIL_FROM: 'gatehouse@example.test',
          PUBLIC_URL: 'https://pipelines.example.test/auth',
          MAIL_POLL_INTERVAL_MS: '50'
        }
        // This instance takes requests and sends nothing: the request is only what it wrote before answering.
        const taker = startService({ ...env, MAIL_DELIVERY: 'false' })
        children.push(taker)
        await waitReady(base)
        const username = `forgot_${randomBytes(3).toString('hex')}`
        const email = `${username}@example.test`
        const created = await fetch(`${base}/api/users`, { method: 'POST', headers: { 'x-api-key': adminKey, 'content-type': 'application/json' }, body: JSON.stringify({ username, email, password: GOOD_PASSWORD }) })
        assert.equal(created.status, 201)
        const ask = async (body: Record<string, string>): Promise<string> => {
          const res = await fetch(`${base}/api/password-resets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
          assert.equal(res.status, 202)
          return res.headers.get('x-request-id')!
        }
        const unknownId = await ask({ email: `nobody_${randomBytes(3).toString('hex')}@example.test` })
        const knownId = await ask({ email })
        taker.kill('SIGKILL')
        await once(taker, 'exit')

        const db = createDb(defaultConfig({ databaseUrl, ...(dialect.url !== undefined ? { databaseSchema: schema } : {}) }))
        try {
          const requests = await db.selectFrom('mail_outbox').select(['user_id', 'payload', 'status']).where('template', '=', 'password_reset_request').execute()
          assert.equal(requests.length, 2, 'both requests are in the outbox')
          for (const row of requests) {
            assert.equal(row.status, 'pending')
            assert.equal(row.user_id, null)
            assert.ok(row.payload !== null && !row.payload.includes(username) && !row.payload.includes('nobody_'), 'the name typed is sealed')
          }
          const events = await db.selectFrom('events').select('id').where('type', '=', 'user.password_reset_requested').execute()
          assert.equal(events.length, 0, 'nothing was resolved before the kill')
        } finally {
          await db.destroy()
        }

        const sender = startService(env)
        children.push(sender)
        await waitReady(base)
        const mail = await server.waitForMail(email, { subject: /reset your password/ })
        assert.ok(mail.links.some(l => l.startsWith('https://pipelines.example.test/auth/reset-password?token=ght_')))
        const check = createDb(defaultConfig({ databaseUrl, ...(dialect.url !== undefined ? { databaseSchema: schema } : {}) }))
        try {
          const outcomes = async (): Promise<Record<string, unknown>> => Object.fromEntries((await check.selectFrom('events').select(['request_id', 'data'])
            .where('type', '=', 'user.password_reset_requested').execute())
            .map(e => [e.request_id, (typeof e.data === 'string' ? JSON.parse(e.data) : e.data).outcome]))
          await waitFor('both requests resolved', async () => Object.keys(await outcomes()).length === 2)
          assert.deepEqual(await outcomes(), { [knownId]: 'mailed', [unknownId]: 'no_account' })
          // The known request became its message (sent, payload erased); the unknown one left no row.
          const resetRows = async (): Promise<Array<{ template: string, status: string, payload: string | null }>> => await check.selectFrom('mail_outbox')
            .select(['template', 'status', 'payload']).where('template', 'in', ['password_reset_request', 'password_reset']).execute()
          await waitFor('the reset mail recorded as sent', async () => (await resetRows()).every(r => r.status === 'sent'))
          assert.deepEqual(await resetRows(), [{ template: 'password_reset', status: 'sent', payload: null }])
        } finally {
          await check.destroy()
        }
        assert.equal(server.mailTo(email).length, 1)
        sender.kill('SIGTERM')
        const [code] = await once(sender, 'exit') as [number | null]
        assert.equal(code, 0)
      } finally {
        await server.close()
      }
    })
  })
}
