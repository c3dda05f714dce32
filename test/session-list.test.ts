import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

const ORIGIN = 'http://localhost:80'
const FORM = 'application/x-www-form-urlencoded'
const FIREFOX_WINDOWS = 'Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0'
const SAFARI_IPHONE = 'Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1'
const CHROME_MAC = 'Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36'

interface Listed {
  id: string
  created_at: string
  last_seen_at: string
  expires_at: string
  client_ip: string | null
  user_agent: string | null
  device: string | null
  method: string | null
  provider: string | null
  mfa: boolean
  current: boolean
}

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function login (t: TestApp, username: string, userAgent = FIREFOX_WINDOWS, from = '127.0.0.1'): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', headers: { 'user-agent': userAgent }, payload: { username, password: GOOD_PASSWORD }, remoteAddress: from })
}

async function signedIn (t: TestApp, username: string, userAgent = FIREFOX_WINDOWS, from = '127.0.0.1'): Promise<{ token: string, sessionId: string }> {
  const res = await login(t, username, userAgent, from)
  assert.equal(res.statusCode, 200, res.body)
  return { token: res.json().token, sessionId: res.json().session_id }
}

const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })

async function listed (t: TestApp, token: string): Promise<Listed[]> {
  const res = await t.app.inject({ url: '/auth/api/me/sessions', headers: bearer(token) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function meStatus (t: TestApp, token: string): Promise<number> {
  return (await t.app.inject({ url: '/auth/api/me', headers: bearer(token) })).statusCode
}

async function sessionEndedEvents (t: TestApp, sessionId: string): Promise<Array<{ data: Record<string, unknown>, actor: { type: string, id: string | null } }>> {
  const res = await t.app.inject({ url: `/auth/api/events?type=session.ended&target_id=${sessionId}`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function formPost (t: TestApp, token: string, url: string, origin = ORIGIN): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url, headers: { cookie: `gatehouse_session=${token}`, 'content-type': FORM, origin }, payload: '' })
}

for (const dialect of dialects()) {
  describe(`sessions a person can see (${dialect.name})`, () => {
    const t = useTestApp(dialect, { mfaEncryptionKey: randomBytes(32) })

    it('lists your live sessions: this one marked current, another sign-in with its device, address and method; ended and idle ones are left out', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username, FIREFOX_WINDOWS, '203.0.113.7')
      const phone = await signedIn(t, user.username, SAFARI_IPHONE, '198.51.100.20')
      const gone = await signedIn(t, user.username, CHROME_MAC)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/logout', headers: bearer(gone.token) })).statusCode, 204)
      const idle = await signedIn(t, user.username, CHROME_MAC)
      await t.app.db.updateTable('sessions').set({ last_seen_at: new Date(Date.now() - t.app.config.sessionIdleTimeoutMs - 1000).toISOString() })
        .where('id', '=', idle.sessionId).execute()

      const sessions = await listed(t, here.token)
      assert.deepEqual(sessions.map(s => s.id).sort(), [here.sessionId, phone.sessionId].sort())
      const mine = sessions.find(s => s.id === here.sessionId)!
      const other = sessions.find(s => s.id === phone.sessionId)!
      assert.equal(mine.current, true)
      assert.equal(other.current, false)
      assert.equal(mine.device, 'Firefox 133 on Windows')
      assert.equal(other.device, 'Mobile Safari 17 on iOS')
      assert.equal(other.user_agent, SAFARI_IPHONE)
      assert.equal(mine.client_ip, '203.0.113.7')
      assert.equal(other.client_ip, '198.51.100.20')
      for (const s of sessions) {
        assert.equal(s.method, 'password')
        assert.equal(s.provider, null)
        assert.equal(s.mfa, false)
        assert.ok(Date.parse(s.created_at) <= Date.parse(s.last_seen_at) && Date.parse(s.last_seen_at) < Date.parse(s.expires_at), JSON.stringify(s))
      }
      // From the other device, the other one is current.
      assert.deepEqual((await listed(t, phone.token)).filter(s => s.current).map(s => s.id), [phone.sessionId])
    })

    it('names a program by its product token and shows a session from before the method was recorded as null', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username, 'curl/8.5.0')
      await t.app.db.updateTable('sessions').set({ sign_in_method: null }).where('id', '=', here.sessionId).execute()
      const [session] = await listed(t, here.token)
      assert.equal(session!.device, 'curl/8.5.0')
      assert.equal(session!.method, null)
    })

    it('records a TOTP second step as a password sign-in with a second factor', async () => {
      const user = await createUser(t)
      const first = await signedIn(t, user.username)
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer(first.token) })
      assert.equal(setup.statusCode, 200, setup.body)
      const secret = setup.json().secret as string
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer(first.token), payload: { code: await generate({ secret }) } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)

      const challenge = await login(t, user.username, SAFARI_IPHONE)
      assert.equal(challenge.statusCode, 202, challenge.body)
      // The next time step: the enrolment spent this one.
      const code = await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 })
      const done = await t.app.inject({
        method: 'POST', url: '/auth/api/login/mfa', headers: { 'user-agent': SAFARI_IPHONE }, payload: { challenge_token: challenge.json().challenge_token, totp_code: code }
      })
      assert.equal(done.statusCode, 200, done.body)
      const second = (await listed(t, first.token)).find(s => s.id === done.json().session_id)!
      assert.deepEqual([second.method, second.mfa, second.device], ['password', true, 'Mobile Safari 17 on iOS'])
    })

    it('ends one of your sessions: its token is 401 at once, the current one goes on, and the event says ended_by_user', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username)
      const phone = await signedIn(t, user.username, SAFARI_IPHONE)
      assert.equal(await meStatus(t, phone.token), 200)
      const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/me/sessions/${phone.sessionId}`, headers: bearer(here.token) })
      assert.equal(res.statusCode, 204, res.body)
      assert.equal(await meStatus(t, phone.token), 401)
      assert.equal(await meStatus(t, here.token), 200)
      assert.deepEqual((await listed(t, here.token)).map(s => s.id), [here.sessionId])
      const [event] = await sessionEndedEvents(t, phone.sessionId)
      assert.deepEqual(event!.data, { reason: 'ended_by_user', user_id: user.id })
      assert.deepEqual(event!.actor, { type: 'user', id: user.id })
      // Ended already: not found a second time.
      const again = await t.app.inject({ method: 'DELETE', url: `/auth/api/me/sessions/${phone.sessionId}`, headers: bearer(here.token) })
      assert.equal(again.statusCode, 404)
      assert.equal(again.json().code, 'session_not_found')
    })

    it('ending the current session signs it out and clears the cookie', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username)
      const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/me/sessions/${here.sessionId}`, headers: bearer(here.token) })
      assert.equal(res.statusCode, 204)
      assert.ok(res.cookies.some(c => c.name === 'gatehouse_session' && c.value === ''), 'the cookie is cleared')
      assert.equal(await meStatus(t, here.token), 401)
    })

    it('ends all your other sessions and keeps the current one', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username)
      const others = [await signedIn(t, user.username, SAFARI_IPHONE), await signedIn(t, user.username, CHROME_MAC)]
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/me/sessions/end-others', headers: bearer(here.token) })
      assert.equal(res.statusCode, 200, res.body)
      assert.deepEqual(res.json(), { ended: 2 })
      for (const other of others) {
        assert.equal(await meStatus(t, other.token), 401)
        assert.equal((await sessionEndedEvents(t, other.sessionId))[0]?.data.reason, 'ended_by_user')
      }
      assert.equal(await meStatus(t, here.token), 200)
      assert.deepEqual((await listed(t, here.token)).map(s => s.id), [here.sessionId])
    })

    it('never shows or ends another user\'s session (404), and takes no API key for your own sessions (403)', async () => {
      const ada = await createUser(t)
      const bob = await createUser(t)
      const adaSession = await signedIn(t, ada.username)
      const bobSession = await signedIn(t, bob.username)
      assert.deepEqual((await listed(t, adaSession.token)).map(s => s.id), [adaSession.sessionId])
      const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/me/sessions/${bobSession.sessionId}`, headers: bearer(adaSession.token) })
      assert.equal(res.statusCode, 404)
      assert.equal(res.json().code, 'session_not_found')
      assert.equal(await meStatus(t, bobSession.token), 200, 'Bob is still signed in')
      // Nor through a user's admin route, which needs admin.
      assert.equal((await t.app.inject({ url: `/auth/api/users/${bob.id}/sessions`, headers: bearer(adaSession.token) })).statusCode, 403)
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${bob.id}/sessions/${bobSession.sessionId}`, headers: bearer(adaSession.token) })).statusCode, 403)
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${bob.id}/sessions`, headers: bearer(adaSession.token) })).statusCode, 403)
      assert.equal(await meStatus(t, bobSession.token), 200)

      // A key an admin made with their session is theirs; it still cannot manage their sessions, nor can a deployment key.
      const admin = await createUser(t, { role: 'admin' })
      const adminSession = await signedIn(t, admin.username)
      const key = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: bearer(adminSession.token), payload: { name: 'mine' } })
      assert.equal(key.statusCode, 201, key.body)
      for (const credential of [key.json().key as string, t.adminKey]) {
        for (const [method, url] of [['GET', '/auth/api/me/sessions'], ['DELETE', `/auth/api/me/sessions/${adminSession.sessionId}`], ['POST', '/auth/api/me/sessions/end-others']] as const) {
          const refused = await t.app.inject({ method, url, headers: auth(credential) })
          assert.equal(refused.statusCode, 403, `${method} ${url}: ${refused.body}`)
        }
      }
      assert.equal(await meStatus(t, adminSession.token), 200)
      assert.equal((await t.app.inject({ url: '/auth/api/me/sessions', headers: bearer(adaSession.token) })).statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/api/me/sessions' })).statusCode, 401)
    })

    it('lets an admin list a user\'s sessions, end one (ended_by_admin) and end all; unknown users and sessions are 404', async () => {
      const user = await createUser(t)
      const one = await signedIn(t, user.username, SAFARI_IPHONE, '198.51.100.5')
      const two = await signedIn(t, user.username, CHROME_MAC)
      const list = await t.app.inject({ url: `/auth/api/users/${user.id}/sessions`, headers: auth(t.adminKey) })
      assert.equal(list.statusCode, 200, list.body)
      const sessions = list.json() as Listed[]
      assert.deepEqual(sessions.map(s => s.id).sort(), [one.sessionId, two.sessionId].sort())
      assert.ok(sessions.every(s => !s.current), 'an API key has no session of its own')
      assert.equal(sessions.find(s => s.id === one.sessionId)!.device, 'Mobile Safari 17 on iOS')

      const ended = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions/${one.sessionId}`, headers: auth(t.adminKey) })
      assert.equal(ended.statusCode, 204, ended.body)
      assert.equal(await meStatus(t, one.token), 401)
      assert.equal(await meStatus(t, two.token), 200)
      assert.equal((await sessionEndedEvents(t, one.sessionId))[0]?.data.reason, 'ended_by_admin')

      // A session of someone else, named under this user: not found, and left alone.
      const stranger = await createUser(t)
      const strangerSession = await signedIn(t, stranger.username)
      const wrongUser = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions/${strangerSession.sessionId}`, headers: auth(t.adminKey) })
      assert.equal(wrongUser.statusCode, 404)
      assert.equal(wrongUser.json().code, 'session_not_found')
      assert.equal(await meStatus(t, strangerSession.token), 200)
      const nobody = randomUUID()
      assert.equal((await t.app.inject({ url: `/auth/api/users/${nobody}/sessions`, headers: auth(t.adminKey) })).json().code, 'user_not_found')
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${nobody}/sessions/${two.sessionId}`, headers: auth(t.adminKey) })).json().code, 'user_not_found')

      const all = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions`, headers: auth(t.adminKey) })
      assert.equal(all.statusCode, 200, all.body)
      assert.deepEqual(all.json(), { ended: 1 })
      assert.equal(await meStatus(t, two.token), 401)
      assert.equal(await meStatus(t, strangerSession.token), 200)
    })

    it('shows "Where you\'re signed in" on the account page, and its End and End all other sessions buttons work', async () => {
      const user = await createUser(t)
      const here = await signedIn(t, user.username)
      const phone = await signedIn(t, user.username, SAFARI_IPHONE, '198.51.100.9')
      const laptop = await signedIn(t, user.username, CHROME_MAC)
      const page = await t.app.inject({ url: '/auth/account', headers: { cookie: `gatehouse_session=${here.token}` } })
      assert.equal(page.statusCode, 200, page.body)
      assert.match(page.body, /<h2 id="sessions-title">Where you're signed in<\/h2>/)
      assert.match(page.body, new RegExp(`<li data-session="${here.sessionId}"><strong>Firefox 133 on Windows</strong> <span id="this-browser">\\(this browser\\)</span>`))
      assert.match(page.body, /<strong>Mobile Safari 17 on iOS<\/strong>/)
      assert.match(page.body, /Password · from 198\.51\.100\.9/)
      assert.doesNotMatch(page.body, new RegExp(`/auth/account/sessions/${here.sessionId}/end`), 'no End button for this browser: Sign out is that')
      assert.match(page.body, new RegExp(`<form method="post" action="/auth/account/sessions/${phone.sessionId}/end">`))
      assert.match(page.body, /id="end-others">End all other sessions</)

      // Another site's form cannot end a session.
      const forged = await formPost(t, here.token, `/auth/account/sessions/${phone.sessionId}/end`, 'https://evil.example')
      assert.equal(forged.statusCode, 403)
      assert.equal(await meStatus(t, phone.token), 200)

      const endOne = await formPost(t, here.token, `/auth/account/sessions/${phone.sessionId}/end`)
      assert.equal(endOne.statusCode, 303, endOne.body)
      assert.equal(endOne.headers.location, '/auth/account?sessions_ended=1')
      assert.equal(await meStatus(t, phone.token), 401)
      assert.equal(await meStatus(t, laptop.token), 200)
      const after = await t.app.inject({ url: String(endOne.headers.location), headers: { cookie: `gatehouse_session=${here.token}` } })
      assert.match(after.body, /One session ended\./)
      assert.doesNotMatch(after.body, new RegExp(phone.sessionId))

      const endOthers = await formPost(t, here.token, '/auth/account/sessions/end-others')
      assert.equal(endOthers.statusCode, 303)
      assert.equal(endOthers.headers.location, '/auth/account?sessions_ended=1')
      assert.equal(await meStatus(t, laptop.token), 401)
      assert.equal(await meStatus(t, here.token), 200)
      const last = await t.app.inject({ url: '/auth/account', headers: { cookie: `gatehouse_session=${here.token}` } })
      assert.match(last.body, /No other sessions\./)
      assert.doesNotMatch(last.body, /id="end-others"/)

      // Another user's session id, or no id at all, ends nothing.
      const stranger = await signedIn(t, (await createUser(t)).username)
      const refused = await formPost(t, here.token, `/auth/account/sessions/${stranger.sessionId}/end`)
      assert.equal(refused.statusCode, 404)
      assert.match(refused.body, /No live session has the id/)
      assert.equal((await formPost(t, here.token, '/auth/account/sessions/not-a-session/end')).statusCode, 404)
      assert.equal(await meStatus(t, stranger.token), 200)
    })

    it('shows a user\'s sessions on their console page, where an admin ends one with its End button', async () => {
      const admin = await createUser(t, { role: 'admin' })
      const adminSession = await signedIn(t, admin.username)
      const user = await createUser(t)
      const phone = await signedIn(t, user.username, SAFARI_IPHONE, '198.51.100.30')
      const laptop = await signedIn(t, user.username, CHROME_MAC)
      const page = await t.app.inject({ url: `/auth/admin/users/${user.id}`, headers: { cookie: `gatehouse_session=${adminSession.token}` } })
      assert.equal(page.statusCode, 200, page.body)
      assert.match(page.body, /<h2 id="sessions-title">Sessions<\/h2>/)
      assert.match(page.body, new RegExp(`<tr data-session="${phone.sessionId}">\\n<td data-label="Device">Mobile Safari 17 on iOS`))
      assert.match(page.body, /<td data-label="Address">198\.51\.100\.30<\/td>/)
      assert.match(page.body, /<td data-label="Signed in with">Password<\/td>/)
      assert.match(page.body, new RegExp(`<form method="post" action="/auth/admin/users/${user.id}/sessions/${phone.sessionId}/end"`))

      const res = await formPost(t, adminSession.token, `/auth/admin/users/${user.id}/sessions/${phone.sessionId}/end`)
      assert.equal(res.statusCode, 303, res.body)
      assert.equal(res.headers.location, `/auth/admin/users/${user.id}?done=session-ended`)
      assert.equal(await meStatus(t, phone.token), 401)
      assert.equal(await meStatus(t, laptop.token), 200)
      assert.equal((await sessionEndedEvents(t, phone.sessionId))[0]?.data.reason, 'ended_by_admin')
      const after = await t.app.inject({ url: String(res.headers.location), headers: { cookie: `gatehouse_session=${adminSession.token}` } })
      assert.match(after.body, /The session has ended/)
      assert.doesNotMatch(after.body, new RegExp(`data-session="${phone.sessionId}"`))

      // A plain user gets no console.
      assert.equal((await formPost(t, laptop.token, `/auth/admin/users/${user.id}/sessions/${laptop.sessionId}/end`)).statusCode, 403)
      assert.equal(await meStatus(t, laptop.token), 200)
    })
  })
}
