import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { sql } from 'kysely'
import { loadConfig, ConfigError } from '../src/config.ts'
import { toSettings } from '../src/sso/oidc.settings.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { signInAtOp, startTestOp, type AccountClaims, type TestOp } from './oidc-op.ts'

/** Where browsers reach gatehouse in these tests; the provider redirects there, and the test hands the callback to app.inject. */
const ORIGIN = 'http://gatehouse.test'
const STATE_COOKIE = 'gatehouse_oidc_state'

interface Attempt { res: LightMyRequestResponse, callback: URL, state: string }

/** A whole sign-in: start at gatehouse, sign in at the provider as `account`, return to the callback in the same browser. */
async function ssoSignIn (t: TestApp, op: TestOp, providerId: string, account: string, next?: string): Promise<Attempt> {
  const start = await t.app.inject({ url: `/auth/sso/${providerId}/start${next !== undefined ? `?next=${encodeURIComponent(next)}` : ''}` })
  assert.equal(start.statusCode, 303, start.body)
  const location = new URL(start.headers.location as string)
  assert.equal(location.origin, op.issuer)
  assert.equal(location.searchParams.get('code_challenge_method'), 'S256')
  assert.ok(location.searchParams.get('nonce'), 'a nonce is sent')
  const state = start.cookies.find(c => c.name === STATE_COOKIE)!.value
  assert.equal(location.searchParams.get('state'), state)
  const callback = await signInAtOp(op, location.href, account)
  assert.equal(callback.origin, ORIGIN)
  const res = await callbackWith(t, callback, state)
  return { res, callback, state }
}

async function callbackWith (t: TestApp, callback: URL, state: string | undefined): Promise<LightMyRequestResponse> {
  return await t.app.inject({ url: callback.pathname + callback.search, ...(state !== undefined ? { cookies: { [STATE_COOKIE]: state } } : {}) })
}

function sessionCookie (res: LightMyRequestResponse): string | undefined {
  return res.cookies.find(c => c.name === 'gatehouse_session' && c.value !== '')?.value
}

async function me (t: TestApp, token: string): Promise<{ id: string, username: string, email: string | null, role: string, groups: string[] }> {
  const res = await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${token}` } })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function eventsOf (t: TestApp, userId: string): Promise<Array<{ type: string, data: Record<string, unknown>, request_id: string | null }>> {
  const res = await t.app.inject({ url: `/auth/api/events?target_id=${userId}&limit=1000`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json().reverse()
}

async function eventsOfType (t: TestApp, type: string): Promise<Array<{ type: string, data: Record<string, unknown>, target: { id: string } | null }>> {
  const res = await t.app.inject({ url: `/auth/api/events?type=${type}&limit=1000`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function identitiesOf (t: TestApp, userId: string): Promise<Array<{ id: string, provider: string, subject: string }>> {
  const res = await t.app.inject({ url: `/auth/api/users/${userId}/identities`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

/** An account at the provider that no other test uses. */
function account (op: TestOp, claims: AccountClaims): string {
  const sub = `sub-${randomBytes(6).toString('hex')}`
  op.accounts.set(sub, claims)
  return sub
}

for (const dialect of dialects()) {
  describe(`OpenID Connect sign-in (${dialect.name})`, () => {
    let op: TestOp
    const t = {} as TestApp
    before(async () => {
      op = await startTestOp(['corp', 'open', 'spare'].map(id => `${ORIGIN}/auth/sso/${id}/callback`))
      // corp: from the environment; links by verified email, creates nobody, maps groups and the admin role.
      const corp = toSettings({
        id: 'corp',
        display_name: 'Corporate SSO',
        issuer: op.issuer,
        client_id: op.clientId,
        client_secret: op.clientSecret,
        scopes: ['openid', 'email', 'profile', 'groups'],
        link_by_email: true,
        groups_claim: 'groups',
        group_map: { 'data-eng': ['pipelines', 'analysts'], ops: ['ops'] },
        admin_groups: ['gh-admins']
      }, 'environment')
      // The provider runs on loopback, an internal address: API-made providers there need the SSRF guard's opt-out.
      Object.assign(t, await createTestApp(dialect, { mfaEncryptionKey: randomBytes(32), oidcRedirectOrigin: ORIGIN, oidcProviders: [corp], webhookAllowPrivate: true }))
      // open: made through the API; creates users just in time.
      const created = await t.app.inject({
        method: 'POST',
        url: '/auth/api/sso/providers',
        headers: auth(t.adminKey),
        payload: { id: 'open', display_name: 'Open Door', issuer: op.issuer, client_id: op.clientId, client_secret: op.clientSecret, jit: true }
      })
      assert.equal(created.statusCode, 201, created.body)
    })
    after(async () => {
      await t.app?.close()
      await op?.close()
    })

    it('shows a "Sign in with" link for each enabled provider on the sign-in page, carrying next', async () => {
      const res = await t.app.inject({ url: '/auth/login?next=%2Fpipelines' })
      assert.equal(res.statusCode, 200)
      assert.match(res.body, /<a class="sso" href="\/auth\/sso\/corp\/start\?next=%2Fpipelines">Sign in with Corporate SSO<\/a>/)
      assert.match(res.body, /href="\/auth\/sso\/open\/start\?next=%2Fpipelines">Sign in with Open Door</)
    })

    it('creates a user just in time on a first sign-in, links the identity, and signs the same user in again later', async () => {
      const sub = account(op, { preferred_username: `ada-${randomBytes(3).toString('hex')}`, email: `${randomBytes(4).toString('hex')}@example.com`, email_verified: true, given_name: 'Ada' })
      const claims = op.accounts.get(sub)!
      const first = await ssoSignIn(t, op, 'open', sub, '/pipelines')
      assert.equal(first.res.statusCode, 303, first.res.body)
      assert.equal(first.res.headers.location, '/pipelines')
      const user = await me(t, sessionCookie(first.res)!)
      assert.equal(user.username, claims.preferred_username)
      assert.equal(user.email, claims.email)
      const row = await t.app.db.selectFrom('users').select(['password_hash', 'first_name']).where('id', '=', user.id).executeTakeFirstOrThrow()
      assert.equal(row.password_hash, null, 'no local password')
      assert.equal(row.first_name, 'Ada')
      const identities = await identitiesOf(t, user.id)
      assert.deepEqual(identities.map(i => [i.provider, i.subject]), [['oidc:open', sub]])

      const types = (await eventsOf(t, user.id)).map(e => e.type)
      assert.deepEqual(types, ['user.created', 'user.identity_linked', 'user.sso_login_succeeded', 'user.login_succeeded'])
      const linked = (await eventsOf(t, user.id)).find(e => e.type === 'user.identity_linked')!
      assert.equal(linked.data.match, 'new_user')
      const loggedIn = (await eventsOf(t, user.id)).find(e => e.type === 'user.login_succeeded')!
      assert.equal(loggedIn.data.via, 'oidc:open')

      const again = await ssoSignIn(t, op, 'open', sub)
      assert.equal(again.res.statusCode, 303, again.res.body)
      assert.equal(again.res.headers.location, '/auth/login', 'no next: the signed-in page')
      assert.equal((await me(t, sessionCookie(again.res)!)).id, user.id)
      const later = (await eventsOf(t, user.id)).map(e => e.type)
      assert.equal(later.filter(type => type === 'user.created').length, 1, 'nobody new')
      assert.equal(later.filter(type => type === 'user.sso_login_succeeded').length, 2)
    })

    it('makes a just-in-time username unique and keeps a taken or unverified email off the new user', async () => {
      const existing = await createUser(t, { email: `${randomBytes(4).toString('hex')}@example.com` })
      const sub = account(op, { preferred_username: existing.username, email: `${randomBytes(4).toString('hex')}@example.com`, email_verified: false })
      const { res } = await ssoSignIn(t, op, 'open', sub)
      assert.equal(res.statusCode, 303, res.body)
      const user = await me(t, sessionCookie(res)!)
      assert.equal(user.username, `${existing.username}-2`)
      assert.equal(user.email, null, 'an unverified email is not put on the account')
    })

    it('refuses a first sign-in when the provider neither links by email nor creates users, with a clear page and an event', async () => {
      const sub = account(op, { email: `${randomBytes(4).toString('hex')}@example.com`, email_verified: true })
      const before = await t.app.db.selectFrom('users').select(sql<number>`count(*)`.as('n')).executeTakeFirstOrThrow()
      const { res } = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(res.statusCode, 403)
      assert.match(res.headers['content-type'] as string, /^text\/html/)
      assert.match(res.body, /not linked to a user here/)
      assert.equal(sessionCookie(res), undefined)
      const after = await t.app.db.selectFrom('users').select(sql<number>`count(*)`.as('n')).executeTakeFirstOrThrow()
      assert.equal(Number(after.n), Number(before.n), 'no user created')
      const failed = (await eventsOfType(t, 'user.sso_login_failed')).find(e => e.data.subject === sub)
      assert.equal(failed?.data.reason, 'no_account')
      assert.equal(failed?.data.provider, 'oidc:corp')
    })

    it('links an existing user by email only when the provider says the email is verified', async () => {
      const email = `${randomBytes(4).toString('hex')}@Example.com`
      const owner = await createUser(t, { email })
      const unverified = account(op, { email: email.toLowerCase(), email_verified: false })
      const refused = await ssoSignIn(t, op, 'corp', unverified)
      assert.equal(refused.res.statusCode, 403)
      assert.match(refused.res.body, /does not say that the email is verified/)
      assert.deepEqual(await identitiesOf(t, owner.id), [])

      const verified = account(op, { email: email.toLowerCase(), email_verified: true })
      const { res } = await ssoSignIn(t, op, 'corp', verified)
      assert.equal(res.statusCode, 303, res.body)
      assert.equal((await me(t, sessionCookie(res)!)).id, owner.id)
      assert.deepEqual((await identitiesOf(t, owner.id)).map(i => i.subject), [verified])
      const linked = (await eventsOf(t, owner.id)).find(e => e.type === 'user.identity_linked')!
      assert.equal(linked.data.match, 'email')
      assert.equal(linked.data.provider, 'oidc:corp')
    })

    it('applies the group claim to groups and role at each sign-in, recorded as user.updated in the sign-in\'s request', async () => {
      // Someone else stays admin, so the provider may take the role away again.
      await createUser(t, { role: 'admin' })
      const email = `${randomBytes(4).toString('hex')}@example.com`
      const user = await createUser(t, { email, groups: ['manual', 'ops'] })
      const sub = account(op, { email, email_verified: true, groups: ['data-eng', 'gh-admins', 'unmapped'] })

      const first = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(first.res.statusCode, 303, first.res.body)
      let now = await me(t, sessionCookie(first.res)!)
      assert.deepEqual(now.groups, ['manual', 'analysts', 'pipelines'], 'mapped groups given, a mapped group not held removed, unmapped ones kept')
      assert.equal(now.role, 'admin')
      let events = await eventsOf(t, user.id)
      const firstUpdate = events.find(e => e.type === 'user.updated')!
      assert.deepEqual(firstUpdate.data, {
        changes: { groups: { from: ['manual', 'ops'], to: ['manual', 'analysts', 'pipelines'] }, role: { from: 'user', to: 'admin' } },
        source: 'oidc:corp'
      })
      const signedIn = events.find(e => e.type === 'user.sso_login_succeeded')!
      assert.equal(firstUpdate.request_id, signedIn.request_id, 'the change and the sign-in are one request')

      op.accounts.set(sub, { email, email_verified: true, groups: ['ops'] })
      const second = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(second.res.statusCode, 303, second.res.body)
      now = await me(t, sessionCookie(second.res)!)
      assert.deepEqual(now.groups, ['manual', 'ops'])
      assert.equal(now.role, 'user')
      events = await eventsOf(t, user.id)
      const updates = events.filter(e => e.type === 'user.updated')
      assert.equal(updates.length, 2)
      assert.deepEqual(updates[1]!.data.changes, { groups: { from: ['manual', 'analysts', 'pipelines'], to: ['manual', 'ops'] }, role: { from: 'admin', to: 'user' } })

      // Nothing changed at the provider: nothing to record.
      const third = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(third.res.statusCode, 303)
      assert.equal((await eventsOf(t, user.id)).filter(e => e.type === 'user.updated').length, 2)
    })

    it('refuses a callback whose state was altered, one from another browser, and a replayed one', async () => {
      const sub = account(op, { preferred_username: uniqueName('st') })
      const start = await t.app.inject({ url: '/auth/sso/open/start' })
      const state = start.cookies.find(c => c.name === STATE_COOKIE)!.value
      const callback = await signInAtOp(op, start.headers.location as string, sub)

      const altered = new URL(callback)
      altered.searchParams.set('state', `${state.slice(0, -2)}xx`)
      const tampered = await callbackWith(t, altered, `${state.slice(0, -2)}xx`)
      assert.equal(tampered.statusCode, 401)
      assert.match(tampered.body, /expired, was already used, or was started in another browser/)

      const elsewhere = await callbackWith(t, callback, undefined)
      assert.equal(elsewhere.statusCode, 401, 'without the state cookie of the browser that set out')

      const good = await callbackWith(t, callback, state)
      assert.equal(good.statusCode, 303, good.body)
      assert.ok(sessionCookie(good))
      const replay = await callbackWith(t, callback, state)
      assert.equal(replay.statusCode, 401)
      assert.equal(sessionCookie(replay), undefined)
      const reasons = (await eventsOfType(t, 'user.sso_login_failed')).map(e => e.data.reason)
      assert.ok(reasons.filter(r => r === 'state_invalid').length >= 3, reasons.join())
    })

    it('shows the provider\'s refusal (error=access_denied) as a failed sign-in and spends the state', async () => {
      const start = await t.app.inject({ url: '/auth/sso/open/start?next=%2Fpipelines' })
      const state = start.cookies.find(c => c.name === STATE_COOKIE)!.value
      const callback = new URL(`${ORIGIN}/auth/sso/open/callback?error=access_denied&state=${state}`)
      const res = await callbackWith(t, callback, state)
      assert.equal(res.statusCode, 401)
      assert.match(res.body, /did not sign you in \(access_denied\)/)
      assert.match(res.body, /href="\/auth\/login\?next=%2Fpipelines"/, 'back to the sign-in page, keeping next')
      assert.equal((await callbackWith(t, new URL(`${ORIGIN}/auth/sso/open/callback?code=x&state=${state}`), state)).statusCode, 401, 'the state is spent')
      assert.ok((await eventsOfType(t, 'user.sso_login_failed')).some(e => e.data.reason === 'provider_error' && e.data.error === 'access_denied'))
    })

    it('refuses an ID token whose nonce is not the one sent', async () => {
      const sub = account(op, { preferred_username: uniqueName('nonce') })
      const start = await t.app.inject({ url: '/auth/sso/open/start' })
      const state = start.cookies.find(c => c.name === STATE_COOKIE)!.value
      const callback = await signInAtOp(op, start.headers.location as string, sub)
      // As if the provider's answer belonged to another sign-in: the nonce kept for this one differs from the token's.
      await t.app.db.updateTable('oidc_logins').set({ nonce: 'not-the-nonce-that-was-sent' }).where('used_at', 'is', null).execute()
      const res = await callbackWith(t, callback, state)
      assert.equal(res.statusCode, 401, res.body)
      assert.match(res.body, /could not be verified/)
      assert.equal(sessionCookie(res), undefined)
      const failed = (await eventsOfType(t, 'user.sso_login_failed')).find(e => e.data.reason === 'token_rejected')
      assert.equal(failed?.data.claim, 'nonce', JSON.stringify(failed?.data))
    })

    it('refuses a disabled user', async () => {
      const sub = account(op, { preferred_username: uniqueName('dis') })
      const first = await ssoSignIn(t, op, 'open', sub)
      const user = await me(t, sessionCookie(first.res)!)
      const disabled = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { disabled: true } })
      assert.equal(disabled.statusCode, 200, disabled.body)
      const { res } = await ssoSignIn(t, op, 'open', sub)
      assert.equal(res.statusCode, 403)
      assert.match(res.body, /disabled/)
      assert.equal(sessionCookie(res), undefined)
      assert.ok((await eventsOf(t, user.id)).some(e => e.type === 'user.sso_login_failed' && e.data.reason === 'disabled'))
    })

    it('still asks a user with a second factor for it, and sends the browser on after it', async () => {
      const sub = account(op, { preferred_username: uniqueName('mfa') })
      const first = await ssoSignIn(t, op, 'open', sub)
      const token = sessionCookie(first.res)!
      const bearer = { authorization: `Bearer ${token}` }
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer })
      assert.equal(setup.statusCode, 200, setup.body)
      const secret = setup.json().secret as string
      const confirm = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer, payload: { code: await generate({ secret }) } })
      assert.equal(confirm.statusCode, 200, confirm.body)

      const { res } = await ssoSignIn(t, op, 'open', sub, '/pipelines')
      assert.equal(res.statusCode, 200, 'the second-step page')
      assert.equal(sessionCookie(res), undefined, 'no session before the second factor')
      const challenge = /name="challenge_token" value="([^"]+)"/.exec(res.body)![1]!
      const done = await t.app.inject({
        method: 'POST',
        url: '/auth/login/mfa',
        headers: { origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' },
        payload: new URLSearchParams({ challenge_token: challenge, code: await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 }), next: '/pipelines' }).toString()
      })
      assert.equal(done.statusCode, 303, done.body)
      assert.equal(done.headers.location, '/pipelines')
      const session = await t.app.db.selectFrom('sessions').select('mfa').where('user_id', '=', (await me(t, token)).id).orderBy('created_at', 'desc').executeTakeFirstOrThrow()
      assert.ok(session.mfa === true || session.mfa === 1)
    })

    it('lists an OIDC session as opened by oidc with its provider, and keeps that through a second factor', async () => {
      const sub = account(op, { preferred_username: uniqueName('listed') })
      const first = await ssoSignIn(t, op, 'open', sub)
      const token = sessionCookie(first.res)!
      const bearer = { authorization: `Bearer ${token}` }
      const listed = async (): Promise<Array<{ id: string, method: string | null, provider: string | null, mfa: boolean, current: boolean }>> => {
        const res = await t.app.inject({ url: '/auth/api/me/sessions', headers: bearer })
        assert.equal(res.statusCode, 200, res.body)
        return res.json()
      }
      assert.deepEqual((await listed()).map(s => [s.method, s.provider, s.mfa, s.current]), [['oidc', 'open', false, true]])

      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: bearer })
      assert.equal(setup.statusCode, 200, setup.body)
      const secret = setup.json().secret as string
      const confirm = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: bearer, payload: { code: await generate({ secret }) } })
      assert.equal(confirm.statusCode, 200, confirm.body)
      const { res } = await ssoSignIn(t, op, 'open', sub)
      const challenge = /name="challenge_token" value="([^"]+)"/.exec(res.body)![1]!
      const done = await t.app.inject({
        method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: challenge, totp_code: await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 }) }
      })
      assert.equal(done.statusCode, 200, done.body)
      const second = (await listed()).find(s => s.id === done.json().session_id)
      assert.deepEqual([second?.method, second?.provider, second?.mfa, second?.current], ['oidc', 'open', true, false])
    })

    it('never redirects after sign-in to another site, whatever next says', async () => {
      const sub = account(op, { preferred_username: uniqueName('nx') })
      for (const next of ['//evil.example/x', 'https://evil.example/', '/\\evil.example']) {
        const { res } = await ssoSignIn(t, op, 'open', sub, next)
        assert.equal(res.statusCode, 303)
        assert.equal(res.headers.location, '/auth/login', next)
      }
    })

    it('percent-encodes a next holding characters beyond Latin-1 after the callback, and signs the user in', async () => {
      const sub = account(op, { preferred_username: uniqueName('nx') })
      for (const [next, location] of [['/\u3002evil.example', '/%E3%80%82evil.example'], ['/\u202E', '/%E2%80%AE']] as const) {
        const { res } = await ssoSignIn(t, op, 'open', sub, next)
        assert.equal(res.statusCode, 303, `${next}: ${res.body}`)
        assert.equal(res.headers.location, location, next)
        const token = sessionCookie(res)
        assert.ok(token !== undefined, `${next}: the session cookie is set`)
        assert.equal((await me(t, token)).username.startsWith('nx'), true)
      }
    })

    it('lets an admin list and unlink a user\'s identities, with an event; the next sign-in is a first one again', async () => {
      const email = `${randomBytes(4).toString('hex')}@example.com`
      const user = await createUser(t, { email })
      const sub = account(op, { email, email_verified: true })
      assert.equal((await ssoSignIn(t, op, 'corp', sub)).res.statusCode, 303)
      const [identity] = await identitiesOf(t, user.id)
      assert.ok(identity)

      const nonAdmin = await createUser(t)
      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: nonAdmin.username, password: GOOD_PASSWORD } })
      const forbidden = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/identities/${identity.id}`, headers: { authorization: `Bearer ${login.json().token}` } })
      assert.equal(forbidden.statusCode, 403)

      const unlinked = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/identities/${identity.id}`, headers: auth(t.adminKey) })
      assert.equal(unlinked.statusCode, 204, unlinked.body)
      assert.deepEqual(await identitiesOf(t, user.id), [])
      const event = (await eventsOf(t, user.id)).find(e => e.type === 'user.identity_unlinked')!
      assert.deepEqual(event.data, { identity_id: identity.id, provider: 'oidc:corp', subject: sub })
      const again = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/identities/${identity.id}`, headers: auth(t.adminKey) })
      assert.equal(again.statusCode, 404)
      assert.equal(again.json().code, 'identity_not_found')

      // Linked again by the verified email, as a first sign-in.
      assert.equal((await ssoSignIn(t, op, 'corp', sub)).res.statusCode, 303)
      assert.equal((await identitiesOf(t, user.id)).length, 1)
    })

    it('counts refused callbacks against the address like failed passwords, and answers 429 when the budget is spent', async () => {
      const strict = await createTestApp(dialect, { oidcRedirectOrigin: ORIGIN, oidcProviders: [{ ...(t.app.config.oidcProviders[0]!) }], loginMaxFailuresPerAddress: 2 })
      try {
        const sub = account(op, { email: `${randomBytes(4).toString('hex')}@example.com`, email_verified: true })
        for (let i = 0; i < 2; i++) assert.equal((await ssoSignIn(strict, op, 'corp', sub)).res.statusCode, 403, 'no account: refused')
        const { res } = await ssoSignIn(strict, op, 'corp', sub)
        assert.equal(res.statusCode, 429)
        assert.ok(Number(res.headers['retry-after']) > 0)
        assert.match(res.body, /Too many failed sign-ins/)
      } finally {
        await strict.app.close()
      }
    })

    it('answers 503 with a page when the provider cannot be reached, and keeps no state for it', async () => {
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(t.adminKey), payload: { id: 'dead', display_name: 'Dead', issuer: 'http://127.0.0.1:9', client_id: 'x' } })
      assert.equal(created.statusCode, 201, created.body)
      try {
        const res = await t.app.inject({ url: '/auth/sso/dead/start' })
        assert.equal(res.statusCode, 503)
        assert.equal(res.headers['retry-after'], '5')
        assert.match(res.body, /cannot be reached/)
        assert.equal(res.cookies.find(c => c.name === STATE_COOKIE), undefined)
        const kept = await t.app.db.selectFrom('oidc_logins').select('id').where('provider_id', '=', 'dead').execute()
        assert.equal(kept.length, 0)
      } finally {
        await t.app.inject({ method: 'DELETE', url: '/auth/api/sso/providers/dead', headers: auth(t.adminKey) })
      }
    })

    it('never takes the admin role from the last enabled admin, and says so in the sign-in event', async () => {
      const lone = await createTestApp(dialect, { oidcRedirectOrigin: ORIGIN, oidcProviders: [{ ...(t.app.config.oidcProviders[0]!) }] })
      try {
        const email = `${randomBytes(4).toString('hex')}@example.com`
        const admin = await createUser(lone, { email, role: 'admin' })
        const sub = account(op, { email, email_verified: true, groups: [] })
        const { res } = await ssoSignIn(lone, op, 'corp', sub)
        assert.equal(res.statusCode, 303, res.body)
        assert.equal((await me(lone, sessionCookie(res)!)).role, 'admin')
        const signedIn = (await eventsOf(lone, admin.id)).find(e => e.type === 'user.sso_login_succeeded')!
        assert.equal(signedIn.data.role_kept, 'last_admin')
      } finally {
        await lone.app.close()
      }
    })

    it('asks the last enabled admin to enrol a second factor under MFA_REQUIRED=admins, though the provider maps them to user', async () => {
      const lone = await createTestApp(dialect, { oidcRedirectOrigin: ORIGIN, oidcProviders: [{ ...(t.app.config.oidcProviders[0]!) }], mfaRequired: 'admins', mfaEncryptionKey: randomBytes(32) })
      try {
        const email = `${randomBytes(4).toString('hex')}@example.com`
        await createUser(lone, { email, role: 'admin' })
        const sub = account(op, { email, email_verified: true, groups: [] })
        const { res } = await ssoSignIn(lone, op, 'corp', sub)
        assert.equal(res.statusCode, 200, 'the enrolment step, not a session')
        assert.equal(sessionCookie(res), undefined, 'no session before a second factor')
      } finally {
        await lone.app.close()
      }
    })

    it('manages providers through the API without ever returning the client secret', async () => {
      const secret = `s3cret-${randomBytes(8).toString('hex')}`
      const created = await t.app.inject({
        method: 'POST',
        url: '/auth/api/sso/providers',
        headers: auth(t.adminKey),
        payload: { id: 'spare', display_name: 'Spare', issuer: op.issuer, client_id: op.clientId, client_secret: secret, groups_claim: 'groups', group_map: { a: ['b'] } }
      })
      assert.equal(created.statusCode, 201, created.body)
      assert.equal(created.headers.location, '/auth/api/sso/providers/spare')
      const body = created.json()
      assert.equal(body.client_secret_set, true)
      assert.equal(body.source, 'api')
      assert.equal(body.redirect_path, '/auth/sso/spare/callback')
      assert.ok(!created.body.includes(secret))
      assert.equal('client_secret' in body, false)

      const stored = await t.app.db.selectFrom('oidc_providers').select('client_secret').where('id', '=', 'spare').executeTakeFirstOrThrow()
      assert.ok(stored.client_secret !== null && !stored.client_secret.includes(secret), 'stored sealed')

      const list = await t.app.inject({ url: '/auth/api/sso/providers', headers: auth(t.adminKey) })
      assert.equal(list.statusCode, 200)
      assert.deepEqual(list.json().map((p: { id: string, source: string }) => [p.id, p.source]), [['corp', 'environment'], ['open', 'api'], ['spare', 'api']])
      assert.ok(!list.body.includes(secret) && !list.body.includes(op.clientSecret), 'no secret in the list, configured ones included')

      const patched = await t.app.inject({ method: 'PATCH', url: '/auth/api/sso/providers/spare', headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ display_name: 'Spare Door', client_secret: `${secret}-2` }) })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.equal(patched.json().display_name, 'Spare Door')
      assert.ok(!patched.body.includes(secret))

      // It works as a sign-in provider with the secret it was given.
      const sub = account(op, { email: `${randomBytes(4).toString('hex')}@example.com`, email_verified: true })
      const patchedBack = await t.app.inject({ method: 'PATCH', url: '/auth/api/sso/providers/spare', headers: auth(t.adminKey), payload: { client_secret: op.clientSecret, jit: true } })
      assert.equal(patchedBack.statusCode, 200, patchedBack.body)
      assert.equal((await ssoSignIn(t, op, 'spare', sub)).res.statusCode, 303)

      const events = (await eventsOfType(t, 'sso_provider.updated')).filter(e => e.data.id === 'spare')
      assert.ok(events.length >= 2)
      assert.ok(!JSON.stringify(events).includes(secret), 'events say only that the secret changed')
      assert.equal((events[0]!.data.changes as Record<string, unknown>).client_secret, '[redacted]')

      const duplicate = await t.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(t.adminKey), payload: { id: 'corp', display_name: 'x', issuer: op.issuer, client_id: 'x' } })
      assert.equal(duplicate.statusCode, 409)
      const envEdit = await t.app.inject({ method: 'PATCH', url: '/auth/api/sso/providers/corp', headers: auth(t.adminKey), payload: { jit: true } })
      assert.equal(envEdit.statusCode, 409)
      assert.equal(envEdit.json().code, 'sso_provider_read_only')
      const insecure = await t.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(t.adminKey), payload: { id: 'plain', display_name: 'x', issuer: 'http://idp.example.com', client_id: 'x' } })
      assert.equal(insecure.statusCode, 422, 'plain http only on loopback')

      const deleted = await t.app.inject({ method: 'DELETE', url: '/auth/api/sso/providers/spare', headers: auth(t.adminKey) })
      assert.equal(deleted.statusCode, 204)
      assert.equal((await t.app.inject({ url: '/auth/api/sso/providers/spare', headers: auth(t.adminKey) })).statusCode, 404)
      const gone = await t.app.inject({ url: '/auth/sso/spare/start' })
      assert.equal(gone.statusCode, 404)

      const anonymous = await t.app.inject({ url: '/auth/api/sso/providers' })
      assert.equal(anonymous.statusCode, 401)
    })
  })
}

describe('OIDC_PROVIDERS', () => {
  const base = { DATABASE_URL: 'sqlite::memory:' }
  it('reads providers from one JSON variable, with defaults', () => {
    const config = loadConfig({ ...base, OIDC_PROVIDERS: JSON.stringify([{ id: 'corp', display_name: 'Corp', issuer: 'https://login.example.com', client_id: 'gh', client_secret: 'x' }]) })
    assert.equal(config.oidcProviders.length, 1)
    const [p] = config.oidcProviders
    assert.deepEqual([p!.id, p!.scopes, p!.jit, p!.linkByEmail, p!.enabled, p!.source], ['corp', ['openid', 'email', 'profile'], false, false, true, 'environment'])
  })

  it('refuses a start with a malformed or unsafe provider list, naming the problem', () => {
    assert.throws(() => loadConfig({ ...base, OIDC_PROVIDERS: '{' }), ConfigError)
    assert.throws(() => loadConfig({ ...base, OIDC_PROVIDERS: JSON.stringify([{ id: 'Corp!', display_name: 'x', issuer: 'https://a.example', client_id: 'x' }]) }), /OIDC_PROVIDERS\[0\]\/id/)
    assert.throws(() => loadConfig({ ...base, OIDC_PROVIDERS: JSON.stringify([{ id: 'a', display_name: 'x', issuer: 'http://a.example', client_id: 'x' }]) }), /https/)
    assert.throws(() => loadConfig({ ...base, OIDC_PROVIDERS: JSON.stringify([{ id: 'a', display_name: 'x', issuer: 'https://a.example', client_id: 'x', scopes: ['email'] }]) }), /openid/)
    const one = { id: 'a', display_name: 'x', issuer: 'https://a.example', client_id: 'x' }
    assert.throws(() => loadConfig({ ...base, OIDC_PROVIDERS: JSON.stringify([one, one]) }), /used twice/)
  })
})
