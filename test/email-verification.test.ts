import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { mailedCode, mailSettings, PUBLIC_URL, smtpForThisFile } from './mail-flows.ts'

const smtp = await smtpForThisFile()

/** A user with an address, signed in: its id, name, address and a bearer header for its session. */
async function signedInUser (t: TestApp): Promise<{ id: string, username: string, email: string, bearer: Record<string, string> }> {
  const username = uniqueName('ver')
  const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, password: GOOD_PASSWORD } })
  assert.equal(created.statusCode, 201, created.body)
  const session = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  return { ...created.json(), bearer: { authorization: `Bearer ${session.json().token}` } }
}

async function readUser (t: TestApp, id: string) {
  return (await t.app.inject({ method: 'GET', url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()
}

async function confirmationMail (to: string, count = 1): Promise<{ token: string, code: string, link: string }> {
  const mail = await smtp.waitForMail(to, { count, subject: /confirm your e-mail address/ })
  const link = mail.links.find(l => l.includes('/verify-email?token='))!
  return { link, token: new URL(link).searchParams.get('token')!, code: mailedCode(mail.text)! }
}

for (const dialect of dialects()) {
  describe(`e-mail verification and change over SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(smtp))

    it('a new user\'s address is unverified; confirming it by link sets email_verified and answers with the user\'s ETag', async () => {
      const user = await signedInUser(t)
      assert.equal((await readUser(t, user.id)).email_verified, false)
      const sent = await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: {} })
      assert.equal(sent.statusCode, 202, sent.body)
      assert.equal(sent.json().email, user.email)
      const { token, link } = await confirmationMail(user.email)
      assert.ok(link.startsWith(`${PUBLIC_URL}/verify-email?token=`))
      const page = await t.app.inject({ method: 'GET', url: `/auth/verify-email?token=${token}` })
      assert.equal(page.statusCode, 200)
      assert.match(page.body, new RegExp(`<strong id="email">${user.email}</strong>`))
      assert.equal((await readUser(t, user.id)).email_verified, false, 'showing the page confirms nothing')
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      assert.equal(confirmed.json().email_verified, true)
      const read = await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
      assert.equal(confirmed.headers.etag, read.headers.etag, 'the confirmed account carries the ETag an If-Match on Update User needs')
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token } })).json().code, 'token_invalid')
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: {} })).statusCode, 409, 'already confirmed')
    })

    it('a new address takes effect only once confirmed, by code, and the old address is told', async () => {
      const user = await signedInUser(t)
      const newEmail = `new_${uniqueName()}@example.test`
      const sent = await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: { email: newEmail } })
      assert.equal(sent.statusCode, 202, sent.body)
      assert.equal((await readUser(t, user.id)).email, user.email, 'not changed before it is confirmed')
      const { code } = await confirmationMail(newEmail)
      const wrongAddress = await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { login: user.email, code } })
      assert.equal(wrongAddress.json().code, 'token_invalid', 'the code goes with the address it was mailed to')
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { login: newEmail.toUpperCase(), code } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      assert.equal(confirmed.json().email, newEmail)
      assert.equal(confirmed.json().email_verified, true)
      const notice = await smtp.waitForMail(user.email, { subject: /address/ })
      assert.match(notice.text, new RegExp(newEmail))
    })

    it('a newer request ends the earlier link; an address another account has is refused', async () => {
      const user = await signedInUser(t)
      const other = await signedInUser(t)
      const first = `a_${uniqueName()}@example.test`
      const second = `b_${uniqueName()}@example.test`
      await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: { email: first } })
      const firstMail = await confirmationMail(first)
      await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: { email: second } })
      await confirmationMail(second)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token: firstMail.token } })).json().code, 'token_invalid')
      const taken = await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: { email: other.email } })
      assert.equal(taken.statusCode, 409)
      assert.equal(taken.json().code, 'email_taken')
    })

    it('a signed-in user cannot set a new address of their own by PATCH; an admin can, unverified', async () => {
      const user = await signedInUser(t)
      const self = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: user.bearer, payload: { email: `self_${uniqueName()}@example.test` } })
      assert.equal(self.statusCode, 403)
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: {} })
      assert.equal(confirmed.statusCode, 202)
      const { token } = await confirmationMail(user.email)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token } })).json().email_verified, true)
      const byAdmin = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ email: `admin_${uniqueName()}@example.test` }) })
      assert.equal(byAdmin.statusCode, 200, byAdmin.body)
      assert.equal(byAdmin.json().email_verified, false, 'a changed address is unverified')
    })

    it('the account page shows the address\'s state and mails a confirmation to a new address', async () => {
      const user = await signedInUser(t)
      const cookie = `gatehouse_session=${user.bearer.authorization!.slice('Bearer '.length)}`
      const page = await t.app.inject({ url: '/auth/account', headers: { cookie } })
      assert.equal(page.statusCode, 200)
      assert.match(page.body, new RegExp(`<strong>${user.email}</strong>: not confirmed`))
      const newEmail = `page_${uniqueName()}@example.test`
      const posted = await t.app.inject({ method: 'POST', url: '/auth/account/email', headers: { cookie, origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: `email=${encodeURIComponent(newEmail)}` })
      assert.equal(posted.statusCode, 202, posted.body)
      assert.match(posted.body, new RegExp(`A confirmation link was mailed to ${newEmail}`))
      const { token } = await confirmationMail(newEmail)
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/verify-email', headers: { origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: `token=${token}` })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      assert.match(confirmed.body, /is now the confirmed address/)
      assert.equal((await readUser(t, user.id)).email, newEmail)
    })

    it('refuses an expired confirmation', async () => {
      const user = await signedInUser(t)
      await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: {} })
      const { token } = await confirmationMail(user.email)
      await t.app.db.updateTable('account_tokens').set({ expires_at: new Date(Date.now() - 1000).toISOString() }).where('user_id', '=', user.id).execute()
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token } })).json().code, 'token_invalid')
    })
  })

  describe(`e-mail verification without SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('says no mail can be sent, and changes nothing', async () => {
      const user = await signedInUser(t)
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/me/email', headers: user.bearer, payload: { email: `x_${uniqueName()}@example.test` } })
      assert.equal(res.statusCode, 409)
      assert.equal(res.json().code, 'mail_unavailable')
      assert.equal((await readUser(t, user.id)).email, user.email)
    })
  })
}
