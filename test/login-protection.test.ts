import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { rmSync } from 'node:fs'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { NO_REDIS, TEST_REDIS_URL } from './redis.ts'

const WRONG = 'not the password at all'

async function createUser (t: TestApp): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function login (t: TestApp, username: string, password: string, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', headers, payload: { username, password }, remoteAddress: headers['x-test-remote'] ?? '127.0.0.1' })
}

const dialect = dialects()[0]!

describe('sign-in throttling', () => {
  const t = useTestApp(dialect, { loginMaxFailuresPerAccount: 5, loginMaxFailuresPerAddress: 12 })

  it('answers 429 with Retry-After and RateLimit headers after the failures allowed for one account from one address, even for the right password', async () => {
    const user = await createUser(t)
    for (let i = 0; i < 5; i++) assert.equal((await login(t, user.username, WRONG)).statusCode, 401)
    for (const password of [WRONG, GOOD_PASSWORD]) {
      const res = await login(t, user.username, password)
      assert.equal(res.statusCode, 429)
      assert.equal(res.json().code, 'rate_limited')
      assert.ok(Number(res.headers['retry-after']) > 0)
      assert.equal(res.headers['ratelimit-remaining'], '0')
      assert.ok(res.headers['ratelimit-limit'])
      assert.ok(res.headers['ratelimit-reset'])
    }
    // Another address is not throttled for this account.
    assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'x-test-remote': '127.0.0.2' })).statusCode, 200)
  })

  it('does not let a rotating X-Forwarded-For reset the count when no proxy is trusted', async () => {
    const user = await createUser(t)
    for (let i = 0; i < 5; i++) {
      await login(t, user.username, WRONG, { 'x-forwarded-for': `10.0.0.${i}`, 'x-test-remote': '127.0.0.3' })
    }
    const res = await login(t, user.username, GOOD_PASSWORD, { 'x-forwarded-for': '10.9.9.9', 'x-test-remote': '127.0.0.3' })
    assert.equal(res.statusCode, 429)
  })

  it('throttles one address across accounts', async () => {
    const remote = '127.0.0.4'
    for (let i = 0; i < 12; i++) await login(t, `nobody_${i}_${uniqueName()}`, WRONG, { 'x-test-remote': remote })
    const user = await createUser(t)
    assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'x-test-remote': remote })).statusCode, 429)
  })

  it('forgets an account\'s failures after a successful sign-in', async () => {
    const user = await createUser(t)
    const remote = '127.0.0.5'
    for (let i = 0; i < 4; i++) await login(t, user.username, WRONG, { 'x-test-remote': remote })
    assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'x-test-remote': remote })).statusCode, 200)
    for (let i = 0; i < 4; i++) assert.equal((await login(t, user.username, WRONG, { 'x-test-remote': remote })).statusCode, 401)
  })
})

describe('guessing the current password through a session', () => {
  const t = useTestApp(dialect, { loginMaxFailuresPerAccount: 3 })

  it('is throttled like sign-in', async () => {
    const user = await createUser(t)
    const token = (await login(t, user.username, GOOD_PASSWORD)).json().token
    const change = async (current: string) => await t.app.inject({
      method: 'PUT', url: '/auth/api/me/password', headers: { authorization: `Bearer ${token}` }, payload: { current_password: current, new_password: 'a brand new passphrase' }
    })
    for (let i = 0; i < 3; i++) assert.equal((await change(WRONG)).statusCode, 401)
    assert.equal((await change(GOOD_PASSWORD)).statusCode, 429)
  })
})

describe('sign-in throttling behind a trusted proxy', () => {
  const t = useTestApp(dialect, { loginMaxFailuresPerAccount: 3, trustProxy: true })

  it('counts per client address from X-Forwarded-For when the proxy is trusted', async () => {
    const user = await createUser(t)
    for (let i = 0; i < 3; i++) await login(t, user.username, WRONG, { 'x-forwarded-for': '203.0.113.7' })
    assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'x-forwarded-for': '203.0.113.7' })).statusCode, 429)
    assert.equal((await login(t, user.username, GOOD_PASSWORD, { 'x-forwarded-for': '203.0.113.8' })).statusCode, 200)
  })

  it('sets the __Host- cookie with Secure when the proxy says the request came over HTTPS', async () => {
    const user = await createUser(t)
    const res = await login(t, user.username, GOOD_PASSWORD, { 'x-forwarded-proto': 'https', 'x-forwarded-for': '203.0.113.20' })
    assert.equal(res.statusCode, 200)
    const cookie = res.cookies.find(c => c.name === '__Host-gatehouse_session')
    assert.ok(cookie, JSON.stringify(res.cookies))
    assert.equal(cookie.secure, true)
    assert.equal(cookie.path, '/')
    assert.equal(cookie.domain, undefined, '__Host- cookies carry no Domain')
    assert.equal(cookie.httpOnly, true)
    assert.equal(cookie.sameSite, 'Lax')
    const me = await t.app.inject({ url: '/auth/api/me', headers: { cookie: `${cookie.name}=${cookie.value}` } })
    assert.equal(me.json().id, user.id)
  })
})

describe('sign-in throttling shared through Redis', () => {
  it('sees failures counted by another instance', async (ctx) => {
    if (TEST_REDIS_URL === undefined) {
      ctx.skip(NO_REDIS)
      return
    }
    // Both instances share one database (a file) and one Redis, as two servers behind a load balancer would.
    const file = `/tmp/gatehouse-redis-test-${randomBytes(4).toString('hex')}.db`
    const settings = { databaseUrl: `sqlite:${file}`, redisUrl: TEST_REDIS_URL, loginMaxFailuresPerAccount: 3, bootstrapAdminApiKey: 'k'.repeat(40) }
    const a = await createTestApp({ name: 'sqlite', url: undefined }, settings)
    const b = await createTestApp({ name: 'sqlite', url: undefined }, settings)
    try {
      const user = await createUser(a)
      for (let i = 0; i < 3; i++) assert.equal((await login(a, user.username, WRONG)).statusCode, 401)
      assert.equal((await login(b, user.username, GOOD_PASSWORD)).statusCode, 429, 'the second instance knows')
    } finally {
      await a.app.close()
      await b.app.close()
      for (const suffix of ['', '-wal', '-shm']) rmSync(file + suffix, { force: true })
    }
  })
})

describe('an unreachable Redis', () => {
  it('answers 503 dependency_unavailable, not a 500', async () => {
    // Nothing listens on port 1.
    const t = await createTestApp(dialect, { redisUrl: 'redis://127.0.0.1:1' })
    try {
      const res = await t.app.inject({ url: '/auth/api/version' })
      assert.equal(res.statusCode, 503, res.body)
      assert.equal(res.json().code, 'dependency_unavailable')
      assert.ok(res.headers['retry-after'])
      assert.equal((await t.app.inject({ url: '/auth/healthz' })).statusCode, 200)
    } finally {
      await t.app.close()
    }
  })
})

describe('the sign-in page', () => {
  const t = useTestApp(dialect)
  const form = async (fields: Record<string, string>, headers: Record<string, string> = { origin: 'http://localhost:80' }) =>
    await t.app.inject({
      method: 'POST',
      url: '/auth/login',
      headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      payload: new URLSearchParams(fields).toString()
    })

  it('serves an accessible form with no external assets and a strict CSP', async () => {
    const res = await t.app.inject({ url: '/auth/login?next=/pipelines' })
    assert.equal(res.statusCode, 200)
    assert.match(res.headers['content-type'] as string, /^text\/html/)
    assert.match(res.body, /<html lang="en">/)
    assert.match(res.body, /<label for="username">/)
    assert.match(res.body, /<label for="password">/)
    assert.match(res.body, /autocomplete="current-password"/)
    assert.match(res.body, /name="next" value="\/pipelines"/)
    assert.ok(!/src=|<link|<script/.test(res.body), 'no scripts, styles or images loaded from anywhere')
    for (const [, href] of res.body.matchAll(/href="([^"]*)"/g)) assert.match(href!, /^\/auth\//, 'links stay on this service')
    assert.match(res.headers['content-security-policy'] as string, /default-src 'none'/)
    assert.match(res.headers['content-security-policy'] as string, /frame-ancestors 'none'/)
    // With no-referrer, browsers send "Origin: null" on the form's post and the CSRF check refuses it.
    assert.equal(res.headers['referrer-policy'], 'same-origin')
  })

  it('signs in and returns the browser to a same-origin next path', async () => {
    const user = await createUser(t)
    const res = await form({ username: user.username, password: GOOD_PASSWORD, next: '/pipelines?tab=runs' })
    assert.equal(res.statusCode, 303)
    assert.equal(res.headers.location, '/pipelines?tab=runs')
    assert.ok(res.cookies.some(c => c.name === 'gatehouse_session' && c.httpOnly === true))
  })

  it('never redirects off-site', async () => {
    const user = await createUser(t)
    for (const next of ['https://evil.example/', '//evil.example/', '/\\evil.example', 'javascript:alert(1)', '/ok\r\nSet-Cookie: x=y', 'pipelines']) {
      const res = await form({ username: user.username, password: GOOD_PASSWORD, next })
      assert.equal(res.statusCode, 303, next)
      assert.equal(res.headers.location, '/auth/login', next)
    }
  })

  it('shows one generic error for every failure, keeping the username but never the password', async () => {
    const user = await createUser(t)
    const bodies: string[] = []
    for (const [username, password] of [[user.username, WRONG], ['nobody_' + uniqueName(), WRONG]]) {
      const res = await form({ username: username!, password: password!, next: '/x' })
      assert.equal(res.statusCode, 401)
      assert.match(res.body, /role="alert"/)
      assert.match(res.body, /Sign-in failed\. Check your username and password\./)
      assert.ok(!res.body.includes(WRONG))
      bodies.push(res.body.replace(username!, 'NAME'))
    }
    assert.equal(bodies[0], bodies[1])
  })

  it('escapes what it echoes', async () => {
    const res = await form({ username: '<script>alert(1)</script>', password: WRONG })
    assert.ok(!res.body.includes('<script>alert(1)</script>'))
    assert.ok(res.body.includes('&#60;script&#62;'))
  })

  it('refuses a sign-in posted from another site', async () => {
    const user = await createUser(t)
    const res = await form({ username: user.username, password: GOOD_PASSWORD }, { origin: 'https://evil.example' })
    assert.equal(res.statusCode, 403)
  })

  it('signs out through a form post and clears the cookie', async () => {
    const user = await createUser(t)
    const signedIn = await form({ username: user.username, password: GOOD_PASSWORD })
    const cookie = signedIn.cookies.find(c => c.name === 'gatehouse_session')!
    const out = await t.app.inject({ method: 'POST', url: '/auth/logout', headers: { cookie: `${cookie.name}=${cookie.value}`, origin: 'http://localhost:80' } })
    assert.equal(out.statusCode, 303)
    assert.equal(out.headers.location, '/auth/login')
    assert.equal((await t.app.inject({ url: '/auth/api/verify', headers: { cookie: `${cookie.name}=${cookie.value}` } })).statusCode, 401)
  })
})

describe('the general request limit per credential', () => {
  const t = useTestApp(dialect, { rateLimitPerCredential: 5, rateLimitPerAddress: 1000 })

  it('answers 429 problem+json with Retry-After and RateLimit headers past the per-credential limit, per credential', async () => {
    const other = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'other' } })).json().key
    const statuses: number[] = []
    let last: LightMyRequestResponse | undefined
    for (let i = 0; i < 6; i++) {
      last = await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) })
      statuses.push(last.statusCode)
    }
    // The key-creation request above was the first of this key's five.
    assert.deepEqual(statuses, [200, 200, 200, 200, 429, 429])
    assert.equal(last!.json().code, 'rate_limited')
    assert.match(last!.headers['content-type'] as string, /^application\/problem\+json/)
    assert.ok(Number(last!.headers['retry-after']) > 0)
    assert.equal(last!.headers['ratelimit-remaining'], '0')
    assert.equal(last!.headers['ratelimit-limit'], '5')
    const fresh = await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(other) })
    assert.equal(fresh.statusCode, 200, 'another key has its own budget')
    assert.equal(fresh.headers['ratelimit-remaining'], '4')
  })
})

describe('the general request limit per address', () => {
  const t = useTestApp(dialect, { rateLimitPerCredential: 1000, rateLimitPerAddress: 3 })

  it('counts every request from an address, refused ones and made-up credentials included, and never the health checks', async () => {
    const remote = '127.0.0.9'
    const statuses = []
    for (let i = 0; i < 4; i++) {
      const res = await t.app.inject({ url: '/auth/api/users', headers: { authorization: `Bearer made-up-${i}` }, remoteAddress: remote })
      statuses.push(res.statusCode)
    }
    assert.deepEqual(statuses, [401, 401, 401, 429])
    assert.equal((await t.app.inject({ url: '/auth/api/version', remoteAddress: remote })).statusCode, 429)
    for (let i = 0; i < 5; i++) assert.equal((await t.app.inject({ url: '/auth/healthz', remoteAddress: remote })).statusCode, 200)
    assert.equal((await t.app.inject({ url: '/auth/api/version', remoteAddress: '127.0.0.10' })).statusCode, 200)
  })
})
