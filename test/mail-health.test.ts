import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { mailSettings, PUBLIC_URL } from './mail-flows.ts'
import { SmtpTestServer } from './smtp-server.ts'
import { runCli } from './cli-helpers.ts'
import { waitFor } from './polling.ts'

// A server that does not offer STARTTLS, with the default SMTP_REQUIRE_TLS=true: the setting a newcomer gets wrong.
const noTls = await SmtpTestServer.start({ startTls: false })
const good = await SmtpTestServer.start()
after(async () => { await Promise.all([noTls.close(), good.close()]) })

const ORIGIN = 'http://localhost:80'
const FORM = 'application/x-www-form-urlencoded'

async function adminCookie (t: TestApp): Promise<{ cookie: string, email: string }> {
  const username = uniqueName('mailadmin')
  const email = `${username}@example.test`
  const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email, password: GOOD_PASSWORD, role: 'admin' } })
  assert.equal(created.statusCode, 201, created.body)
  const session = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  assert.equal(session.statusCode, 200, session.body)
  return { cookie: `gatehouse_session=${session.json().token as string}`, email }
}

async function readyMail (t: TestApp): Promise<string> {
  let mail = 'unchecked'
  await waitFor('the start-up SMTP check', async () => {
    const ready = await t.app.inject({ url: '/auth/readyz' })
    mail = ready.json().checks.mail
    return mail !== 'unchecked'
  }, 10_000)
  return mail
}

async function invite (t: TestApp): Promise<{ id: string, email: string, invitation: { delivery: string, mailed: boolean } }> {
  const username = uniqueName('invitee')
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, invite: true } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

for (const dialect of dialects()) {
  describe(`mail that cannot be sent says so (${dialect.name})`, () => {
    const lines: string[] = []
    const t = useTestApp(dialect, mailSettings(noTls), { write: (line: string) => { lines.push(line) } })

    it('logs an error at start, and /readyz reports the reason in checks.mail while staying ready on the database', async () => {
      const mail = await readyMail(t)
      assert.match(mail, /TLS/i, mail)
      const ready = await t.app.inject({ url: '/auth/readyz' })
      assert.equal(ready.statusCode, 200)
      assert.equal(ready.json().status, 'ready')
      assert.equal(ready.json().checks.database, 'ok')
      const logged = lines.map(line => JSON.parse(line) as { level: number, msg: string, error?: string }).find(entry => entry.msg.startsWith('the SMTP server cannot be used'))
      assert.ok(logged !== undefined, 'an error line at start')
      assert.equal(logged.level, 50)
      assert.equal(logged.error, mail)
    })

    it('answers an invitation as queued, and the console shows admins a banner with the error and the pending user\'s delivery', async () => {
      const invited = await invite(t)
      assert.equal(invited.invitation.delivery, 'queued')
      await waitFor('a failed attempt of the invitation mail', async () =>
        (await t.app.db.selectFrom('mail_outbox').select('last_error').where('user_id', '=', invited.id).where('last_error', 'is not', null).executeTakeFirst()) !== undefined, 10_000)
      const { cookie } = await adminCookie(t)
      const users = await t.app.inject({ url: '/auth/admin/users', headers: { cookie } })
      assert.equal(users.statusCode, 200)
      assert.match(users.body, /<div class="error" role="alert" id="mail-alert"><strong>Mail is not going out\.<\/strong> The SMTP server's last answer: <code>[^<]*TLS/i)
      const page = await t.app.inject({ url: `/auth/admin/users/${invited.id}`, headers: { cookie } })
      assert.match(page.body, /id="invitation-delivery">The invitation mail is not sent yet: \d+ attempts? failed, the last with <code>[^<]*TLS/i)
      assert.equal(noTls.received.length, 0)
    })

    it('reports the server\'s refusal from Send a test mail, with a page that names it', async () => {
      const { cookie, email } = await adminCookie(t)
      const page = await t.app.inject({ url: '/auth/admin/mail', headers: { cookie } })
      assert.equal(page.statusCode, 200)
      assert.match(page.body, new RegExp(`<input id="to" name="to" type="email" value="${email}"`))
      const sent = await t.app.inject({ method: 'POST', url: '/auth/admin/mail/test', headers: { cookie, origin: ORIGIN, 'content-type': FORM }, payload: `to=${encodeURIComponent(email)}` })
      assert.equal(sent.statusCode, 502)
      assert.match(sent.body, /id="test-result"><strong>The test message was not sent\.<\/strong> The reason: <code>[^<]*TLS/i)
      assert.equal(noTls.received.length, 0)
    })
  })

  describe(`mail that goes out says so too (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(good))

    it('reports ok, shows no banner, says when the invitation was sent, and a test mail arrives with the server\'s answer on the page', async () => {
      assert.equal(await readyMail(t), 'ok')
      const invited = await invite(t)
      await good.waitForMail(invited.email, { subject: /invit/i })
      const { cookie, email } = await adminCookie(t)
      await waitFor('the invitation recorded as sent', async () =>
        (await t.app.db.selectFrom('mail_outbox').select('status').where('user_id', '=', invited.id).executeTakeFirst())?.status === 'sent', 10_000)
      const page = await t.app.inject({ url: `/auth/admin/users/${invited.id}`, headers: { cookie } })
      assert.doesNotMatch(page.body, /id="mail-alert"/)
      assert.match(page.body, /id="invitation-delivery">The invitation mail was sent <time/)
      assert.match(page.body, /<a href="\/auth\/admin\/mail">Mail<\/a>/)
      const sent = await t.app.inject({ method: 'POST', url: '/auth/admin/mail/test', headers: { cookie, origin: ORIGIN, 'content-type': FORM }, payload: `to=${encodeURIComponent(email)}` })
      assert.equal(sent.statusCode, 200, sent.body)
      assert.match(sent.body, /<strong>The server took the test message\.<\/strong> Its answer: <code>250 /)
      const test = await good.waitForMail(email, { subject: /test message/ })
      assert.match(test.text, /It arrived/)
    })

    it('shows the banner for mail that has waited for minutes with no error', async () => {
      const invited = await invite(t)
      await good.waitForMail(invited.email, { subject: /invit/i })
      const { cookie } = await adminCookie(t)
      // A message nothing has tried for ten minutes: what a stopped worker (MAIL_DELIVERY=false everywhere) leaves.
      await t.app.db.updateTable('mail_outbox').set({ status: 'pending', last_error: null, created_at: new Date(Date.now() - 600_000).toISOString(), next_attempt_at: new Date(Date.now() + 3_600_000).toISOString() })
        .where('user_id', '=', invited.id).execute()
      const users = await t.app.inject({ url: '/auth/admin/users', headers: { cookie } })
      assert.match(users.body, /id="mail-alert"><strong>Mail is not going out\.<\/strong> Nothing has sent it yet\. One message waits in the outbox, the oldest since \d{1,2} [A-Z][a-z]+ \d{4}, \d{2}:\d{2} UTC\./)
      await t.app.db.deleteFrom('mail_outbox').where('user_id', '=', invited.id).execute()
    })
  })
}

describe('gatehouse mail test', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gh-mailtest-'))
  after(() => { rmSync(dir, { recursive: true, force: true }) })
  const env = (server: SmtpTestServer): Record<string, string> => ({
    SMTP_URL: server.url, MAIL_FROM: 'gatehouse@example.test', PUBLIC_URL, NODE_EXTRA_CA_CERTS: server.writeCertificate(join(dir, `ca-${server.url.split(':').at(-1)!}.pem`))
  })

  it('prints the server\'s answer and exits 0 when the message is taken', async () => {
    const result = await runCli(['mail', 'test', 'ops@example.test'], { env: env(good) })
    assert.equal(result.code, 0, result.stderr)
    assert.match(result.stdout, /^The SMTP server took the test message for ops@example\.test: 250 /)
    await good.waitForMail('ops@example.test', { subject: /test message/ })
  })

  it('exits 1 with the reason when the server cannot be used, and 2 without SMTP_URL or with a bad address', async () => {
    const refused = await runCli(['mail', 'test', 'ops@example.test'], { env: env(noTls) })
    assert.equal(refused.code, 1)
    assert.match(refused.stderr, /^gatehouse: the test message was not sent: .*TLS/im)
    const unset = await runCli(['mail', 'test', 'ops@example.test'])
    assert.equal(unset.code, 2)
    assert.match(unset.stderr, /SMTP_URL is not set/)
    const bad = await runCli(['mail', 'test', 'not-an-address'], { env: env(good) })
    assert.equal(bad.code, 2)
  })
})
