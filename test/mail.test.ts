import assert from 'node:assert/strict'
import { after, before, describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { SmtpTestServer } from './smtp-server.ts'

const smtp = await SmtpTestServer.start()
after(async () => { await smtp.close() })

/** What every test app here is configured with: the test SMTP server, trusted for its STARTTLS certificate. */
function mailSettings (server: SmtpTestServer) {
  return {
    smtpUrl: server.url,
    smtpTrustForTests: [server.certificate],
    mailFrom: '"Pipelines" <gatehouse@example.test>',
    publicUrl: 'https://pipelines.example.test/auth',
    productName: 'Pipelines',
    mailPollIntervalMs: 50,
    mailRetryBaseMs: 100,
    mailTimeoutMs: 2000
  }
}

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string, email: string | null }> {
  const username = uniqueName()
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

for (const dialect of dialects()) {
  describe(`mail: security notices over SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(smtp))
    before(() => { smtp.mode = 'accept' })

    it('mails "password changed" to the user over STARTTLS, as text and HTML with the product name and a link from PUBLIC_URL', async () => {
      const user = await createUser(t)
      const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ password: `${GOOD_PASSWORD} 2` }) })
      assert.equal(res.statusCode, 200, res.body)
      const mail = await smtp.waitForMail(user.email!)
      assert.equal(mail.secure, true, 'sent after STARTTLS')
      assert.equal(mail.from, 'gatehouse@example.test')
      assert.equal(mail.subject, 'Pipelines: your password was changed')
      assert.match(mail.text, new RegExp(`account ${user.username} was changed`))
      assert.match(mail.html, new RegExp(`<strong>${user.username}</strong>`))
      assert.deepEqual(mail.links, ['https://pipelines.example.test/auth/account'])
    })
  })
}
