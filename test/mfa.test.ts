import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { open } from '../src/lib/secret-box.ts'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { SoftAuthenticator } from './soft-authenticator.ts'

const ORIGIN = 'http://localhost:8080'
const BASE = { webauthnRpId: 'localhost', webauthnOrigins: [ORIGIN], mfaMaxFailures: 3 }

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function login (t: TestApp, username: string, from = '127.0.0.1'): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD }, remoteAddress: from })
}

async function sessionOf (t: TestApp, username: string): Promise<string> {
  const res = await login(t, username)
  assert.equal(res.statusCode, 200, res.body)
  return res.json().token
}

async function challengeOf (t: TestApp, username: string): Promise<{ challenge_token: string, methods: string[], enrolment_required: boolean }> {
  const res = await login(t, username)
  assert.equal(res.statusCode, 202, res.body)
  return res.json()
}

const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })

async function call (t: TestApp, method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, token: string, payload?: unknown): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method, url, headers: bearer(token), ...(payload !== undefined ? { payload: payload as Record<string, unknown> } : {}) })
}

async function completeMfa (t: TestApp, payload: Record<string, unknown>, from = '127.0.0.1'): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload, remoteAddress: from })
}

/** The code of the time step `steps` away from now (the server accepts one step either side). */
async function codeAt (secret: string, steps = 0): Promise<string> {
  return await generate({ secret, epoch: Math.floor(Date.now() / 1000) + steps * 30 })
}

async function enrolTotp (t: TestApp, token: string): Promise<{ secret: string, recoveryCodes: string[] }> {
  const setup = await call(t, 'POST', '/auth/api/me/mfa/totp', token)
  assert.equal(setup.statusCode, 200, setup.body)
  const { secret } = setup.json()
  const confirmed = await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(secret) })
  assert.equal(confirmed.statusCode, 200, confirmed.body)
  return { secret, recoveryCodes: confirmed.json().recovery_codes }
}

async function eventsOf (t: TestApp, userId: string): Promise<Array<{ type: string, data: Record<string, unknown> }>> {
  const res = await t.app.inject({ url: `/auth/api/events?target_id=${userId}&limit=1000`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function verifyHeaders (t: TestApp, token: string): Promise<LightMyRequestResponse> {
  const res = await t.app.inject({ url: '/auth/api/verify', headers: bearer(token) })
  assert.equal(res.statusCode, 200, res.body)
  return res
}

async function addPasskey (t: TestApp, token: string, authenticator: SoftAuthenticator, name = 'Laptop'): Promise<LightMyRequestResponse> {
  const options = await call(t, 'POST', '/auth/api/me/passkeys/options', token)
  assert.equal(options.statusCode, 200, options.body)
  assert.equal(options.json().ceremony, 'create')
  return await call(t, 'POST', '/auth/api/me/passkeys', token, { name, credential: authenticator.create(options.json().options) })
}

for (const dialect of dialects()) {
  describe(`second factors: TOTP and recovery codes (${dialect.name})`, () => {
    const key = randomBytes(32)
    const t = useTestApp(dialect, { ...BASE, mfaEncryptionKey: key })

    it('enrols TOTP with an otpauth URI and a server-rendered SVG QR code, and gives ten recovery codes on confirmation', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      const setup = await call(t, 'POST', '/auth/api/me/mfa/totp', token)
      assert.equal(setup.statusCode, 200, setup.body)
      const body = setup.json()
      assert.match(body.secret, /^[A-Z2-7]{32}$/)
      assert.match(body.otpauth_uri, new RegExp(`^otpauth://totp/gatehouse:${user.username}\\?secret=${body.secret}`))
      assert.match(body.qr_svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/)
      // Not enrolled until a code confirms it: a sign-in still needs the password only.
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().totp.pending, true)
      assert.equal((await login(t, user.username)).statusCode, 200)

      const wrong = await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(body.secret) === '000000' ? '111111' : '000000' })
      assert.equal(wrong.statusCode, 422)
      assert.equal(wrong.json().code, 'invalid_code')
      const confirmed = await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(body.secret) })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      const codes = confirmed.json().recovery_codes as string[]
      assert.equal(codes.length, 10)
      assert.equal(new Set(codes).size, 10)
      for (const code of codes) assert.match(code, /^[a-z0-9]{5}-[a-z0-9]{5}$/)
      const status = (await call(t, 'GET', '/auth/api/me/mfa', token)).json()
      assert.deepEqual({ ...status, passkeys: undefined }, { required: false, totp: { enrolled: true, pending: false }, passkeys: undefined, recovery_codes_remaining: 10 })
      const types = (await eventsOf(t, user.id)).map(e => e.type)
      assert.ok(types.includes('user.totp_enrolled') && types.includes('user.recovery_codes_generated'), types.join())
    })

    it('keeps the TOTP secret encrypted under MFA_ENCRYPTION_KEY, bound to its user, and recovery codes only as digests', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      const { secret, recoveryCodes } = await enrolTotp(t, token)
      const row = await t.app.db.selectFrom('totp_factors').selectAll().where('user_id', '=', user.id).executeTakeFirstOrThrow()
      assert.ok(!row.secret.includes(secret))
      assert.equal(open(key, row.secret, user.id), secret)
      assert.throws(() => open(key, row.secret, randomBytes(16).toString('hex')), /does not authenticate/)
      assert.throws(() => open(randomBytes(32), row.secret, user.id), /MFA_ENCRYPTION_KEY does not list/)
      const stored = await t.app.db.selectFrom('recovery_codes').select('digest').where('user_id', '=', user.id).execute()
      assert.equal(stored.length, 10)
      for (const code of recoveryCodes) assert.ok(!stored.some(s => s.digest.includes(code) || s.digest.includes(code.replace('-', ''))))
    })

    it('stores each recovery code as an argon2id hash behind its first two characters, and still takes a code stored as a SHA-256 digest before', async () => {
      const user = await createUser(t)
      const { recoveryCodes } = await enrolTotp(t, await sessionOf(t, user.username))
      const stored = await t.app.db.selectFrom('recovery_codes').select(['id', 'digest']).where('user_id', '=', user.id).execute()
      const plainDigests = recoveryCodes.map(code => createHash('sha256').update(code.replace('-', '')).digest('hex'))
      for (const row of stored) {
        assert.match(row.digest, /^[a-z0-9]{2}\$\$argon2id\$v=19\$m=\d+,t=\d+,p=\d+\$/)
        assert.ok(!plainDigests.includes(row.digest))
      }
      assert.deepEqual(stored.map(r => r.digest.slice(0, 2)).sort(), recoveryCodes.map(c => c.slice(0, 2)).sort())
      // A code as earlier builds stored it: the SHA-256 of the normalised code. One whose first two characters no other code shares, so its row is known.
      const unique = recoveryCodes.findIndex(c => recoveryCodes.filter(o => o.slice(0, 2) === c.slice(0, 2)).length === 1)
      const other = recoveryCodes.findIndex((_, i) => i !== unique)
      const legacy = recoveryCodes[unique]!
      const row = stored.find(r => r.digest.startsWith(legacy.slice(0, 2)))!
      await t.app.db.updateTable('recovery_codes').set({ digest: plainDigests[unique]! }).where('id', '=', row.id).execute()
      const first = await challengeOf(t, user.username)
      const used = await completeMfa(t, { challenge_token: first.challenge_token, recovery_code: legacy })
      assert.equal(used.statusCode, 200, used.body)
      const again = await challengeOf(t, user.username)
      assert.equal((await completeMfa(t, { challenge_token: again.challenge_token, recovery_code: legacy })).statusCode, 401)
      assert.equal((await completeMfa(t, { challenge_token: again.challenge_token, recovery_code: `${legacy.slice(0, 2)}zzz-zzzzz` })).statusCode, 401)
      assert.equal((await completeMfa(t, { challenge_token: again.challenge_token, recovery_code: recoveryCodes[other]! })).statusCode, 200)
    })

    it('answers a right password with a single-use challenge instead of a session, and completes it with a TOTP code', async () => {
      const user = await createUser(t)
      const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
      const res = await login(t, user.username)
      assert.equal(res.statusCode, 202, res.body)
      assert.equal(res.headers['set-cookie'], undefined)
      const challenge = res.json()
      assert.deepEqual(Object.keys(challenge).sort(), ['challenge_token', 'enrolment_required', 'expires_at', 'methods', 'mfa_required'])
      assert.deepEqual(challenge.methods, ['totp', 'recovery_code'])
      assert.match(challenge.challenge_token, /^gatehouse_mfa_[0-9A-Za-z]{43}$/)
      // The challenge is no credential.
      assert.equal((await t.app.inject({ url: '/auth/api/me', headers: bearer(challenge.challenge_token) })).statusCode, 401)
      const stored = await t.app.db.selectFrom('mfa_challenges').select('digest').where('user_id', '=', user.id).execute()
      assert.ok(stored.every(s => s.digest !== challenge.challenge_token))

      const done = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(secret, 1) })
      assert.equal(done.statusCode, 200, done.body)
      assert.match(done.json().token, /^gatehouse_session_/)
      assert.equal(done.json().recovery_codes, undefined)
      assert.match(String(done.headers['set-cookie']), /gatehouse_session=/)
      assert.equal((await verifyHeaders(t, done.json().token)).headers['x-auth-mfa'], 'true')
      const again = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(secret, 1) })
      assert.equal(again.statusCode, 401)
      assert.equal(again.json().code, 'mfa_failed')
      const succeeded = (await eventsOf(t, user.id)).filter(e => e.type === 'user.login_succeeded')
      assert.equal(succeeded[0]!.data.mfa, 'totp')
    })

    it('accepts a TOTP code once: the code that confirmed enrolment, or any earlier one, does not sign in', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      const setup = (await call(t, 'POST', '/auth/api/me/mfa/totp', token)).json()
      const code = await codeAt(setup.secret)
      assert.equal((await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code })).statusCode, 200)
      const challenge = await challengeOf(t, user.username)
      const replay = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: code })
      assert.equal(replay.statusCode, 401)
      const earlier = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(setup.secret, -1) })
      assert.equal(earlier.statusCode, 401)
      const reasons = (await eventsOf(t, user.id)).filter(e => e.type === 'user.mfa_failed').map(e => e.data.reason)
      assert.deepEqual(reasons, ['wrong_code', 'wrong_code'])
    })

    it('opens no session for a second step begun before the password was changed or the sessions were ended', async () => {
      const user = await createUser(t)
      const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
      const beforeChange = await challengeOf(t, user.username)
      const changed = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { password: 'an entirely new passphrase' } })
      assert.equal(changed.statusCode, 200, changed.body)
      const late = await completeMfa(t, { challenge_token: beforeChange.challenge_token, totp_code: await codeAt(secret, 1) })
      assert.equal(late.statusCode, 401, late.body)
      assert.equal(late.json().code, 'mfa_failed')

      const again = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: 'an entirely new passphrase' } })
      assert.equal(again.statusCode, 202, again.body)
      const ended = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/sessions`, headers: auth(t.adminKey) })
      assert.equal(ended.statusCode, 200, ended.body)
      const afterEnd = await completeMfa(t, { challenge_token: again.json().challenge_token, totp_code: await codeAt(secret, 1) })
      assert.equal(afterEnd.statusCode, 401, afterEnd.body)
      assert.equal((await t.app.db.selectFrom('sessions').select('id').where('user_id', '=', user.id).where('ended_at', 'is', null).execute()).length, 0)
    })

    it('answers a second step racing the user\'s disabling without a server error, and leaves no live session', async () => {
      for (let round = 0; round < 6; round++) {
        const user = await createUser(t)
        const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
        const challenge = await challengeOf(t, user.username)
        const [completed, disabled] = await Promise.all([
          completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(secret, 1) }),
          t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { disabled: true } })
        ])
        assert.equal(disabled.statusCode, 200, `round ${round}: ${disabled.body}`)
        assert.ok([200, 401].includes(completed.statusCode), `round ${round}: ${completed.body}`)
        if (completed.statusCode === 200) assert.equal((await call(t, 'GET', '/auth/api/me', completed.json().token)).statusCode, 401)
      }
    })

    it('opens one session when two requests bring the same fresh code at once', async () => {
      const user = await createUser(t)
      const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
      const next = await codeAt(secret, 1)
      const [first, second] = [await challengeOf(t, user.username), await challengeOf(t, user.username)]
      const raced = await Promise.all([
        completeMfa(t, { challenge_token: first.challenge_token, totp_code: next }),
        completeMfa(t, { challenge_token: second.challenge_token, totp_code: next })
      ])
      assert.deepEqual(raced.map(r => r.statusCode).sort(), [200, 401])
      const sessions = await t.app.db.selectFrom('sessions').select('id').where('user_id', '=', user.id).where('mfa', '=', true).execute()
      assert.equal(sessions.length, 1)
    })

    it('signs in with each recovery code once', async () => {
      const user = await createUser(t)
      const { recoveryCodes } = await enrolTotp(t, await sessionOf(t, user.username))
      const first = await challengeOf(t, user.username)
      const used = await completeMfa(t, { challenge_token: first.challenge_token, recovery_code: recoveryCodes[3]!.toUpperCase().replace('-', ' ') })
      assert.equal(used.statusCode, 200, used.body)
      const second = await challengeOf(t, user.username)
      const reused = await completeMfa(t, { challenge_token: second.challenge_token, recovery_code: recoveryCodes[3] })
      assert.equal(reused.statusCode, 401)
      assert.equal((await completeMfa(t, { challenge_token: second.challenge_token, recovery_code: recoveryCodes[4] })).statusCode, 200)
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', used.json().token)).json().recovery_codes_remaining, 8)
      const used2 = (await eventsOf(t, user.id)).filter(e => e.type === 'user.recovery_code_used').map(e => e.data.remaining)
      assert.deepEqual(used2, [8, 9])
    })

    it('gives a wrong code, an unknown, used or expired challenge the same 401 mfa_failed', async () => {
      const user = await createUser(t)
      const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
      const challenge = await challengeOf(t, user.username)
      const current = await codeAt(secret)
      const wrong = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: current === '123456' ? '654321' : '123456' })
      const unknown = await completeMfa(t, { challenge_token: `gatehouse_mfa_${'A'.repeat(43)}`, totp_code: await codeAt(secret, 1) })
      await t.app.db.updateTable('mfa_challenges').set({ expires_at: new Date(Date.now() - 1000).toISOString() }).where('user_id', '=', user.id).execute()
      const expired = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(secret, 1) })
      const strip = (r: LightMyRequestResponse): unknown => ({ status: r.statusCode, body: { ...r.json(), request_id: undefined } })
      assert.deepEqual(strip(unknown), strip(wrong))
      assert.deepEqual(strip(expired), strip(wrong))
      assert.equal(wrong.statusCode, 401)
    })

    it('throttles second-factor guesses per account across addresses: concurrent wrong codes get exactly MFA_MAX_FAILURES checks', async () => {
      const user = await createUser(t)
      const { secret } = await enrolTotp(t, await sessionOf(t, user.username))
      const challenges = await Promise.all(Array.from({ length: 4 }, async () => await challengeOf(t, user.username)))
      const right = await codeAt(secret, 1)
      const wrongCode = right === '000000' ? '000001' : '000000'
      const guesses = await Promise.all(Array.from({ length: 12 }, async (_, i) =>
        await completeMfa(t, { challenge_token: challenges[i % 4]!.challenge_token, totp_code: wrongCode }, `10.9.${i}.1`)))
      const statuses = guesses.map(r => r.statusCode)
      assert.equal(statuses.filter(s => s === 401).length, 3, statuses.join())
      assert.equal(statuses.filter(s => s === 429).length, 9, statuses.join())
      const limited = guesses.find(r => r.statusCode === 429)!
      assert.equal(limited.json().code, 'rate_limited')
      assert.ok(Number(limited.headers['retry-after']) >= 1)
      // The budget is spent: even the right code waits, and is not spent by the refusal.
      assert.equal((await completeMfa(t, { challenge_token: challenges[0]!.challenge_token, totp_code: right }, '10.9.99.1')).statusCode, 429)
      const failed = (await eventsOf(t, user.id)).filter(e => e.type === 'user.mfa_failed')
      assert.equal(failed.length, 3)
    })

    it('reports X-Auth-MFA: false for a password-only session and for an API key', async () => {
      const user = await createUser(t)
      assert.equal((await verifyHeaders(t, await sessionOf(t, user.username))).headers['x-auth-mfa'], 'false')
      const res = await t.app.inject({ url: '/auth/api/verify', headers: auth(t.adminKey) })
      assert.equal(res.headers['x-auth-mfa'], 'false')
    })

    it('lets only a signed-in session manage factors, not an API key', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 403)
    })

    it('lets an admin reset a user\'s factors, recorded, after which the password alone signs in', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      await enrolTotp(t, token)
      assert.equal((await login(t, user.username)).statusCode, 202)
      const status = await t.app.inject({ url: `/auth/api/users/${user.id}/mfa`, headers: auth(t.adminKey) })
      assert.equal(status.json().totp.enrolled, true)
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/mfa`, headers: bearer(token) })).statusCode, 403)
      const reset = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/mfa`, headers: auth(t.adminKey) })
      assert.equal(reset.statusCode, 204, reset.body)
      assert.equal((await login(t, user.username)).statusCode, 200)
      const event = (await eventsOf(t, user.id)).find(e => e.type === 'user.mfa_reset')
      assert.deepEqual(event?.data, { totp: true, passkeys: 0, recovery_codes: 10 })
      assert.equal((await t.app.inject({ method: 'DELETE', url: '/auth/api/users/0190a3b4-0000-7000-8000-000000000000/mfa', headers: auth(t.adminKey) })).statusCode, 404)
    })

    it('removes TOTP and its recovery codes with it when it was the last factor', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      await enrolTotp(t, token)
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp', token)).statusCode, 204)
      const status = (await call(t, 'GET', '/auth/api/me/mfa', token)).json()
      assert.equal(status.totp.enrolled, false)
      assert.equal(status.recovery_codes_remaining, 0)
      assert.equal((await login(t, user.username)).statusCode, 200)
    })
  })

  describe(`second factors: passkeys (${dialect.name})`, () => {
    const t = useTestApp(dialect, { ...BASE, mfaEncryptionKey: randomBytes(32) })

    it('registers several named passkeys, renames and removes them, and uses one as the second factor', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      const first = await addPasskey(t, token, authenticator, 'Laptop')
      assert.equal(first.statusCode, 201, first.body)
      assert.equal(first.json().passkey.name, 'Laptop')
      assert.equal(first.json().recovery_codes.length, 10)
      const second = await addPasskey(t, token, authenticator, 'Phone')
      assert.equal(second.statusCode, 201, second.body)
      assert.equal(second.json().recovery_codes, undefined)

      const renamed = await call(t, 'PATCH', `/auth/api/me/passkeys/${second.json().passkey.id}`, token, { name: 'Old phone' })
      assert.equal(renamed.statusCode, 200, renamed.body)
      assert.deepEqual((await call(t, 'GET', '/auth/api/me/mfa', token)).json().passkeys.map((p: { name: string }) => p.name), ['Laptop', 'Old phone'])

      const challenge = await challengeOf(t, user.username)
      assert.deepEqual(challenge.methods, ['passkey', 'recovery_code'])
      const options = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/passkey-options', payload: { challenge_token: challenge.challenge_token } })
      assert.equal(options.statusCode, 200, options.body)
      assert.equal(options.json().ceremony, 'get')
      assert.equal(options.json().options.allowCredentials.length, 2)
      const assertion = authenticator.get(options.json().options)
      const done = await completeMfa(t, { challenge_token: challenge.challenge_token, passkey: assertion })
      assert.equal(done.statusCode, 200, done.body)
      assert.equal((await verifyHeaders(t, done.json().token)).headers['x-auth-mfa'], 'true')

      assert.equal((await call(t, 'DELETE', `/auth/api/me/passkeys/${second.json().passkey.id}`, token)).statusCode, 204)
      assert.equal((await call(t, 'DELETE', `/auth/api/me/passkeys/${second.json().passkey.id}`, token)).statusCode, 404)
      const types = (await eventsOf(t, user.id)).map(e => e.type)
      for (const type of ['user.passkey_added', 'user.passkey_renamed', 'user.passkey_removed']) assert.ok(types.includes(type), type)
    })

    it('refuses an assertion for another challenge, a replayed signature counter, and another user\'s passkey', async () => {
      const user = await createUser(t)
      const other = await createUser(t)
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      assert.equal((await addPasskey(t, await sessionOf(t, user.username), authenticator)).statusCode, 201)
      const stranger = new SoftAuthenticator(ORIGIN, 'localhost')
      assert.equal((await addPasskey(t, await sessionOf(t, other.username), stranger)).statusCode, 201)

      const challenge = await challengeOf(t, user.username)
      const options = (await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/passkey-options', payload: { challenge_token: challenge.challenge_token } })).json().options
      const forOther = await completeMfa(t, { challenge_token: challenge.challenge_token, passkey: authenticator.get({ challenge: 'bm90LXRoZS1jaGFsbGVuZ2U' }) })
      assert.equal(forOther.statusCode, 401)
      const strangers = await completeMfa(t, { challenge_token: challenge.challenge_token, passkey: stranger.get(options) })
      assert.equal(strangers.statusCode, 401)
      const good = authenticator.get(options, 0, 5)
      assert.equal((await completeMfa(t, { challenge_token: challenge.challenge_token, passkey: good })).statusCode, 200)
      // A cloned authenticator shows itself by a counter that does not move forward.
      const again = await challengeOf(t, user.username)
      const options2 = (await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/passkey-options', payload: { challenge_token: again.challenge_token } })).json().options
      assert.equal((await completeMfa(t, { challenge_token: again.challenge_token, passkey: authenticator.get(options2, 0, 5) })).statusCode, 401)
    })

    it('signs in with a passkey alone when the authenticator verifies its user, and never twice with one assertion', async () => {
      const user = await createUser(t)
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      assert.equal((await addPasskey(t, await sessionOf(t, user.username), authenticator)).statusCode, 201)
      const options = await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey/options' })
      assert.equal(options.statusCode, 200, options.body)
      assert.equal(options.json().options.userVerification, 'required')
      const assertion = authenticator.get(options.json().options)
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey', payload: { credential: assertion } })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().user.id, user.id)
      assert.equal((await verifyHeaders(t, res.json().token)).headers['x-auth-mfa'], 'true')
      const listed = (await call(t, 'GET', '/auth/api/me/sessions', res.json().token)).json() as Array<{ id: string, method: string, mfa: boolean }>
      assert.deepEqual(listed.filter(s => s.id === res.json().session_id).map(s => [s.method, s.mfa]), [['passkey', true]], 'listed as a passkey sign-in')
      const replay = await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey', payload: { credential: assertion } })
      assert.equal(replay.statusCode, 401)
      assert.equal(replay.json().code, 'invalid_credentials')

      const noVerification = new SoftAuthenticator(ORIGIN, 'localhost', false)
      assert.equal((await addPasskey(t, await sessionOf(t, (await createUser(t)).username), noVerification)).statusCode, 201)
      const options2 = (await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey/options' })).json().options
      const refused = await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey', payload: { credential: noVerification.get(options2) } })
      assert.equal(refused.statusCode, 401)
      const event = (await eventsOf(t, user.id)).find(e => e.type === 'user.login_succeeded' && e.data.passwordless === true)
      assert.equal(event?.data.mfa, 'passkey')
    })

    it('refuses a passkey made for another origin', async () => {
      const user = await createUser(t)
      const phishing = new SoftAuthenticator('http://evil.example', 'localhost')
      const res = await addPasskey(t, await sessionOf(t, user.username), phishing)
      assert.equal(res.statusCode, 422)
      assert.equal(res.json().code, 'passkey_rejected')
    })
  })

  describe(`MFA_REQUIRED=admins (${dialect.name})`, () => {
    const t = useTestApp(dialect, { ...BASE, mfaEncryptionKey: randomBytes(32), mfaRequired: 'admins' })

    it('makes an admin without a factor enrol one during sign-in, and leaves other users alone', async () => {
      const admin = await createUser(t, { role: 'admin' })
      const user = await createUser(t)
      assert.equal((await login(t, user.username)).statusCode, 200)
      const challenge = await challengeOf(t, admin.username)
      assert.equal(challenge.enrolment_required, true)
      assert.deepEqual(challenge.methods, ['totp', 'passkey'])
      // Nothing to complete with yet.
      assert.equal((await completeMfa(t, { challenge_token: challenge.challenge_token, recovery_code: 'aaaaa-aaaaa' })).statusCode, 401)
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/totp', payload: { challenge_token: challenge.challenge_token } })
      assert.equal(setup.statusCode, 200, setup.body)
      const done = await completeMfa(t, { challenge_token: challenge.challenge_token, totp_code: await codeAt(setup.json().secret) })
      assert.equal(done.statusCode, 200, done.body)
      assert.equal(done.json().recovery_codes.length, 10)
      const status = (await call(t, 'GET', '/auth/api/me/mfa', done.json().token)).json()
      assert.equal(status.required, true)
      assert.equal(status.totp.enrolled, true)
      // Its last factor cannot be removed while the policy applies.
      const removal = await call(t, 'DELETE', '/auth/api/me/mfa/totp', done.json().token)
      assert.equal(removal.statusCode, 409)
      assert.equal(removal.json().code, 'mfa_required')
      const next = await challengeOf(t, admin.username)
      assert.equal(next.enrolment_required, false)
    })

    it('lets an admin who must enrol register a passkey as the first factor during sign-in', async () => {
      const admin = await createUser(t, { role: 'admin' })
      const challenge = await challengeOf(t, admin.username)
      const options = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/passkey-options', payload: { challenge_token: challenge.challenge_token } })
      assert.equal(options.json().ceremony, 'create')
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      const done = await completeMfa(t, { challenge_token: challenge.challenge_token, passkey: authenticator.create(options.json().options), passkey_name: 'Key' })
      assert.equal(done.statusCode, 200, done.body)
      assert.equal(done.json().recovery_codes.length, 10)
      const types = (await eventsOf(t, admin.id)).map(e => e.type)
      assert.ok(types.includes('user.passkey_added') && types.includes('user.mfa_challenged'))
    })
  })

  describe(`without MFA_ENCRYPTION_KEY (${dialect.name})`, () => {
    const t = useTestApp(dialect, { ...BASE, mfaRequired: 'all' })

    it('refuses TOTP enrolment with 409 totp_not_configured and offers passkeys only', async () => {
      const user = await createUser(t)
      const challenge = await challengeOf(t, user.username)
      assert.deepEqual(challenge.methods, ['passkey'])
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa/totp', payload: { challenge_token: challenge.challenge_token } })
      assert.equal(setup.statusCode, 409)
      assert.equal(setup.json().code, 'totp_not_configured')
    })
  })

  describe(`recent authentication for changes to factors (${dialect.name})`, () => {
    const WINDOW_MS = 10 * 60_000
    const t = useTestApp(dialect, { ...BASE, mfaEncryptionKey: randomBytes(32), reauthWindowMs: WINDOW_MS, loginMaxFailuresPerAccount: 3 })

    /** A password-only session and its id. */
    async function signedIn (username: string, from = '127.0.0.1'): Promise<{ token: string, sessionId: string }> {
      const res = await login(t, username, from)
      assert.equal(res.statusCode, 200, res.body)
      return { token: res.json().token, sessionId: res.json().session_id }
    }

    /** Moves the session's sign-in (and any re-authentication) `ms` into the past: the clock is the database's row, not a sleep. */
    async function signedInAgo (sessionId: string, ms: number): Promise<void> {
      await t.app.db.updateTable('sessions').set({ created_at: new Date(Date.now() - ms).toISOString(), reauthenticated_at: null })
        .where('id', '=', sessionId).execute()
    }

    async function reauth (token: string, payload: Record<string, unknown>, from = '127.0.0.1'): Promise<LightMyRequestResponse> {
      return await t.app.inject({ method: 'POST', url: '/auth/api/me/reauthenticate', headers: bearer(token), payload, remoteAddress: from })
    }

    it('refuses every change to factors from a session signed in longer ago than the window with 403 reauthentication_required, and allows them after a re-authentication with the password', async () => {
      const user = await createUser(t)
      const { token, sessionId } = await signedIn(user.username)
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      const { secret } = await enrolTotp(t, token)
      const added = await addPasskey(t, token, authenticator)
      assert.equal(added.statusCode, 201, added.body)
      const passkeyId = added.json().passkey.id
      const registration = await call(t, 'POST', '/auth/api/me/passkeys/options', token)
      assert.equal(registration.statusCode, 200, registration.body)

      await signedInAgo(sessionId, WINDOW_MS + 60_000)
      const guarded: Array<[string, () => Promise<LightMyRequestResponse>]> = [
        ['start TOTP', async () => await call(t, 'POST', '/auth/api/me/mfa/totp', token)],
        ['confirm TOTP', async () => await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(secret) })],
        ['remove TOTP', async () => await call(t, 'DELETE', '/auth/api/me/mfa/totp', token)],
        ['new recovery codes', async () => await call(t, 'POST', '/auth/api/me/mfa/recovery-codes', token)],
        ['passkey options', async () => await call(t, 'POST', '/auth/api/me/passkeys/options', token)],
        ['add a passkey', async () => await call(t, 'POST', '/auth/api/me/passkeys', token, { name: 'Second', credential: authenticator.create(registration.json().options) })],
        ['remove a passkey', async () => await call(t, 'DELETE', `/auth/api/me/passkeys/${passkeyId}`, token)]
      ]
      for (const [what, request] of guarded) {
        const res = await request()
        assert.equal(res.statusCode, 403, `${what}: ${res.body}`)
        assert.equal(res.json().code, 'reauthentication_required', what)
        assert.deepEqual(res.json().reauthenticate_with, ['password', 'totp', 'passkey', 'recovery_code'], what)
      }
      const status = (await call(t, 'GET', '/auth/api/me/mfa', token)).json()
      assert.equal(status.totp.enrolled, true)
      assert.equal(status.passkeys.length, 1)
      assert.equal(status.recovery_codes_remaining, 10)
      // Renaming changes no factor: no proof needed.
      assert.equal((await call(t, 'PATCH', `/auth/api/me/passkeys/${passkeyId}`, token, { name: 'Renamed' })).statusCode, 200)

      const proved = await reauth(token, { password: GOOD_PASSWORD })
      assert.equal(proved.statusCode, 200, proved.body)
      assert.equal(proved.json().method, 'password')
      assert.equal(new Date(proved.json().valid_until).getTime() - new Date(proved.json().reauthenticated_at).getTime(), WINDOW_MS)
      assert.equal((await call(t, 'POST', '/auth/api/me/mfa/recovery-codes', token)).statusCode, 200)
      assert.equal((await call(t, 'DELETE', `/auth/api/me/passkeys/${passkeyId}`, token)).statusCode, 204)
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp', token)).statusCode, 204)
      const events = await eventsOf(t, user.id)
      const done = events.find(e => e.type === 'user.reauthenticated')
      assert.deepEqual(done?.data, { method: 'password', session_id: sessionId })
    })

    it('counts a fresh sign-in as recent until the window has passed since it', async () => {
      const user = await createUser(t)
      const { token, sessionId } = await signedIn(user.username)
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', token)).statusCode, 200)
      await signedInAgo(sessionId, WINDOW_MS - 60_000)
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', token)).statusCode, 200)
      await signedInAgo(sessionId, WINDOW_MS + 1000)
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', token)).json().code, 'reauthentication_required')
      // Another sign-in is a new session, recent again.
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', (await signedIn(user.username)).token)).statusCode, 200)
    })

    it('refuses a wrong password with 401, records it, and counts it toward the sign-in throttle of the account', async () => {
      const user = await createUser(t)
      const from = '198.51.100.31'
      const { token, sessionId } = await signedIn(user.username, from)
      await signedInAgo(sessionId, WINDOW_MS + 60_000)
      for (let i = 0; i < 3; i++) {
        const wrong = await reauth(token, { password: 'not the password at all' }, from)
        assert.equal(wrong.statusCode, 401, wrong.body)
        assert.equal(wrong.json().code, 'invalid_credentials')
      }
      // The account's budget from this address is spent: the right password is not even checked, and sign-in is throttled alike.
      const throttled = await reauth(token, { password: GOOD_PASSWORD }, from)
      assert.equal(throttled.statusCode, 429, throttled.body)
      assert.equal((await login(t, user.username, from)).statusCode, 429)
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', token)).json().code, 'reauthentication_required')
      const failures = (await eventsOf(t, user.id)).filter(e => e.type === 'user.reauthentication_failed')
      assert.equal(failures.length, 3)
      assert.deepEqual(failures[0]!.data, { reason: 'wrong_password', method: 'password', session_id: sessionId })
      assert.ok(!JSON.stringify(failures).includes('not the password at all'))
    })

    it('re-authenticates with a TOTP code (once per code), a recovery code (spent) or a passkey', async () => {
      const user = await createUser(t)
      const { token, sessionId } = await signedIn(user.username)
      const { secret, recoveryCodes } = await enrolTotp(t, token)
      const authenticator = new SoftAuthenticator(ORIGIN, 'localhost')
      assert.equal((await addPasskey(t, token, authenticator)).statusCode, 201)

      await signedInAgo(sessionId, WINDOW_MS + 60_000)
      const code = await codeAt(secret, 1)
      const byCode = await reauth(token, { totp_code: code })
      assert.equal(byCode.statusCode, 200, byCode.body)
      assert.equal(byCode.json().method, 'totp')
      assert.equal((await call(t, 'POST', '/auth/api/me/passkeys/options', token)).statusCode, 200)

      await signedInAgo(sessionId, WINDOW_MS + 60_000)
      assert.equal((await reauth(token, { totp_code: code })).statusCode, 401, 'a code is accepted once')
      const byRecovery = await reauth(token, { recovery_code: recoveryCodes[0]!.toUpperCase() })
      assert.equal(byRecovery.statusCode, 200, byRecovery.body)
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().recovery_codes_remaining, 9)

      await signedInAgo(sessionId, WINDOW_MS + 60_000)
      const options = await call(t, 'POST', '/auth/api/me/reauthenticate/passkey-options', token)
      assert.equal(options.statusCode, 200, options.body)
      assert.equal(options.json().ceremony, 'get')
      // A re-authentication ceremony is no passwordless sign-in.
      const assertion = authenticator.get(options.json().options)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login/passkey', payload: { credential: assertion } })).statusCode, 401)
      const byPasskey = await reauth(token, { passkey: authenticator.get(options.json().options) })
      assert.equal(byPasskey.statusCode, 200, byPasskey.body)
      assert.equal(byPasskey.json().method, 'passkey')
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp', token)).statusCode, 204)
    })

    it('takes exactly one proof, and only from a session: API keys can neither re-authenticate nor change factors', async () => {
      const user = await createUser(t)
      const { token } = await signedIn(user.username)
      const both = await reauth(token, { password: GOOD_PASSWORD, totp_code: '123456' })
      assert.equal(both.statusCode, 422)
      assert.equal((await reauth(token, {})).statusCode, 422)
      const byKey = await t.app.inject({ method: 'POST', url: '/auth/api/me/reauthenticate', headers: auth(t.adminKey), payload: { password: GOOD_PASSWORD } })
      assert.equal(byKey.statusCode, 403)
      assert.equal(byKey.json().code, 'forbidden')
    })

    it('asks on the account page for a re-authentication, then lets the person retry', async () => {
      const user = await createUser(t)
      const res = await login(t, user.username)
      const cookie = { gatehouse_session: res.json().token }
      const page = async (url: string, form?: Record<string, string>): Promise<LightMyRequestResponse> => await t.app.inject({
        method: form === undefined ? 'GET' : 'POST',
        url,
        cookies: cookie,
        headers: form === undefined ? {} : { 'content-type': 'application/x-www-form-urlencoded', 'sec-fetch-site': 'same-origin' },
        ...(form !== undefined ? { payload: new URLSearchParams(form).toString() } : {})
      })
      assert.equal((await page('/auth/account/totp', {})).statusCode, 200)
      await signedInAgo(res.json().session_id, WINDOW_MS + 60_000)

      const asked = await page('/auth/account/totp', {})
      assert.equal(asked.statusCode, 403)
      assert.match(asked.body, /<section class="reauth" id="reauth">/)
      assert.match(asked.body, /<input id="reauth-password" name="password" type="password"/)
      assert.doesNotMatch(asked.body, /id="totp-qr"/)
      const wrong = await page('/auth/account/reauthenticate', { password: 'not the password at all' })
      assert.equal(wrong.statusCode, 401)
      assert.match(wrong.body, /id="reauth"/)
      const proved = await page('/auth/account/reauthenticate', { password: GOOD_PASSWORD })
      assert.equal(proved.statusCode, 303)
      assert.equal(proved.headers.location, '/auth/account?reauthenticated=1')
      assert.match((await page('/auth/account?reauthenticated=1')).body, /id="notice"/)
      const retried = await page('/auth/account/totp', {})
      assert.equal(retried.statusCode, 200)
      assert.match(retried.body, /id="totp-qr"/)
    })
  })

  describe(`TOTP set-up: mistakes, cancelling, the account page (${dialect.name})`, () => {
    const t = useTestApp(dialect, { ...BASE, mfaEncryptionKey: randomBytes(32) })

    async function pages (username: string): Promise<(url: string, form?: Record<string, string>) => Promise<LightMyRequestResponse>> {
      const token = await sessionOf(t, username)
      return async (url, form) => await t.app.inject({
        method: form === undefined ? 'GET' : 'POST',
        url,
        cookies: { gatehouse_session: token },
        headers: form === undefined ? {} : { 'content-type': 'application/x-www-form-urlencoded', 'sec-fetch-site': 'same-origin' },
        ...(form !== undefined ? { payload: new URLSearchParams(form).toString() } : {})
      })
    }

    const keyOn = (html: string): string => /<code id="totp-secret">([A-Z2-7 ]+)<\/code>/.exec(html)![1]!

    it('keeps the pending set-up after a mistyped code on the account page, shows the same key grouped by four, and turns it on with the next right code', async () => {
      const user = await createUser(t)
      const page = await pages(user.username)
      const started = await page('/auth/account/totp', {})
      assert.equal(started.statusCode, 200, started.body)
      const shown = keyOn(started.body)
      assert.match(shown, /^([A-Z2-7]{4} )+[A-Z2-7]{1,4}$/)
      const secret = shown.replace(/ /g, '')
      const wrongCode = await codeAt(secret) === '000000' ? '111111' : '000000'
      const wrong = await page('/auth/account/totp/confirm', { code: wrongCode })
      assert.equal(wrong.statusCode, 422)
      assert.equal(keyOn(wrong.body), shown)
      assert.match(wrong.body, /the set-up is kept/)
      const right = await page('/auth/account/totp/confirm', { code: await codeAt(secret) })
      assert.equal(right.statusCode, 200, right.body)
      assert.equal((right.body.match(/<li><code>/g) ?? []).length, 10)
      assert.match(right.body, /id="copy-codes"/)
      assert.match(right.body, /id="download-codes"/)
    })

    it('discards a pending set-up after ten wrong codes', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      const { secret } = (await call(t, 'POST', '/auth/api/me/mfa/totp', token)).json()
      await t.app.db.updateTable('totp_factors').set({ confirm_failures: 9 }).where('user_id', '=', user.id).execute()
      const tenth = await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(secret) === '000000' ? '111111' : '000000' })
      assert.equal(tenth.statusCode, 409, tenth.body)
      assert.equal(tenth.json().code, 'totp_not_pending')
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().totp.pending, false)
      assert.equal((await call(t, 'POST', '/auth/api/me/mfa/totp/confirm', token, { code: await codeAt(secret) })).json().code, 'totp_not_pending')
      // A new set-up starts its count afresh.
      assert.equal((await call(t, 'POST', '/auth/api/me/mfa/totp', token)).statusCode, 200)
      const row = await t.app.db.selectFrom('totp_factors').select('confirm_failures').where('user_id', '=', user.id).executeTakeFirstOrThrow()
      assert.equal(row.confirm_failures, 0)
    })

    it('cancels a pending set-up through the API and the page, and leaves an enrolled app alone', async () => {
      const user = await createUser(t)
      const token = await sessionOf(t, user.username)
      assert.equal((await call(t, 'POST', '/auth/api/me/mfa/totp', token)).statusCode, 200)
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp/setup', token)).statusCode, 204)
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().totp.pending, false)
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp/setup', token)).json().code, 'totp_not_pending')

      const page = await pages(user.username)
      assert.equal((await page('/auth/account/totp', {})).statusCode, 200)
      const waiting = await page('/auth/account')
      assert.match(waiting.body, /Continue the set-up/)
      assert.equal((await page('/auth/account/totp/cancel', {})).statusCode, 303)
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().totp.pending, false)

      await enrolTotp(t, token)
      assert.equal((await call(t, 'DELETE', '/auth/api/me/mfa/totp/setup', token)).json().code, 'totp_not_pending')
      assert.equal((await call(t, 'GET', '/auth/api/me/mfa', token)).json().totp.enrolled, true)
    })

    it('links the account page back to the admin console for admins only', async () => {
      const admin = await createUser(t, { role: 'admin' })
      assert.match((await (await pages(admin.username))('/auth/account')).body, /<a href="\/auth\/admin" id="console-link">/)
      const user = await createUser(t)
      assert.doesNotMatch((await (await pages(user.username))('/auth/account')).body, /console-link/)
    })
  })
}
