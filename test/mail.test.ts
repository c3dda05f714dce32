import assert from 'node:assert/strict'
import { generateKeyPairSync, randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { ConfigError, loadConfig, type Config } from '../src/config.ts'
import { publicLink } from '../src/lib/public-url.ts'
import { enqueueMail, mailKeyOf, NO_NOTICES, openPayload } from '../src/mail/mail.outbox.ts'
import { changeUserRecorded } from '../src/users/users.lifecycle.ts'
import { SYSTEM_CONTEXT } from '../src/auth/principal.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { SmtpTestServer } from './smtp-server.ts'
import { SoftAuthenticator } from './soft-authenticator.ts'
import { waitFor } from './polling.ts'

const ORIGIN = 'http://localhost:8080'
const FIREFOX_WINDOWS = 'Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0'
const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-mail-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

const servers: SmtpTestServer[] = []
after(async () => { for (const server of servers) await server.close() })
async function smtpServer (): Promise<SmtpTestServer> {
  const server = await SmtpTestServer.start()
  servers.push(server)
  return server
}

/** A test app's mail settings: the test SMTP server, trusted for its STARTTLS certificate through the test-only setting. */
function mailSettings (server: SmtpTestServer, more: Partial<Config> = {}): Partial<Config> {
  return {
    smtpUrl: server.url,
    smtpTrustForTests: [server.certificate],
    mailFrom: '"Pipelines" <gatehouse@example.test>',
    publicUrl: 'https://pipelines.example.test/auth',
    productName: 'Pipelines',
    mailPollIntervalMs: 50,
    mailRetryBaseMs: 100,
    mailRetryMaxDelayMs: 200,
    mailTimeoutMs: 1000,
    mfaEncryptionKey: randomBytes(32),
    ...more
  }
}

interface TestUser { id: string, username: string, email: string | null }

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<TestUser> {
  const username = uniqueName()
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function patchUser (t: TestApp, id: string, patch: Record<string, unknown>): Promise<void> {
  const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify(patch) })
  assert.equal(res.statusCode, 200, res.body)
}

async function login (t: TestApp, username: string, options: { from?: string, cookie?: string, password?: string } = {}): Promise<LightMyRequestResponse> {
  const res = await t.app.inject({
    method: 'POST',
    url: '/auth/api/login',
    headers: { 'user-agent': FIREFOX_WINDOWS, ...(options.cookie !== undefined ? { cookie: options.cookie } : {}) },
    payload: { username, password: options.password ?? GOOD_PASSWORD },
    remoteAddress: options.from ?? '127.0.0.1'
  })
  assert.equal(res.statusCode, 200, res.body)
  return res
}

const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })

/** The mail queued about a user, read from the outbox: what was queued is known when the request is answered. */
async function outboxOf (t: TestApp, userId: string): Promise<Array<{ template: string, status: string, payload: string | null, attempts: number, last_error: string | null }>> {
  return await t.app.db.selectFrom('mail_outbox').select(['template', 'status', 'payload', 'attempts', 'last_error'])
    .where('user_id', '=', userId).orderBy('id').execute()
}

async function eventsOf (t: TestApp, type: string, userId: string): Promise<Array<{ data: Record<string, unknown>, target: { id: string } | null }>> {
  const res = await t.app.inject({ url: `/auth/api/events?type=${type}&target_id=${userId}&limit=100`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

describe('mail settings', () => {
  const smtpEnv = { SMTP_URL: 'smtp://relay.example.test', MAIL_FROM: 'gatehouse@example.test', PUBLIC_URL: 'https://pipelines.example.test/auth' }

  it('requires PUBLIC_URL and MAIL_FROM with SMTP_URL, and an smtp:// or smtps:// address', () => {
    assert.throws(() => loadConfig({ ...smtpEnv, PUBLIC_URL: '' }), (e: unknown) => e instanceof ConfigError && /PUBLIC_URL is required/.test(e.message))
    assert.throws(() => loadConfig({ ...smtpEnv, MAIL_FROM: '' }), (e: unknown) => e instanceof ConfigError && /MAIL_FROM is required/.test(e.message))
    assert.throws(() => loadConfig({ ...smtpEnv, SMTP_URL: 'http://relay.example.test' }), ConfigError)
    assert.throws(() => loadConfig({ ...smtpEnv, PUBLIC_URL: 'https://pipelines.example.test/auth/' }), ConfigError)
    assert.throws(() => loadConfig({ ...smtpEnv, PUBLIC_URL: 'pipelines.example.test' }), ConfigError)
    const config = loadConfig(smtpEnv)
    assert.equal(config.smtpRequireTls, true, 'STARTTLS is required by default')
    assert.deepEqual(config.mailNotices, ['password_changed', 'factor_added', 'factor_removed', 'email_changed', 'username_changed', 'new_device_sign_in'])
    assert.equal(loadConfig({ ...smtpEnv, SMTP_REQUIRE_TLS: 'false' }).smtpRequireTls, false)
  })

  it('reads MAIL_NOTICES as a list of known notices, or none', () => {
    assert.deepEqual(loadConfig({ MAIL_NOTICES: 'password_changed, email_changed' }).mailNotices, ['password_changed', 'email_changed'])
    assert.deepEqual(loadConfig({ MAIL_NOTICES: 'none' }).mailNotices, [])
    assert.deepEqual(loadConfig({ MAIL_NOTICES: '' }).mailNotices, [])
    assert.throws(() => loadConfig({ MAIL_NOTICES: 'password_change' }), ConfigError)
  })

  it('takes DKIM settings all together or not at all', () => {
    assert.throws(() => loadConfig({ MAIL_DKIM_DOMAIN: 'example.test' }), ConfigError)
    const keyFile = join(tmp, 'dkim.pem')
    writeFileSync(keyFile, '-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIH1c\n-----END PRIVATE KEY-----\n')
    const dkim = loadConfig({ MAIL_DKIM_DOMAIN: 'example.test', MAIL_DKIM_SELECTOR: 'gh', MAIL_DKIM_PRIVATE_KEY_FILE: keyFile }).mailDkim
    assert.equal(dkim?.domain, 'example.test')
    assert.match(dkim?.privateKey ?? '', /BEGIN PRIVATE KEY/)
  })

  it('builds links from PUBLIC_URL, or else from the address it listens on; never from a request', () => {
    const withPublicUrl = loadConfig({ PUBLIC_URL: 'https://pipelines.example.test/auth' })
    assert.equal(publicLink(withPublicUrl, '/reset', { token: 'a b&c' }), 'https://pipelines.example.test/auth/reset?token=a+b%26c')
    assert.equal(publicLink(loadConfig({ HOST: '0.0.0.0', PORT: '9000' }), '/account'), 'http://localhost:9000/auth/account')
    assert.equal(publicLink(loadConfig({ HOST: '::1' }), '/account'), 'http://[::1]:8080/auth/account')
    assert.throws(() => publicLink(withPublicUrl, '//evil.example/x'))
  })
})

for (const dialect of dialects()) {
  describe(`mail: security notices (${dialect.name})`, async () => {
    const smtp = await smtpServer()
    const t = useTestApp(dialect, mailSettings(smtp, { webauthnRpId: 'localhost', webauthnOrigins: [ORIGIN] }))

    it('mails "password changed" when an admin sets it: over STARTTLS, text and HTML, with the product name and a link from PUBLIC_URL', async () => {
      const user = await createUser(t)
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
      const mail = await smtp.waitForMail(user.email!)
      assert.equal(mail.secure, true, 'sent after STARTTLS')
      assert.equal(mail.from, 'gatehouse@example.test')
      assert.equal(mail.subject, 'Pipelines: your password was changed')
      assert.match(mail.text, new RegExp(`Pipelines account ${user.username} was changed`))
      assert.match(mail.html, new RegExp(`Pipelines account <strong>${user.username}</strong> was changed`))
      assert.deepEqual(mail.links, ['https://pipelines.example.test/auth/account'])
      assert.match(mail.html, /href="https:\/\/pipelines\.example\.test\/auth\/account"/)
    })

    it('mails "password changed" when the user changes it, and records mail.sent without the address', async () => {
      const user = await createUser(t)
      const token = (await login(t, user.username)).json().token as string
      const res = await t.app.inject({ method: 'PUT', url: '/auth/api/me/password', headers: bearer(token), payload: { current_password: GOOD_PASSWORD, new_password: `${GOOD_PASSWORD} 3` } })
      assert.equal(res.statusCode, 204, res.body)
      const mail = await smtp.waitForMail(user.email!)
      assert.equal(mail.subject, 'Pipelines: your password was changed')
      await waitFor('mail.sent', async () => (await eventsOf(t, 'mail.sent', user.id)).length === 1)
      const [sent] = await eventsOf(t, 'mail.sent', user.id)
      assert.equal(sent!.data.template, 'password_changed')
      assert.equal(sent!.data.attempts, 1)
      assert.doesNotMatch(JSON.stringify(sent), /@example\.test/)
      const [row] = await outboxOf(t, user.id)
      assert.equal(row!.status, 'sent')
      assert.equal(row!.payload, null, 'the payload is erased once sent')
    })

    it('mails "factor added" when an authenticator app is enrolled and "factor removed" when it is removed', async () => {
      const user = await createUser(t)
      const token = (await login(t, user.username)).json().token as string
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer(token) })
      assert.equal(setup.statusCode, 200, setup.body)
      const code = await generate({ secret: setup.json().secret, epoch: Math.floor(Date.now() / 1000) })
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer(token), payload: { code } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      const added = await smtp.waitForMail(user.email!, { subject: /factor was added/ })
      assert.equal(added.subject, 'Pipelines: a second factor was added to your account')
      assert.match(added.text, /An authenticator app \(TOTP\) was added/)
      assert.match(added.html, /An authenticator app \(TOTP\) was added/)

      const removed = await t.app.inject({ method: 'DELETE', url: '/auth/api/me/mfa/totp', headers: bearer(token) })
      assert.equal(removed.statusCode, 204, removed.body)
      const notice = await smtp.waitForMail(user.email!, { subject: /factor was removed/ })
      assert.match(notice.text, /The authenticator app \(TOTP\) was removed/)
      assert.match(notice.html, /The authenticator app \(TOTP\) was removed/)
    })

    it('mails "factor added" and "factor removed" for a passkey', async () => {
      const user = await createUser(t)
      const token = (await login(t, user.username)).json().token as string
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      const options = await t.app.inject({ method: 'POST', url: '/auth/api/me/passkeys/options', headers: bearer(token) })
      assert.equal(options.statusCode, 200, options.body)
      const added = await t.app.inject({ method: 'POST', url: '/auth/api/me/passkeys', headers: bearer(token), payload: { name: 'Laptop', credential: authenticator.create(options.json().options) } })
      assert.equal(added.statusCode, 201, added.body)
      const notice = await smtp.waitForMail(user.email!, { subject: /factor was added/ })
      assert.match(notice.text, /A passkey was added as a second factor/)
      const removed = await t.app.inject({ method: 'DELETE', url: `/auth/api/me/passkeys/${added.json().passkey.id}`, headers: bearer(token) })
      assert.equal(removed.statusCode, 204, removed.body)
      const gone = await smtp.waitForMail(user.email!, { subject: /factor was removed/ })
      assert.match(gone.text, /A passkey was removed/)
      assert.match(gone.html, /A passkey was removed/)
    })

    it('mails "factor removed" when an admin resets a user\'s factors', async () => {
      const user = await createUser(t)
      const token = (await login(t, user.username)).json().token as string
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer(token) })
      const code = await generate({ secret: setup.json().secret, epoch: Math.floor(Date.now() / 1000) })
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer(token), payload: { code } })).statusCode, 200)
      const reset = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/mfa`, headers: auth(t.adminKey) })
      assert.equal(reset.statusCode, 204, reset.body)
      const notice = await smtp.waitForMail(user.email!, { subject: /factor was removed/ })
      assert.match(notice.text, /All second factors were removed/)
    })

    it('mails "e-mail changed" to the old address, naming the new one (HTML-escaped in the HTML part only)', async () => {
      const user = await createUser(t)
      const newEmail = `o'neil&co.${randomBytes(3).toString('hex')}@example.test`
      await patchUser(t, user.id, { email: newEmail })
      const notice = await smtp.waitForMail(user.email!)
      assert.equal(notice.subject, 'Pipelines: the e-mail address of your account was changed')
      assert.ok(notice.text.includes(`from this address to ${newEmail}.`), notice.text)
      assert.ok(notice.html.includes(`<strong>${newEmail.replace('&', '&amp;').replace("'", '&#39;')}</strong>`), notice.html)
      const queued = await outboxOf(t, user.id)
      assert.deepEqual(queued.map(m => m.template), ['email_changed'])
    })

    it('mails "username changed" to the account, naming the old and the new name', async () => {
      const user = await createUser(t)
      const renamed = `${user.username}_r`
      await patchUser(t, user.id, { username: renamed })
      const notice = await smtp.waitForMail(user.email!)
      assert.equal(notice.subject, 'Pipelines: the username of your account was changed')
      assert.match(notice.text, new RegExp(`from\\s+${user.username} to ${renamed}\\.`))
      assert.ok(notice.html.includes(`<strong>${user.username}</strong> to <strong>${renamed}</strong>`), notice.html)
      assert.deepEqual((await outboxOf(t, user.id)).map(m => m.template), ['username_changed'])
    })

    it('mails "sign-in from a new device" for a browser without the account\'s device cookie at an address not used before; not for the first sign-in, a known address or a known browser', async () => {
      const user = await createUser(t)
      const first = await login(t, user.username, { from: '203.0.113.7' })
      const deviceCookie = first.cookies.find(c => c.name === 'gatehouse_device')
      assert.ok(deviceCookie !== undefined)
      await login(t, user.username, { from: '203.0.113.7' })
      await login(t, user.username, { from: '198.51.100.30', cookie: `gatehouse_device=${deviceCookie.value}` })
      assert.deepEqual(await outboxOf(t, user.id), [], 'the first sign-in, a known address and a known browser are not news')

      await login(t, user.username, { from: '192.0.2.44' })
      const notice = await smtp.waitForMail(user.email!)
      assert.equal(notice.subject, 'Pipelines: a sign-in from a new device')
      assert.match(notice.text, /Device: {2}Firefox 133 on Windows/)
      assert.match(notice.text, /Address: 192\.0\.2\.44/)
      assert.match(notice.html, /<td>192\.0\.2\.44<\/td>/)
      const succeeded = await eventsOf(t, 'user.login_succeeded', user.id)
      assert.deepEqual(succeeded.map(e => e.data.new_device ?? false), [true, false, false, false])
    })

    it('queues no notice for a change whose event says notices: false (an invitation accepted sets the first password)', async () => {
      const user = await createUser(t)
      await t.app.db.transaction().execute(async trx => {
        await changeUserRecorded(trx, SYSTEM_CONTEXT, user.id, { password_hash: await t.app.passwords.hash(`${GOOD_PASSWORD} 6`) }, { lastAdmin: 'refuse', extra: NO_NOTICES })
      })
      const [updated] = await eventsOf(t, 'user.updated', user.id)
      assert.equal(updated!.data.notices, false)
      assert.deepEqual(await outboxOf(t, user.id), [])
    })

    it('queues nothing for a user without an e-mail address', async () => {
      const user = await createUser(t, { email: null })
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 4` })
      assert.deepEqual(await outboxOf(t, user.id), [])
    })

    it('keeps neither the address nor the values readable in the outbox while a message waits', async () => {
      const user = await createUser(t)
      smtp.mode = 'stall'
      try {
        await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 5` })
        const [row] = await t.app.db.selectFrom('mail_outbox').select(['id', 'payload']).where('user_id', '=', user.id).execute()
        const payload = row?.payload
        assert.ok(row !== undefined && typeof payload === 'string')
        assert.ok(!payload.includes(user.email!) && !payload.includes(user.username), 'sealed')
        // Under the key derived from MFA_ENCRYPTION_KEY, which the database does not hold; not under the database's own.
        assert.equal(openPayload([mailKeyOf(t.config.mfaEncryptionKey)!], row.id, payload).to, user.email)
        assert.throws(() => openPayload([randomBytes(32)], row.id, payload))
      } finally {
        smtp.mode = 'accept'
        smtp.releaseStalled()
      }
      await smtp.waitForMail(user.email!)
    })

    it('counts sent mail in /metrics', async () => {
      const res = await t.app.inject({ url: '/auth/metrics' })
      assert.equal(res.statusCode, 200)
      const sent = /gatehouse_mail_attempts_total\{outcome="sent"\} (\d+)/.exec(res.body)
      assert.ok(sent !== null && Number(sent[1]) >= 5, res.body.split('\n').filter(l => l.includes('mail')).join('\n'))
      assert.match(res.body, /gatehouse_mail_pending \d+/)
    })
  })

  describe(`mail: notices switched off, and templates overridden (${dialect.name})`, async () => {
    const smtp = await smtpServer()
    const templates = mkdtempSync(join(tmp, 'templates-'))
    writeFileSync(join(templates, 'factor_added.subject'), 'Security notice from {{product_name}} for {{username}}')
    writeFileSync(join(templates, 'factor_added.html'), '<p>{{product_name}} (custom): {{#factor_totp}}TOTP{{/factor_totp}} added for {{username}}.</p>')
    const dkimKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()
    const t = useTestApp(dialect, mailSettings(smtp, { mailNotices: ['factor_added'], mailTemplatesDir: templates, mailDkim: { domain: 'example.test', selector: 'gh', privateKey: dkimKey } }))

    it('sends only the notices MAIL_NOTICES names, and an override replaces just the parts it provides; DKIM-signed', async () => {
      const user = await createUser(t)
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
      await patchUser(t, user.id, { email: `moved.${user.email!}` })
      assert.deepEqual(await outboxOf(t, user.id), [], 'password and e-mail notices are off')

      const token = (await login(t, user.username, { password: `${GOOD_PASSWORD} 2` })).json().token as string
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer(token) })
      const code = await generate({ secret: setup.json().secret, epoch: Math.floor(Date.now() / 1000) })
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer(token), payload: { code } })).statusCode, 200)
      const mail = await smtp.waitForMail(`moved.${user.email!}`)
      assert.equal(mail.subject, `Security notice from Pipelines for ${user.username}`)
      assert.equal(mail.html.trim(), `<p>Pipelines (custom): TOTP added for ${user.username}.</p>`)
      assert.match(mail.text, /An authenticator app \(TOTP\) was added/, 'the built-in text part')
      const dkim = mail.headers.get('dkim-signature') as { params?: Record<string, string> } | undefined
      assert.equal(dkim?.params?.d, 'example.test')
      assert.equal(dkim?.params?.s, 'gh')
      assert.deepEqual((await outboxOf(t, user.id)).map(m => m.template), ['factor_added'])
    })
  })

  describe(`mail: without SMTP (${dialect.name})`, () => {
    const logLines: string[] = []
    const t = useTestApp(dialect, { mfaEncryptionKey: randomBytes(32) }, { write: (line: string) => { logLines.push(line) } })

    it('says at start that no mail is sent and notices are not queued', () => {
      assert.ok(logLines.some(line => line.includes('no SMTP_URL: no mail is sent, and security notices are not queued')), logLines.join(''))
    })

    it('queues no notices and enqueueMail says it queued nothing', async () => {
      const user = await createUser(t)
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
      assert.deepEqual(await outboxOf(t, user.id), [])
      const queued = await t.app.db.transaction().execute(async trx => await enqueueMail(trx, { to: user.email!, template: 'password_changed', data: {}, userId: user.id }))
      assert.equal(queued, false)
      assert.deepEqual(await outboxOf(t, user.id), [])
      assert.equal(t.app.mail, undefined)
    })
  })

  describe(`mail: an SMTP server that refuses or stalls (${dialect.name})`, async () => {
    const smtp = await smtpServer()
    const logLines: string[] = []
    const t = useTestApp(dialect, mailSettings(smtp), { write: (line: string) => { logLines.push(line) } })

    it('answers the request while SMTP stalls, and sends the message once the server answers again', async () => {
      const user = await createUser(t)
      // The worker checks the server once at start: that connection must not pass for the message's below.
      await waitFor('the start-up SMTP check', () => t.app.mail!.health !== undefined)
      smtp.mode = 'stall'
      const connectionsBefore = smtp.connections
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
      // The request was answered; the worker is (or is about to be) held by the stalled server.
      await waitFor('the worker to connect to the stalled server', () => smtp.connections > connectionsBefore)
      const stillAnswering = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ first_name: 'Stalled' }) })
      assert.equal(stillAnswering.statusCode, 200)
      assert.equal(smtp.mailTo(user.email!).length, 0)
      smtp.mode = 'accept'
      const mail = await smtp.waitForMail(user.email!)
      assert.equal(mail.subject, 'Pipelines: your password was changed')
      await waitFor('the message recorded as sent', async () => (await outboxOf(t, user.id))[0]?.status === 'sent')
      const [row] = await outboxOf(t, user.id)
      assert.ok(row!.attempts >= 2, `attempts: ${row!.attempts}`)
    })

    it('retries after a temporary refusal (451) with back-off, and sends once the server accepts', async () => {
      const user = await createUser(t)
      smtp.mode = 'refuse-temporarily'
      const refusalsBefore = smtp.refusals
      await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
      await waitFor('two refusals', () => smtp.refusals >= refusalsBefore + 2)
      const [waiting] = await outboxOf(t, user.id)
      assert.equal(waiting!.status, 'pending')
      assert.match(waiting!.last_error ?? '', /451/)
      smtp.mode = 'accept'
      await smtp.waitForMail(user.email!)
      await waitFor('mail.sent', async () => (await eventsOf(t, 'mail.sent', user.id)).length === 1)
      assert.ok(((await eventsOf(t, 'mail.sent', user.id))[0]!.data.attempts as number) >= 3)
    })

    it('gives a message up at a permanent refusal (550): mail.failed, the payload erased, counted in /metrics', async () => {
      const user = await createUser(t)
      smtp.mode = 'refuse-permanently'
      try {
        await patchUser(t, user.id, { password: `${GOOD_PASSWORD} 2` })
        await waitFor('mail.failed', async () => (await eventsOf(t, 'mail.failed', user.id)).length === 1)
      } finally {
        smtp.mode = 'accept'
      }
      const [failed] = await eventsOf(t, 'mail.failed', user.id)
      assert.equal(failed!.data.template, 'password_changed')
      assert.match(String(failed!.data.error), /550/)
      // The server's reply named the recipient; the event keeps the reply without it.
      assert.match(String(failed!.data.error), /<\[address\]>: No such mailbox here/)
      assert.doesNotMatch(JSON.stringify(failed), /@example\.test/)
      const [row] = await outboxOf(t, user.id)
      assert.equal(row!.status, 'failed')
      assert.equal(row!.payload, null)
      const metrics = await t.app.inject({ url: '/auth/metrics' })
      assert.match(metrics.body, /gatehouse_mail_failed [1-9]/)
      assert.match(metrics.body, /gatehouse_mail_attempts_total\{outcome="failed"\} [1-9]/)
    })

    // The deadline is the check: without the cut, closing would wait out MAIL_TIMEOUT_MS (10 minutes here) several times.
    it('stops (closes) while an SMTP conversation stalls, cutting it after a grace period rather than waiting out the SMTP timeouts', { timeout: 60_000 }, async () => {
      const stalled = await smtpServer()
      stalled.mode = 'stall'
      const slow = await createTestApp(dialect, mailSettings(stalled, { mailTimeoutMs: 600_000 }))
      try {
        const user = await createUser(slow)
        await patchUser(slow, user.id, { password: `${GOOD_PASSWORD} 2` })
        await waitFor('the worker to connect to the stalled server', () => stalled.connections > 0)
      } finally {
        await slow.app.close()
      }
      assert.equal(stalled.received.length, 0)
    })

    it('writes no address into the log while failing', () => {
      const lines = logLines.filter(l => l.includes('mail not sent'))
      assert.ok(lines.length > 0)
      for (const line of logLines) assert.doesNotMatch(line, /@example\.test/)
    })
  })
}
