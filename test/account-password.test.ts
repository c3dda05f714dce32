import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { mailSettings, smtpForThisFile } from './mail-flows.ts'

const smtp = await smtpForThisFile()
const NEW_PASSWORD = 'a passphrase typed on the account page'
const FORM = { origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }

async function signedInUser (t: TestApp): Promise<{ id: string, username: string, email: string, cookie: string, token: string }> {
  const username = uniqueName('pwpage')
  const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, password: GOOD_PASSWORD } })
  assert.equal(created.statusCode, 201, created.body)
  const session = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  assert.equal(session.statusCode, 200, session.body)
  const token = session.json().token as string
  return { ...created.json(), cookie: `gatehouse_session=${token}`, token }
}

async function post (t: TestApp, cookie: string, fields: Record<string, string>) {
  return await t.app.inject({ method: 'POST', url: '/auth/account/password', headers: { ...FORM, cookie }, payload: new URLSearchParams(fields).toString() })
}

for (const dialect of dialects()) {
  describe(`the account page's password form (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(smtp))

    it('changes the password with the current one, as PUT /api/me/password does: event, notice mail, other sessions ended, this one kept', async () => {
      const user = await signedInUser(t)
      const other = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })
      const page = await t.app.inject({ url: '/auth/account', headers: { cookie: user.cookie } })
      assert.equal(page.statusCode, 200)
      assert.match(page.body, /<form method="post" action="\/auth\/account\/password">/)
      assert.match(page.body, /autocomplete="current-password"/)

      const changed = await post(t, user.cookie, { current_password: GOOD_PASSWORD, new_password: NEW_PASSWORD, confirm: NEW_PASSWORD })
      assert.equal(changed.statusCode, 303, changed.body)
      assert.equal(changed.headers.location, '/auth/account?password_changed=1')
      const after = await t.app.inject({ url: changed.headers.location, headers: { cookie: user.cookie } })
      assert.equal(after.statusCode, 200)
      assert.match(after.body, /Your password is changed\./)

      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${other.json().token}` } })).statusCode, 401)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: NEW_PASSWORD } })).statusCode, 200)
      const events = await t.app.db.selectFrom('events').select('type').where('target_id', '=', user.id).where('type', '=', 'user.password_changed').execute()
      assert.equal(events.length, 1)
      const notice = await smtp.waitForMail(user.email, { subject: /password/i })
      assert.match(notice.text, /was changed/)
    })

    it('refuses a wrong current password (401), two different new ones and a password the rules refuse (422) on the page, changing nothing', async () => {
      const user = await signedInUser(t)
      const wrong = await post(t, user.cookie, { current_password: 'not it at all, sorry', new_password: NEW_PASSWORD, confirm: NEW_PASSWORD })
      assert.equal(wrong.statusCode, 401)
      assert.match(String(wrong.headers['content-type']), /^text\/html/)
      assert.match(wrong.body, /<p class="error" role="alert" id="error">The current password is not right\.<\/p>/)
      const differ = await post(t, user.cookie, { current_password: GOOD_PASSWORD, new_password: NEW_PASSWORD, confirm: 'something else entirely' })
      assert.equal(differ.statusCode, 422)
      assert.match(differ.body, /<p class="error" role="alert" id="error">The two new passwords differ/)
      const weak = await post(t, user.cookie, { current_password: GOOD_PASSWORD, new_password: 'short', confirm: 'short' })
      assert.equal(weak.statusCode, 422)
      assert.match(String(weak.headers['content-type']), /^text\/html/)
      assert.match(weak.body, /<p class="error" role="alert" id="error">/)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })).statusCode, 200)
      const events = await t.app.db.selectFrom('events').select('type').where('target_id', '=', user.id).where('type', '=', 'user.password_changed').execute()
      assert.equal(events.length, 0)
    })

    it('refuses a post from another origin, and sends a browser without a session to sign in', async () => {
      const user = await signedInUser(t)
      const forged = await t.app.inject({ method: 'POST', url: '/auth/account/password', headers: { ...FORM, origin: 'https://evil.example', cookie: user.cookie }, payload: new URLSearchParams({ current_password: GOOD_PASSWORD, new_password: NEW_PASSWORD, confirm: NEW_PASSWORD }).toString() })
      assert.equal(forged.statusCode, 403)
      const anonymous = await post(t, '', { current_password: GOOD_PASSWORD, new_password: NEW_PASSWORD, confirm: NEW_PASSWORD })
      assert.equal(anonymous.statusCode, 303)
      assert.match(String(anonymous.headers.location), /\/auth\/login\?next=/)
    })

    it('links the account page from the page shown after sign-in', async () => {
      const user = await signedInUser(t)
      const signedIn = await t.app.inject({ url: '/auth/login', headers: { cookie: user.cookie } })
      assert.equal(signedIn.statusCode, 200)
      assert.match(signedIn.body, /<a href="\/auth\/account" id="account-link">Your account<\/a>/)
    })
  })
}
