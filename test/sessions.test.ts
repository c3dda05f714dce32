import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { hash } from '@node-rs/argon2'
import type { LightMyRequestResponse } from 'fastify'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

const ORIGIN = 'http://localhost:80'

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function login (t: TestApp, username: string, password = GOOD_PASSWORD, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', headers, payload: { username, password } })
}

function sessionCookie (res: LightMyRequestResponse): string {
  const cookie = res.cookies.find(c => c.name === 'gatehouse_session' || c.name === '__Host-gatehouse_session')
  assert.ok(cookie, 'a session cookie is set')
  return `${cookie.name}=${cookie.value}`
}

/** What a failed sign-in shows a caller, minus what differs per request anyway. */
function failureShape (res: LightMyRequestResponse): unknown {
  const { request_id: _r, ...body } = res.json()
  const headers = Object.keys(res.headers).filter(h => !['x-request-id', 'date', 'content-length'].includes(h)).sort()
  // The general limiter's counters change with every request from an address, whatever the account: names only.
  const counters = new Set(['ratelimit-remaining', 'ratelimit-reset'])
  return { status: res.statusCode, body, headers: headers.map(h => [h, counters.has(h) ? '' : res.headers[h]]) }
}

for (const dialect of dialects()) {
  describe(`sign-in and sessions (${dialect.name})`, () => {
    const t = useTestApp(dialect, { accountLockThreshold: 3 })

    it('signs in by username or email, returning a token and setting an HttpOnly SameSite=Lax cookie', async () => {
      const email = `${uniqueName()}@example.com`
      const user = await createUser(t, { email })
      for (const identifier of [user.username, user.username.toUpperCase(), email.toUpperCase()]) {
        const res = await login(t, identifier)
        assert.equal(res.statusCode, 200, res.body)
        const body = res.json()
        assert.match(body.token, /^gatehouse_session_[0-9A-Za-z]{43}$/)
        assert.equal(body.token_type, 'Bearer')
        assert.equal(body.user.id, user.id)
        assert.ok(body.user.last_login_at)
        const cookie = res.cookies.find(c => c.name === 'gatehouse_session')!
        assert.equal(cookie.value, body.token)
        assert.equal(cookie.httpOnly, true)
        assert.equal(cookie.sameSite, 'Lax')
        assert.equal(cookie.path, '/')
        assert.equal(cookie.secure, undefined, 'no Secure flag over plain HTTP')
      }
      const rows = await t.app.db.selectFrom('sessions').selectAll().where('user_id', '=', user.id).execute()
      assert.equal(rows.length, 3)
      assert.equal(new Set(rows.map(r => r.digest)).size, 3, 'a new token at every sign-in')
    })

    it('accepts a form-encoded sign-in', async () => {
      const user = await createUser(t)
      const res = await t.app.inject({
        method: 'POST',
        url: '/auth/api/login',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: new URLSearchParams({ username: user.username, password: GOOD_PASSWORD }).toString()
      })
      assert.equal(res.statusCode, 200, res.body)
    })

    it('reads the signed-in user from GET /api/me with the token or the cookie', async () => {
      const user = await createUser(t)
      const res = await login(t, user.username)
      const byToken = await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${res.json().token}` } })
      assert.equal(byToken.statusCode, 200)
      assert.equal(byToken.json().id, user.id)
      const byCookie = await t.app.inject({ url: '/auth/api/me', headers: { cookie: sessionCookie(res) } })
      assert.equal(byCookie.json().id, user.id)
      const byHeader = await t.app.inject({ url: '/auth/api/me', headers: { 'x-api-key': res.json().token } })
      assert.equal(byHeader.json().id, user.id)
      // The same ETag as Get User's, so that an If-Match on Update User can follow a read of /me.
      const read = await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
      assert.match(String(byToken.headers.etag), /^"\d+"$/)
      assert.equal(byToken.headers.etag, read.headers.etag)
      const renamed = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { authorization: `Bearer ${res.json().token}`, 'if-match': byToken.headers.etag as string }, payload: { first_name: 'Ada' } })
      assert.equal(renamed.statusCode, 200, renamed.body)
      assert.notEqual((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${res.json().token}` } })).headers.etag, byToken.headers.etag)
      const byDeploymentKey = await t.app.inject({ url: '/auth/api/me', headers: auth(t.adminKey) })
      assert.equal(byDeploymentKey.statusCode, 403)
    })

    it('records the client\'s User-Agent (its first 512 characters) on every sign-in event, success and failure', async () => {
      const user = await createUser(t)
      const browser = 'Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/133.0'
      assert.equal((await login(t, user.username, 'not the password at all', { 'user-agent': browser })).statusCode, 401)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'user-agent': `${browser} ${'x'.repeat(600)}` })).statusCode, 200)
      const unknown = `probe/${uniqueName()}`
      const before = new Date(Date.now() - 1000).toISOString()
      assert.equal((await login(t, `nobody_${uniqueName()}`, GOOD_PASSWORD, { 'user-agent': unknown })).statusCode, 401)
      const events = (await t.app.inject({ url: `/auth/api/events?target_id=${user.id}&limit=100`, headers: auth(t.adminKey) })).json() as Array<{ type: string, data: Record<string, unknown> }>
      const failed = events.find(e => e.type === 'user.login_failed')
      const succeeded = events.find(e => e.type === 'user.login_succeeded')
      assert.equal(failed?.data.user_agent, browser)
      assert.equal(succeeded?.data.user_agent, `${browser} ${'x'.repeat(600)}`.slice(0, 512))
      const anonymous = (await t.app.inject({ url: `/auth/api/events?type=user.login_failed&since=${before}&limit=1000`, headers: auth(t.adminKey) })).json() as Array<{ data: Record<string, unknown> }>
      assert.ok(anonymous.some(e => e.data.user_agent === unknown), 'a failure for an unknown name carries it too')
    })

    it('ends the session a browser still holds when it signs in again, as the same user or another (no fixation)', async () => {
      const ada = await createUser(t)
      const grace = await createUser(t)
      const first = await login(t, ada.username)
      assert.equal(first.statusCode, 200, first.body)
      const planted = sessionCookie(first)
      const me = async (cookie: string): Promise<number> => (await t.app.inject({ url: '/auth/api/me', headers: { cookie } })).statusCode
      assert.equal(await me(planted), 200)
      // The same browser, cookie and all, signs in as someone else: the old session must not live on beside the new one.
      const second = await login(t, grace.username, GOOD_PASSWORD, { cookie: planted })
      assert.equal(second.statusCode, 200, second.body)
      assert.equal(await me(planted), 401)
      const current = sessionCookie(second)
      assert.equal(await me(current), 200)
      const ended = (await t.app.inject({ url: `/auth/api/events?type=session.ended&target_id=${first.json().session_id as string}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(ended.map((e: { data: Record<string, unknown> }) => e.data), [{ reason: 'signed_in_again', user_id: ada.id }])
      // Signing in again as the same user ends the previous session too.
      const third = await login(t, grace.username, GOOD_PASSWORD, { cookie: current })
      assert.equal(third.statusCode, 200, third.body)
      assert.equal(await me(current), 401)
      assert.equal(await me(sessionCookie(third)), 200)
    })

    it('answers unknown user, wrong password, disabled and locked accounts identically', async () => {
      const disabled = await createUser(t, { disabled: true })
      const locked = await createUser(t)
      for (let i = 0; i < 3; i++) await login(t, locked.username, 'not the password at all')
      const wrong = await createUser(t)
      const shapes = [
        failureShape(await login(t, 'nobody_' + uniqueName())),
        failureShape(await login(t, wrong.username, 'not the password at all')),
        failureShape(await login(t, disabled.username)),
        failureShape(await login(t, locked.username))
      ]
      for (const shape of shapes.slice(1)) assert.deepEqual(shape, shapes[0])
      assert.equal((shapes[0] as { status: number }).status, 401)
      assert.equal((shapes[0] as { body: { code: string } }).body.code, 'invalid_credentials')
    })

    it('locks an account after repeated failures, records why in events, and unlocks on time', async () => {
      const user = await createUser(t)
      for (let i = 0; i < 3; i++) assert.equal((await login(t, user.username, 'not the password at all')).statusCode, 401)
      assert.equal((await login(t, user.username)).statusCode, 401, 'a locked account refuses even the right password')
      const events = (await t.app.inject({ url: `/auth/api/events?target_id=${user.id}`, headers: auth(t.adminKey) })).json()
      const types = events.map((e: { type: string, data: { reason?: string } }) => `${e.type}${e.data.reason !== undefined ? ':' + e.data.reason : ''}`)
      assert.deepEqual(types.slice(0, 5), ['user.login_failed:locked', 'user.login_failed:wrong_password', 'user.locked', 'user.login_failed:wrong_password', 'user.login_failed:wrong_password'])
      assert.ok(!JSON.stringify(events).includes('not the password at all'))
      await t.app.db.updateTable('users').set({ locked_until: new Date(Date.now() - 1000).toISOString() }).where('id', '=', user.id).execute()
      // Once the lock has run out, the count starts afresh: one more mistake does not lock again.
      assert.equal((await login(t, user.username, 'not the password at all')).statusCode, 401)
      assert.equal((await login(t, user.username)).statusCode, 200)
    })

    it('never takes a session token from the URL, where history, proxies\' logs and Referer headers keep it (401)', async () => {
      const user = await createUser(t, { role: 'admin' })
      const token = (await login(t, user.username)).json().token as string
      const inUrl = await t.app.inject({ url: `/auth/api/me?API_KEY=${token}` })
      assert.equal(inUrl.statusCode, 401)
      assert.equal(inUrl.json().code, 'unauthenticated')
      assert.match(inUrl.json().detail, /never taken from the URL/)
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${token}` } })).statusCode, 200, 'the session itself goes on')
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: { authorization: `Bearer ${token}` }, payload: { name: 'url' } })
      assert.equal(made.statusCode, 201, made.body)
      const key = made.json()
      assert.equal((await t.app.inject({ url: `/auth/api/me?API_KEY=${key.key as string}` })).statusCode, 200, 'an API key still may')
    })

    it('signs out: the token and the cookie stop working at once', async () => {
      const user = await createUser(t)
      const res = await login(t, user.username)
      const token = res.json().token
      const out = await t.app.inject({ method: 'POST', url: '/auth/api/logout', headers: { authorization: `Bearer ${token}` } })
      assert.equal(out.statusCode, 204)
      assert.ok(out.cookies.some(c => c.name === 'gatehouse_session' && c.value === ''), 'the cookie is cleared')
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${token}` } })).statusCode, 401)
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { cookie: sessionCookie(res) } })).statusCode, 401)
    })

    it('purges sessions that ended or expired more than a day ago, keeping live ones', async () => {
      const { deleteSessionsEndedBefore } = await import('../src/sessions/sessions.repository.ts')
      const user = await createUser(t)
      const live = (await login(t, user.username)).json()
      const ended = (await login(t, user.username)).json()
      const expired = (await login(t, user.username)).json()
      const twoDaysAgo = new Date(Date.now() - 2 * 86_400_000).toISOString()
      await t.app.db.updateTable('sessions').set({ ended_at: twoDaysAgo }).where('id', '=', ended.session_id).execute()
      await t.app.db.updateTable('sessions').set({ expires_at: twoDaysAgo }).where('id', '=', expired.session_id).execute()
      await deleteSessionsEndedBefore(t.app.db, new Date(Date.now() - 86_400_000).toISOString())
      const left = await t.app.db.selectFrom('sessions').select('id').where('user_id', '=', user.id).execute()
      assert.deepEqual(left.map(s => s.id), [live.session_id])
    })

    it('ends sessions after the idle and the absolute time-out', async () => {
      const user = await createUser(t)
      const idle = (await login(t, user.username)).json()
      const absolute = (await login(t, user.username)).json()
      await t.app.db.updateTable('sessions').set({ last_seen_at: new Date(Date.now() - t.config.sessionIdleTimeoutMs - 1000).toISOString() }).where('id', '=', idle.session_id).execute()
      await t.app.db.updateTable('sessions').set({ expires_at: new Date(Date.now() - 1000).toISOString() }).where('id', '=', absolute.session_id).execute()
      for (const token of [idle.token, absolute.token]) {
        assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${token}` } })).statusCode, 401)
      }
    })

    it('lets a signed-in user read and edit only their own profile fields', async () => {
      const me = await createUser(t, { email: `${uniqueName()}@example.com` })
      const other = await createUser(t)
      const token = (await login(t, me.username)).json().token
      const bearer = { authorization: `Bearer ${token}` }
      assert.equal((await t.app.inject({ url: `/auth/api/users/${me.id}`, headers: bearer })).statusCode, 200)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${other.id}`, headers: bearer })).statusCode, 403)
      assert.equal((await t.app.inject({ url: '/auth/api/users', headers: bearer })).statusCode, 403)
      assert.equal((await t.app.inject({ url: '/auth/api/events', headers: bearer })).statusCode, 403)
      const own = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${me.id}`, headers: bearer, payload: { first_name: 'Me', email: null } })
      assert.equal(own.statusCode, 200, own.body)
      const before = (await t.app.inject({ url: `/auth/api/users/${me.id}`, headers: auth(t.adminKey) })).json()
      for (const payload of [{ role: 'admin' }, { groups: ['ops'] }, { disabled: true }, { username: uniqueName() }, { password: 'another long passphrase' }]) {
        const res = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${me.id}`, headers: bearer, payload })
        assert.equal(res.statusCode, 403, JSON.stringify(payload))
      }
      assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${other.id}`, headers: bearer, payload: { first_name: 'X' } })).statusCode, 403)
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${me.id}`, headers: bearer })).statusCode, 403)
      const after = (await t.app.inject({ url: `/auth/api/users/${me.id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(after, before, 'refused changes leave the row as it was')
    })

    it('lets an admin do through a session what an admin key can', async () => {
      const admin = await createUser(t, { role: 'admin' })
      const token = (await login(t, admin.username)).json().token
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { authorization: `Bearer ${token}` }, payload: { username: uniqueName() } })
      assert.equal(created.statusCode, 201)
      const events = (await t.app.inject({ url: `/auth/api/events?target_id=${created.json().id}`, headers: { authorization: `Bearer ${token}` } })).json()
      assert.deepEqual(events[0].actor, { type: 'user', id: admin.id })
    })

    it('refuses cookie-authenticated writes from another origin (CSRF), but not bearer-authenticated ones', async () => {
      const me = await createUser(t)
      const res = await login(t, me.username)
      const cookie = sessionCookie(res)
      const patch = async (headers: Record<string, string>) =>
        await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${me.id}`, headers, payload: { first_name: 'Csrf' } })
      const noOrigin = await patch({ cookie })
      assert.equal(noOrigin.statusCode, 403)
      assert.equal(noOrigin.json().code, 'csrf_rejected')
      assert.equal((await patch({ cookie, origin: 'https://evil.example' })).statusCode, 403)
      assert.equal((await patch({ cookie, origin: ORIGIN })).statusCode, 200)
      assert.equal((await patch({ cookie, 'sec-fetch-site': 'same-origin' })).statusCode, 200)
      assert.equal((await patch({ cookie, origin: 'null', 'sec-fetch-site': 'same-origin' })).statusCode, 200)
      assert.equal((await patch({ cookie, origin: 'null' })).statusCode, 403, 'an opaque origin alone proves nothing')
      assert.equal((await patch({ cookie, origin: 'null', 'sec-fetch-site': 'cross-site' })).statusCode, 403)
      assert.equal((await patch({ authorization: `Bearer ${res.json().token}` })).statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { cookie, origin: 'https://evil.example' } })).statusCode, 200, 'reads are not writes')
      const crossSiteLogin = await login(t, me.username, GOOD_PASSWORD, { origin: 'https://evil.example' })
      assert.equal(crossSiteLogin.statusCode, 403, 'no login CSRF')
    })

    it('changes the own password with the current one, ending other sessions and revoking the user\'s keys', async () => {
      const me = await createUser(t, { role: 'admin' })
      const current = (await login(t, me.username)).json().token
      const other = (await login(t, me.username)).json().token
      const key = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: { authorization: `Bearer ${current}` }, payload: { name: 'mine' } })).json()
      assert.equal(key.user_id, me.id)
      const put = async (payload: object) => await t.app.inject({ method: 'PUT', url: '/auth/api/me/password', headers: { authorization: `Bearer ${current}` }, payload })
      const wrong = await put({ current_password: 'not the password at all', new_password: 'a brand new passphrase' })
      assert.equal(wrong.statusCode, 401)
      assert.equal((await put({ current_password: GOOD_PASSWORD, new_password: 'password123' })).json().code, 'password_too_common')
      assert.equal((await put({ current_password: GOOD_PASSWORD, new_password: 'a brand new passphrase' })).statusCode, 204)
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${current}` } })).statusCode, 200, 'this session goes on')
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${other}` } })).statusCode, 401, 'other sessions end')
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 401, 'the user\'s keys are revoked')
      assert.equal((await login(t, me.username)).statusCode, 401)
      assert.equal((await login(t, me.username, 'a brand new passphrase')).statusCode, 200)
      const events = (await t.app.inject({ url: `/auth/api/events?type=user.password_changed&target_id=${me.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, 1)
      assert.ok(!JSON.stringify(events).includes('a brand new passphrase'))
    })

    it('changes the own password with the current one however long ago the session signed in, which counts as a re-authentication of the session', async () => {
      const me = await createUser(t)
      const signedIn = (await login(t, me.username)).json()
      const bearer = { authorization: `Bearer ${signedIn.token}` }
      // Signed in longer ago than REAUTH_WINDOW_SECONDS (the row's time moved back, not a wait).
      await t.app.db.updateTable('sessions').set({ created_at: new Date(Date.now() - t.config.reauthWindowMs - 60_000).toISOString() })
        .where('id', '=', signedIn.session_id).execute()
      const factorChange = async () => await t.app.inject({ method: 'POST', url: '/auth/api/me/passkeys/options', headers: bearer })
      assert.equal((await factorChange()).json().code, 'reauthentication_required')
      assert.match((await factorChange()).json().detail, /^This change needs a sign-in or re-authentication within the last 10 minutes\. /)
      const put = await t.app.inject({ method: 'PUT', url: '/auth/api/me/password', headers: bearer, payload: { current_password: GOOD_PASSWORD, new_password: 'a brand new passphrase' } })
      assert.equal(put.statusCode, 204, put.body)
      assert.equal((await factorChange()).statusCode, 200, 'the current password was a recent proof')
    })

    it('ends a user\'s sessions when an admin disables them or sets their password', async () => {
      const user = await createUser(t)
      const first = (await login(t, user.username)).json().token
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { password: 'set by an admin here' } })
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${first}` } })).statusCode, 401)
      const second = (await login(t, user.username, 'set by an admin here')).json().token
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { disabled: true } })
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${second}` } })).statusCode, 401)
      const ended = (await t.app.inject({ url: '/auth/api/events?type=session.ended', headers: auth(t.adminKey) })).json()
      assert.ok(ended.some((e: { data: { reason: string, user_id: string } }) => e.data.user_id === user.id && e.data.reason === 'user_disabled'))
    })

    it('rejects common passwords and passwords containing the username with their codes', async () => {
      for (const [password, code] of [['password123', 'password_too_common'], ['qwertyuiop', 'password_too_common'], ['Iloveyou1', 'password_too_common']]) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password } })
        assert.equal(res.json().code, code, password)
      }
    })

    it('answers /api/verify with identity headers for a valid session or key, 401 otherwise', async () => {
      const user = await createUser(t, { groups: ['etl', 'ops'] })
      const res = await login(t, user.username)
      const ok = await t.app.inject({ url: '/auth/api/verify', headers: { cookie: sessionCookie(res) } })
      assert.equal(ok.statusCode, 200)
      assert.equal(ok.headers['x-auth-user-id'], user.id)
      assert.equal(ok.headers['x-auth-username'], user.username)
      assert.equal(ok.headers['x-auth-role'], 'user')
      assert.equal(ok.headers['x-auth-groups'], 'etl,ops')
      const byKey = await t.app.inject({ url: '/auth/api/verify', headers: auth(t.adminKey) })
      assert.equal(byKey.statusCode, 200)
      assert.equal(byKey.headers['x-auth-role'], 'admin')
      assert.equal((await t.app.inject({ url: '/auth/api/verify' })).statusCode, 401)
      assert.equal((await t.app.inject({ url: '/auth/api/verify', headers: { cookie: 'gatehouse_session=gatehouse_session_' + 'x'.repeat(43) } })).statusCode, 401)
    })

    it('answers /api/verify for a member of groups named in any script, with commas or line breaks, each name percent-encoded', async () => {
      const names = ['データ', 'Бухгалтерия', 'line\r\nbreak', 'north,south', 'Data Team', 'data-eng', '100% ops', 'é']
      const user = await createUser(t, { groups: names })
      const ok = await t.app.inject({ url: '/auth/api/verify', headers: { cookie: sessionCookie(await login(t, user.username)) } })
      assert.equal(ok.statusCode, 200, ok.body)
      const header = ok.headers['x-auth-groups']
      assert.equal(header, '%E3%83%87%E3%83%BC%E3%82%BF,%D0%91%D1%83%D1%85%D0%B3%D0%B0%D0%BB%D1%82%D0%B5%D1%80%D0%B8%D1%8F,line%0D%0Abreak,' +
        'north%2Csouth,Data%20Team,data-eng,100%25%20ops,%C3%A9')
      // The line docs/nginx.md gives the main service.
      assert.deepEqual(String(header ?? '').split(',').filter(Boolean).map(decodeURIComponent), names)
      const none = await createUser(t)
      const empty = await t.app.inject({ url: '/auth/api/verify', headers: { cookie: sessionCookie(await login(t, none.username)) } })
      assert.equal(empty.statusCode, 200)
      assert.deepEqual(String(empty.headers['x-auth-groups'] ?? '').split(',').filter(Boolean).map(decodeURIComponent), [])
    })
  })
}

for (const dialect of dialects()) {
  describe(`credentials in the query string of sign-in and password operations (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const JSON_ROUTES: Array<['POST' | 'PUT', string]> = [
      ['POST', '/auth/api/login'], ['PUT', '/auth/api/me/password'], ['POST', '/auth/api/login/mfa'], ['POST', '/auth/api/login/mfa/totp'],
      ['POST', '/auth/api/login/passkey'], ['POST', '/auth/api/me/reauthenticate'], ['POST', '/auth/api/me/mfa/totp/confirm'],
      ['POST', '/auth/api/invitations/accept'], ['POST', '/auth/api/password-resets'], ['POST', '/auth/api/password-resets/complete']
    ]
    const FORM_ROUTES = ['/auth/login', '/auth/login/mfa', '/auth/login/passkey', '/auth/account/reauthenticate', '/auth/account/totp/confirm',
      '/auth/invitation', '/auth/forgot-password', '/auth/reset-password']

    it('refuses a password, code or token in the query string with 400 credentials_in_query, on every such operation', async () => {
      const user = await createUser(t)
      const cookie = sessionCookie(await login(t, user.username))
      for (const query of ['password=hunter2', 'PassWord=hunter2', 'pass%77ord=hunter2', 'new_password=x', 'code=123456', 'token=abc', 'API_KEY=k']) {
        for (const [method, url] of JSON_ROUTES) {
          const res = await t.app.inject({ method, url: `${url}?${query}`, headers: { cookie }, payload: {} })
          assert.equal(res.statusCode, 400, `${method} ${url}?${query}: ${res.body}`)
          assert.equal(res.json().code, 'credentials_in_query', `${method} ${url}?${query}`)
        }
        for (const url of FORM_ROUTES) {
          const res = await t.app.inject({ method: 'POST', url: `${url}?${query}`, headers: { cookie, origin: ORIGIN, 'content-type': 'application/x-www-form-urlencoded' }, payload: '' })
          assert.equal(res.statusCode, 400, `POST ${url}?${query}: ${res.body}`)
          assert.equal(res.json().code, 'credentials_in_query', `POST ${url}?${query}`)
        }
      }
    })

    it('does not sign in when the password is also in the query string, and signs in with it in the body alone', async () => {
      const user = await createUser(t)
      const refused = await t.app.inject({ method: 'POST', url: `/auth/api/login?password=${encodeURIComponent(GOOD_PASSWORD)}`, payload: { username: user.username, password: GOOD_PASSWORD } })
      assert.equal(refused.statusCode, 400)
      assert.equal(refused.cookies.length, 0)
      assert.ok(!refused.body.includes(GOOD_PASSWORD.split(' ')[0]!), 'the answer does not echo the password')
      const events = await t.app.inject({ url: `/auth/api/events?type=user.login_succeeded&target_id=${user.id}`, headers: auth(t.adminKey) })
      assert.deepEqual(events.json(), [])
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login?next=/pipelines', payload: { username: user.username, password: GOOD_PASSWORD } })).statusCode, 200)
    })
  })
}

for (const dialect of dialects()) {
  describe(`the re-authentication window in words (${dialect.name})`, () => {
    for (const [seconds, words] of [[60, '1 minute'], [90, '90 seconds'], [120, '2 minutes']] as const) {
      it(`says "${words}" for REAUTH_WINDOW_SECONDS=${seconds}`, async () => {
        const t = await createTestApp(dialect, { reauthWindowMs: seconds * 1000 })
        try {
          const me = await createUser(t)
          const signedIn = (await login(t, me.username)).json()
          await t.app.db.updateTable('sessions').set({ created_at: new Date(Date.now() - seconds * 1000 - 60_000).toISOString() })
            .where('id', '=', signedIn.session_id).execute()
          const res = await t.app.inject({ method: 'POST', url: '/auth/api/me/passkeys/options', headers: { authorization: `Bearer ${signedIn.token}` } })
          assert.equal(res.json().code, 'reauthentication_required', res.body)
          assert.match(res.json().detail, new RegExp(`within the last ${words}\\. `))
        } finally {
          await t.app.close()
        }
      })
    }
  })
}

for (const dialect of dialects()) {
  describe(`hash upgrade at sign-in (${dialect.name})`, () => {
    const t = useTestApp(dialect, { argon2TimeCost: 3 })

    it('replaces a hash made with weaker parameters at the next successful sign-in', async () => {
      const user = await createUser(t)
      // The ASVS floor (t=2), as a deployment that has since raised its time cost would have stored it.
      const weaker = await hash(GOOD_PASSWORD, { algorithm: 2, memoryCost: 19456, timeCost: 2, parallelism: 1 })
      await t.app.db.updateTable('users').set({ password_hash: weaker }).where('id', '=', user.id).execute()
      assert.equal((await login(t, user.username, 'not the password at all')).statusCode, 401)
      const unchanged = await t.app.db.selectFrom('users').select('password_hash').where('id', '=', user.id).executeTakeFirstOrThrow()
      assert.equal(unchanged.password_hash, weaker, 'a failed sign-in changes nothing')
      assert.equal((await login(t, user.username)).statusCode, 200)
      const row = await t.app.db.selectFrom('users').select('password_hash').where('id', '=', user.id).executeTakeFirstOrThrow()
      assert.match(row.password_hash!, /^\$argon2id\$v=19\$m=19456,t=3,p=1\$/)
      assert.equal((await login(t, user.username)).statusCode, 200, 'the new hash verifies')
      const events = (await t.app.inject({ url: `/auth/api/events?type=user.login_succeeded&target_id=${user.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(events.at(-1).data.password_rehashed, true)
    })
  })
}

for (const dialect of dialects()) {
  describe(`a password change racing a sign-in (${dialect.name})`, () => {
    const t = useTestApp(dialect, { argon2TimeCost: 3 })
    const NEW = 'an entirely new passphrase'
    // Each round is a race whose winner the hash queue decides: either side
    // may finish first, and every outcome must leave the same state behind.
    const ROUNDS = 8
    const setPassword = async (id: string, password: string): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: auth(t.adminKey), payload: { password } })
    const meWith = async (token: string): Promise<number> =>
      (await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${token}` } })).statusCode

    it('leaves no session the change did not end, and only the new password working, whichever finishes first', async () => {
      const weaker = await hash(GOOD_PASSWORD, { algorithm: 2, memoryCost: 19456, timeCost: 2, parallelism: 1 })
      for (let round = 0; round < ROUNDS; round++) {
        const user = await createUser(t)
        // Every other round, a hash the sign-in makes again (weaker parameters) and writes back.
        if (round % 2 === 1) await t.app.db.updateTable('users').set({ password_hash: weaker }).where('id', '=', user.id).execute()
        const [signedIn, changed] = await Promise.all([login(t, user.username), setPassword(user.id, NEW)])
        assert.equal(changed.statusCode, 200, changed.body)
        assert.ok([200, 401].includes(signedIn.statusCode), signedIn.body)
        if (signedIn.statusCode === 200) assert.equal(await meWith(signedIn.json().token), 401, `round ${round}: a session opened with the old password outlived the change`)
        assert.equal((await login(t, user.username)).statusCode, 401, `round ${round}: the old password still signs in`)
        assert.equal((await login(t, user.username, NEW)).statusCode, 200, `round ${round}: the new password does not sign in`)
      }
    })

    it('lets an admin\'s new password stand against the user\'s own change racing it', async () => {
      const mine = 'a passphrase of my own'
      for (let round = 0; round < ROUNDS; round++) {
        const user = await createUser(t)
        const signedIn = await login(t, user.username)
        assert.equal(signedIn.statusCode, 200, signedIn.body)
        const token = signedIn.json().token as string
        const [own, changed] = await Promise.all([
          t.app.inject({ method: 'PUT', url: '/auth/api/me/password', headers: { authorization: `Bearer ${token}` }, payload: { current_password: GOOD_PASSWORD, new_password: mine } }),
          setPassword(user.id, NEW)
        ])
        assert.equal(changed.statusCode, 200, changed.body)
        assert.ok([204, 401].includes(own.statusCode), own.body)
        assert.equal(await meWith(token), 401, `round ${round}: the session outlived the admin's change`)
        assert.equal((await login(t, user.username, mine)).statusCode, 401, `round ${round}: the user's own password replaced the admin's`)
        assert.equal((await login(t, user.username, NEW)).statusCode, 200, `round ${round}: the admin's password does not sign in`)
      }
    })
  })
}

for (const dialect of dialects()) {
  describe(`the session cookie behind a proxy that terminates TLS (${dialect.name})`, () => {
    const t = useTestApp(dialect, { trustProxy: true })

    it('over HTTPS is read only under its __Host- name, which no other host of the site can set', async () => {
      const user = await createUser(t)
      const https = { 'x-forwarded-proto': 'https', origin: 'https://localhost:80' }
      const signedIn = await login(t, user.username, GOOD_PASSWORD, https)
      assert.equal(signedIn.statusCode, 200, signedIn.body)
      const token = signedIn.json().token as string
      assert.ok(signedIn.cookies.some(c => c.name === '__Host-gatehouse_session' && c.secure === true))
      const me = async (cookie: string, headers: Record<string, string>): Promise<number> =>
        (await t.app.inject({ url: '/auth/api/me', headers: { cookie, ...headers } })).statusCode
      assert.equal(await me(`__Host-gatehouse_session=${token}`, https), 200)
      // What a sibling subdomain could have set with Domain=<the site>: not taken over HTTPS.
      assert.equal(await me(`gatehouse_session=${token}`, https), 401)
      const page = await t.app.inject({ url: '/auth/login', headers: { cookie: `gatehouse_session=${token}`, ...https } })
      assert.equal(page.statusCode, 200, 'the sign-in page is shown, not skipped as for someone signed in')
      // Over plain HTTP, the only cookie gatehouse sets there is read as before.
      assert.equal(await me(`gatehouse_session=${token}`, {}), 200)
    })
  })

  describe(`the device cookie behind a proxy that terminates TLS (${dialect.name})`, () => {
    const t = useTestApp(dialect, { trustProxy: true, accountLockThreshold: 3 })

    it('over HTTPS makes a known client of a locked account only under its __Host- name', async () => {
      const user = await createUser(t)
      const over = (address: string): Record<string, string> => ({ 'x-forwarded-proto': 'https', 'x-forwarded-for': address, origin: 'https://localhost:80' })
      const signedIn = await login(t, user.username, GOOD_PASSWORD, over('192.0.2.10'))
      assert.equal(signedIn.statusCode, 200, signedIn.body)
      const device = signedIn.cookies.find(c => c.name === '__Host-gatehouse_device')
      assert.ok(device?.secure === true, `a __Host- device cookie, Secure: ${JSON.stringify(signedIn.cookies)}`)
      for (let i = 0; i < 3; i++) assert.equal((await login(t, user.username, 'not the password', over('192.0.2.20'))).statusCode, 401)
      const locked = await t.app.inject({ url: `/auth/api/events?target_id=${user.id}&type=user.locked`, headers: auth(t.adminKey) })
      assert.equal(locked.json().length, 1, 'the account is locked')
      // From an address the account never used, only the browser's device cookie can make it a known client.
      const fresh = over('192.0.2.30')
      assert.equal((await login(t, user.username, GOOD_PASSWORD, fresh)).statusCode, 401)
      // What a sibling subdomain could have set with Domain=<the site>: not taken over HTTPS.
      assert.equal((await login(t, user.username, GOOD_PASSWORD, { ...fresh, cookie: `gatehouse_device=${device.value}` })).statusCode, 401)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, { ...fresh, cookie: `__Host-gatehouse_device=${device.value}` })).statusCode, 200)
    })
  })
}
