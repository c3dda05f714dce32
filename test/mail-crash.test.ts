import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { after, describe, it } from 'node:test'
import { createDb } from '../src/db/database.ts'
import { defaultConfig } from '../src/config.ts'
import { dialects, dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { waitFor } from './webhook-receiver.ts'
import { freePort } from './ports.ts'
import { SmtpTestServer } from './smtp-server.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-mail-crash-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

/** The service as production runs it: its own process, trusting the test SMTP server through NODE_EXTRA_CA_CERTS. */
function startService (env: Record<string, string>): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    stdio: ['ignore', 'ignore', 'pipe']
  })
  child.stderr!.setEncoding('utf8').on('data', (d: string) => { process.stderr.write(`[service] ${d}`) })
  return child
}

async function waitReady (base: string): Promise<void> {
  await waitFor('the service to be ready', async () => {
    try {
      return (await fetch(`${base}/readyz`)).ok
    } catch {
      return false
    }
  }, 30_000)
}

for (const dialect of dialects()) {
  describe(`mail survives kill -9 (${dialect.name})`, () => {
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
      // The worker is in the middle of an SMTP conversation, holding its claim: kill it there.
      await waitFor('a message in flight', () => smtp!.connections >= 1)
      first.kill('SIGKILL')
      await once(first, 'exit')

      const db = createDb(defaultConfig({ databaseUrl, ...(dialect.url !== undefined ? { databaseSchema: schema } : {}) }))
      try {
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
  })
}
