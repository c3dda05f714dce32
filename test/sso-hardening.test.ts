import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { toSettings } from '../src/sso/oidc.settings.ts'
import { insertProviderRow } from '../src/sso/oidc.repository.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { signInAtOp, startTestOp, type TestOp } from './oidc-op.ts'

/** Where browsers reach gatehouse in these tests; the provider redirects there, and the test hands the callback to app.inject. */
const ORIGIN = 'http://gatehouse.test'
const STATE_COOKIE = 'gatehouse_oidc_state'

/** A whole sign-in at `providerId`: start, sign in at the provider as `sub`, return to the callback in the same browser. */
async function ssoSignIn (t: TestApp, op: TestOp, providerId: string, sub: string): Promise<{ res: LightMyRequestResponse, callback: URL }> {
  const start = await t.app.inject({ url: `/auth/sso/${providerId}/start` })
  assert.equal(start.statusCode, 303, start.body)
  const state = start.cookies.find(c => c.name === STATE_COOKIE)!.value
  const callback = await signInAtOp(op, start.headers.location as string, sub)
  const res = await t.app.inject({ url: callback.pathname + callback.search, cookies: { [STATE_COOKIE]: state } })
  return { res, callback }
}

function bearer (token: string): { authorization: string } {
  return { authorization: `Bearer ${token}` }
}

async function passwordSession (t: TestApp, username: string): Promise<string> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  assert.equal(res.statusCode, 200, res.body)
  return res.json().token
}

/** What a password-only session may do with admin rights: each answer's status. */
async function adminAttempts (t: TestApp, token: string): Promise<{ key: number, adminUser: number, role: unknown, mfa: unknown }> {
  const key = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: bearer(token), payload: { name: uniqueName('k') } })
  const adminUser = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: bearer(token), payload: { username: uniqueName('a'), password: GOOD_PASSWORD, role: 'admin' } })
  const verify = await t.app.inject({ url: '/auth/api/verify', headers: bearer(token) })
  assert.equal(verify.statusCode, 200, verify.body)
  return { key: key.statusCode, adminUser: adminUser.statusCode, role: verify.headers['x-auth-role'], mfa: verify.headers['x-auth-mfa'] }
}

for (const dialect of dialects()) {
  describe(`OIDC hardening (${dialect.name})`, () => {
    let op: TestOp
    const t = {} as TestApp
    const logLines: string[] = []
    before(async () => {
      op = await startTestOp(['corp', 'open', 'rebound'].map(id => `${ORIGIN}/auth/sso/${id}/callback`))
      // corp comes from the environment (the operator's own word), so it may be on loopback with the SSRF guard on.
      const corp = toSettings({
        id: 'corp',
        display_name: 'Corporate SSO',
        issuer: op.issuer,
        client_id: op.clientId,
        client_secret: op.clientSecret,
        scopes: ['openid', 'email', 'profile', 'groups'],
        link_by_email: true,
        groups_claim: 'groups',
        admin_groups: ['gh-admins']
      }, 'environment')
      Object.assign(t, await createTestApp(dialect, {
        mfaRequired: 'admins', mfaEncryptionKey: randomBytes(32), oidcRedirectOrigin: ORIGIN, oidcProviders: [corp], webhookAllowPrivate: false
      }, { write: (line: string) => { logLines.push(line) } }))
    })
    after(async () => {
      await t.app?.close()
      await op?.close()
    })

    it('under MFA_REQUIRED=admins, a promotion by admin_groups at a sign-in that stops at the second step gives the user\'s password-only sessions no admin rights; the session after the second step is admin', async () => {
      const email = `${randomBytes(4).toString('hex')}@example.com`
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('promo'), password: GOOD_PASSWORD, email } })
      assert.equal(created.statusCode, 201, created.body)
      const user = created.json()
      const passwordOnly = await passwordSession(t, user.username)

      const sub = `sub-${randomBytes(6).toString('hex')}`
      op.accounts.set(sub, { email, email_verified: true, groups: ['gh-admins'] })
      const { res } = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(res.statusCode, 200, 'the enrolment step, not a session')
      assert.equal(res.cookies.some(c => c.name === 'gatehouse_session' && c.value !== ''), false)
      const stored = await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
      assert.equal(stored.json().role, 'admin', 'the provider made them an admin')

      assert.deepEqual(await adminAttempts(t, passwordOnly), { key: 403, adminUser: 403, role: 'user', mfa: 'false' })

      // The second step: enrol TOTP with the challenge, then finish with its code.
      const challenge = /name="challenge_token" value="([^"]+)"/.exec(res.body)![1]!
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/totp', payload: { challenge_token: challenge } })
      assert.equal(setup.statusCode, 200, setup.body)
      const done = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: challenge, totp_code: await generate({ secret: setup.json().secret }) } })
      assert.equal(done.statusCode, 200, done.body)
      const withFactor = await adminAttempts(t, done.json().token)
      assert.deepEqual(withFactor, { key: 201, adminUser: 201, role: 'admin', mfa: 'true' })
      // The password-only session stays without admin rights.
      assert.equal((await adminAttempts(t, passwordOnly)).key, 403)
    })

    it('under MFA_REQUIRED=admins, a password-only session of a user another admin promotes through the API gets no admin rights', async () => {
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('patched'), password: GOOD_PASSWORD } })
      const user = created.json()
      const passwordOnly = await passwordSession(t, user.username)
      const promoted = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { role: 'admin' } })
      assert.equal(promoted.statusCode, 200, promoted.body)
      assert.deepEqual(await adminAttempts(t, passwordOnly), { key: 403, adminUser: 403, role: 'user', mfa: 'false' })
      const console = await t.app.inject({ url: '/auth/admin/users', cookies: { gatehouse_session: passwordOnly } })
      assert.equal(console.statusCode, 403, 'the admin console is closed to it too')
      assert.match(console.body, /opened without a second factor.*sign in again/s, 'and says how to get in')
    })

    it('refuses an API-made provider whose issuer leads to an internal address, unless WEBHOOK_ALLOW_PRIVATE is set', async () => {
      for (const issuer of ['https://169.254.169.254', 'https://10.0.0.1', 'https://192.168.1.1/realms/x', 'https://[::ffff:169.254.169.254]', 'https://localhost', op.issuer]) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(t.adminKey), payload: { id: 'inner', display_name: 'Inner', issuer, client_id: 'x' } })
        assert.equal(res.statusCode, 422, `${issuer}: ${res.body}`)
        assert.equal(res.json().code, 'validation_failed')
        assert.equal(res.json().errors[0].pointer, '/issuer')
        // Plain http elsewhere than loopback is refused for its own reason; https to an internal address for this one.
        if (issuer.startsWith('https:')) assert.match(res.json().detail, /internal address.*WEBHOOK_ALLOW_PRIVATE/, issuer)
      }
      const plain = await t.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(t.adminKey), payload: { id: 'inner', display_name: 'Inner', issuer: 'http://10.0.0.1', client_id: 'x' } })
      assert.equal(plain.statusCode, 422)
      assert.equal((await t.app.inject({ url: '/auth/api/sso/providers/inner', headers: auth(t.adminKey) })).statusCode, 404, 'nothing was saved')

      const open = await createTestApp(dialect, { oidcRedirectOrigin: ORIGIN, webhookAllowPrivate: true })
      try {
        const res = await open.app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(open.adminKey), payload: { id: 'inner', display_name: 'Inner', issuer: op.issuer, client_id: op.clientId } })
        assert.equal(res.statusCode, 201, res.body)
        const moved = await open.app.inject({ method: 'PATCH', url: '/auth/api/sso/providers/inner', headers: auth(open.adminKey), payload: { issuer: 'https://169.254.169.254' } })
        assert.equal(moved.statusCode, 200, 'allowed with the opt-out')
      } finally {
        await open.app.close()
      }
    })

    it('refuses to move an API-made provider\'s issuer to an internal address', async () => {
      // Saved as it would have been before the guard (or while its name led to a public address).
      const at = new Date().toISOString()
      const row = { id: 'rebound', display_name: 'Rebound', issuer: 'https://203.0.113.9', client_id: op.clientId, client_secret: null, scopes: JSON.stringify(['openid']) }
      await insertProviderRow(t.app.db, { ...row, enabled: true, jit: true, link_by_email: false, groups_claim: null, group_map: '{}', admin_groups: '[]', created_at: at, updated_at: at })
      const moved = await t.app.inject({ method: 'PATCH', url: '/auth/api/sso/providers/rebound', headers: auth(t.adminKey), payload: { issuer: 'https://169.254.169.254' } })
      assert.equal(moved.statusCode, 422, moved.body)
      assert.equal(moved.json().errors[0].pointer, '/issuer')
    })

    it('never connects to an internal address for an API-made provider, whatever the stored issuer says (checked as each connection is made)', async () => {
      const at = new Date().toISOString()
      const before = op.requests
      await t.app.db.updateTable('oidc_providers').set({ issuer: op.issuer.replace('127.0.0.1', 'localhost'), updated_at: at }).where('id', '=', 'rebound').execute()
      const res = await t.app.inject({ url: '/auth/sso/rebound/start' })
      assert.equal(res.statusCode, 503, res.body)
      assert.equal(op.requests, before, 'the provider was never asked')
    })

    it('keeps a provider from OIDC_PROVIDERS on loopback working with the guard on, and logs the callback without its code and state', async () => {
      const sub = `sub-${randomBytes(6).toString('hex')}`
      const email = `${randomBytes(4).toString('hex')}@example.com`
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('logs'), password: GOOD_PASSWORD, email } })
      assert.equal(created.statusCode, 201, created.body)
      op.accounts.set(sub, { email, email_verified: true, groups: [] })
      const { res, callback } = await ssoSignIn(t, op, 'corp', sub)
      assert.equal(res.statusCode, 303, res.body)
      const code = callback.searchParams.get('code')!
      const state = callback.searchParams.get('state')!
      assert.ok(code.length > 8 && state.length > 8)
      const callbackLines = logLines.filter(line => line.includes('/auth/sso/corp/callback'))
      assert.ok(callbackLines.length > 0, 'the callback was logged')
      assert.ok(callbackLines.every(line => line.includes('code=[redacted]') && line.includes('state=[redacted]')), callbackLines.join('\n'))
      assert.ok(!logLines.some(line => line.includes(code) || line.includes(state)), 'neither secret is in any log line')
    })
  })
}
