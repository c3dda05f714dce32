import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { buildApp } from '../src/app.ts'
import { ConfigError, defaultConfig, loadConfig } from '../src/config.ts'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'

const PROBLEM_KEYS = ['code', 'detail', 'request_id', 'status', 'title', 'type']

function assertProblem (res: { statusCode: number, headers: Record<string, unknown>, json: () => Record<string, unknown> }, status: number, code: string): void {
  assert.equal(res.statusCode, status)
  assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
  const body = res.json()
  assert.equal(body.code, code)
  assert.equal(body.status, status)
  assert.equal(body.type, `urn:gatehouse:problem:${code}`)
  assert.equal(body.request_id, res.headers['x-request-id'])
  for (const key of PROBLEM_KEYS) assert.ok(key in body, `problem lacks ${key}`)
}

/** An expected 503 is logged once for its request, as a warning with its code: never at error level. */
function assertLoggedAsWarning (logLines: string[], requestId: string, code: string): void {
  const entries = logLines.map(line => JSON.parse(line) as { level: number, reqId?: string, code?: string })
    .filter(entry => entry.reqId === requestId)
  assert.ok(entries.some(entry => entry.level === 40 && entry.code === code), JSON.stringify(entries))
  assert.ok(entries.every(entry => entry.level < 50), JSON.stringify(entries))
}

for (const dialect of dialects()) {
  describe(`errors are problem+json (${dialect.name})`, () => {
    const t = useTestApp(dialect, { bodyLimitBytes: 4096 })

    it('answers an unknown route with 404 route_not_found', async () => {
      assertProblem(await t.app.inject({ url: '/auth/api/nothing-here' }), 404, 'route_not_found')
      assertProblem(await t.app.inject({ url: '/elsewhere' }), 404, 'route_not_found')
    })

    it('answers a missing documentation file with 404, not 405 (its route exists for the method)', async () => {
      assertProblem(await t.app.inject({ url: '/auth/docs/static/nothing-here.js' }), 404, 'route_not_found')
      assert.equal((await t.app.inject({ url: '/auth/docs/static/swagger-ui.css' })).statusCode, 200)
    })

    it('answers a wrong method with 405 and Allow', async () => {
      const res = await t.app.inject({ method: 'PUT', url: '/auth/api/users', headers: auth(t.adminKey) })
      assertProblem(res, 405, 'method_not_allowed')
      assert.equal(res.headers.allow, 'GET, HEAD, POST')
      const item = await t.app.inject({ method: 'POST', url: '/auth/api/users/01900000-0000-7000-8000-000000000000', headers: auth(t.adminKey) })
      assertProblem(item, 405, 'method_not_allowed')
      assert.equal(item.headers.allow, 'GET, HEAD, PATCH, DELETE')
    })

    it('answers malformed JSON with 400 malformed_body saying where, without quoting the body', async () => {
      // Parsing comes before any look-up, so a PATCH of a user nobody has is enough for merge-patch.
      const post = async (type: string, payload: string) => await t.app.inject({
        method: type === 'application/json' ? 'POST' : 'PATCH',
        url: type === 'application/json' ? '/auth/api/users' : '/auth/api/users/01900000-0000-7000-8000-000000000000',
        headers: { ...auth(t.adminKey), 'content-type': type },
        payload
      })
      const cases: Array<[string, string, RegExp]> = [
        ['application/json', '{"username": ', /ends early \(line 1, column 14\)/],
        // V8's own message for this one names no position, and quotes the body.
        ['application/json', '{\n  "username": "grace",\n  "password": hunter2-secret\n}', /at line 3, column 15 \(character 40\)/],
        ['application/json', '{"username": "grace",}', /at line 1, column 22 \(character 22\)/],
        ['application/merge-patch+json', '{"username": "grace" "password": "x"}', /at line 1, column 22 \(character 22\)/]
      ]
      for (const [type, payload, where] of cases) {
        const res = await post(type, payload)
        assertProblem(res, 400, 'malformed_body')
        assert.match(res.json().detail, where, payload)
        // Not "ada": the answer's request_id, a random UUID, may hold those hex letters.
        assert.ok(!res.body.includes('hunter2') && !res.body.includes('grace'), res.body)
      }
    })

    it('refuses prototype poisoning with 400, naming the forbidden property', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'application/json' }, payload: '{"username":"x","__proto__":{"role":"admin"}}' })
      assertProblem(res, 400, 'malformed_body')
      assert.match(res.json().detail, /forbidden property name \(__proto__ or constructor\)/)
      assert.equal(({} as Record<string, unknown>).role, undefined)
    })

    it('answers an oversize body with 413 payload_too_large, stating the limit in bytes and the setting that raises it', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), first_name: 'x'.repeat(5000) } })
      assertProblem(res, 413, 'payload_too_large')
      assert.match(res.json().detail, /at most 4096 bytes\b.*BODY_LIMIT_BYTES/)
      const form = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' }, payload: `username=${'x'.repeat(5000)}` })
      assertProblem(form, 413, 'payload_too_large')
      assert.match(form.json().detail, /at most 4096 bytes\b/)
      // Import has a larger limit of its own (4 MiB, or BODY_LIMIT_BYTES if that is larger): the answer says that one.
      const bulk = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users: [{ username: uniqueName(), first_name: 'x'.repeat(4 * 1024 * 1024) }] } })
      assertProblem(bulk, 413, 'payload_too_large')
      assert.match(bulk.json().detail, /at most 4194304 bytes\b/)
    })

    it('says in words what a username may be, as the console does, instead of a regular expression', async () => {
      for (const username of ['bad name', 'naïve', 'x'.repeat(65)]) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })
        assertProblem(res, 422, 'validation_failed')
        const errors = res.json().errors as Array<{ pointer: string, detail: string }>
        assert.ok(errors.some(e => e.pointer === '/username' && e.detail === 'must be 1 to 64 characters: letters, digits, and . _ @ -'), res.body)
        assert.ok(!res.body.includes('[A-Za-z'), res.body)
      }
    })

    it('answers an unsupported media type with 415', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: { ...auth(t.adminKey), 'content-type': 'application/xml' }, payload: '<key/>' })
      assertProblem(res, 415, 'unsupported_media_type')
    })

    it('answers 401 before validating the body of an anonymous request', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', payload: { nonsense: true } })
      assertProblem(res, 401, 'unauthenticated')
    })

    it('echoes a well-formed X-Request-Id and replaces a malformed one', async () => {
      const given = await t.app.inject({ url: '/auth/nothing', headers: { 'x-request-id': 'abc-123' } })
      assert.equal(given.json().request_id, 'abc-123')
      const hostile = await t.app.inject({ url: '/auth/nothing', headers: { 'x-request-id': 'a\u001b[31mb' + 'x'.repeat(100) } })
      assert.match(hostile.json().request_id, /^[0-9a-f-]{36}$/)
    })

    it('marks API responses no-store and nosniff', async () => {
      const res = await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) })
      assert.equal(res.headers['cache-control'], 'no-store')
      assert.equal(res.headers['x-content-type-options'], 'nosniff')
    })
  })
}

describe('Strict-Transport-Security (HSTS)', () => {
  const behindProxy = useTestApp(dialects()[0]!, { trustProxy: true })
  const direct = useTestApp(dialects()[0]!)
  const switchedOff = useTestApp(dialects()[0]!, { trustProxy: true, hsts: undefined })
  const https = { 'x-forwarded-proto': 'https' }

  it('is sent for a year, subdomains included, with every answer to an HTTPS request: the API, an error, one refused before routing, the docs, the sign-in page', async () => {
    for (const url of ['/auth/api/users?limit=1', '/auth/api/nothing', '/auth/api/users/%E0%A4%A', '/auth/docs', '/auth/login']) {
      const res = await behindProxy.app.inject({ url, headers: { ...auth(behindProxy.adminKey), ...https } })
      assert.equal(res.headers['strict-transport-security'], 'max-age=31536000; includeSubDomains', url)
    }
  })

  it('is never sent over plain HTTP, nor when the protocol comes from a proxy that is not trusted', async () => {
    const plain = await behindProxy.app.inject({ url: '/auth/api/users?limit=1', headers: auth(behindProxy.adminKey) })
    assert.equal(plain.statusCode, 200)
    assert.equal(plain.headers['strict-transport-security'], undefined)
    const untrusted = await direct.app.inject({ url: '/auth/api/users?limit=1', headers: { ...auth(direct.adminKey), ...https } })
    assert.equal(untrusted.statusCode, 200)
    assert.equal(untrusted.headers['strict-transport-security'], undefined)
  })

  it('is not sent with HSTS=off (a proxy in front sends its own), and a malformed value stops the start', async () => {
    const res = await switchedOff.app.inject({ url: '/auth/api/users?limit=1', headers: { ...auth(switchedOff.adminKey), ...https } })
    assert.equal(res.statusCode, 200)
    assert.equal(res.headers['strict-transport-security'], undefined)
    assert.equal(loadConfig({ HSTS: 'off' }).hsts, undefined)
    assert.equal(loadConfig({ HSTS: 'max-age=63072000; includeSubDomains; preload' }).hsts, 'max-age=63072000; includeSubDomains; preload')
    for (const value of ['max-age=1y', 'includeSubDomains', 'max-age=31536000, includeSubDomains']) {
      assert.throws(() => loadConfig({ HSTS: value }), ConfigError, value)
    }
  })
})

describe('TRUST_PROXY', () => {
  it('takes true, false, and proxy addresses or CIDR ranges; refuses a hop count and what is not an address, stopping the start', () => {
    assert.equal(loadConfig({ TRUST_PROXY: 'true' }).trustProxy, true)
    assert.equal(loadConfig({ TRUST_PROXY: 'FALSE' }).trustProxy, false)
    assert.equal(loadConfig({ TRUST_PROXY: '127.0.0.1, 10.0.0.0/8,loopback' }).trustProxy, '127.0.0.1, 10.0.0.0/8,loopback')
    // A hop count trusts whoever connects (Fastify 5.12 ignores it): named, with what to set instead.
    assert.throws(() => loadConfig({ TRUST_PROXY: '1' }), (error: Error) => error instanceof ConfigError && /hop count/.test(error.message) && /TRUST_PROXY=127\.0\.0\.1/.test(error.message))
    for (const value of ['yes', '10.0.0.0/33', '127.0.0.1,nginx']) {
      assert.throws(() => loadConfig({ TRUST_PROXY: value }), ConfigError, value)
    }
  })
})

describe('database unreachable', () => {
  it('answers 503 database_unavailable with Retry-After; readyz is 503 and healthz stays 200', async () => {
    // Nothing listens on port 1: every connection is refused at once.
    const config = defaultConfig({ databaseUrl: 'postgres://postgres@127.0.0.1:1/none', logLevel: 'info' })
    const logLines: string[] = []
    const app = await buildApp({ config, migrate: false, logStream: { write: (line: string) => { logLines.push(line) } } })
    try {
      const res = await app.inject({ url: '/auth/api/users', headers: { 'x-api-key': 'gatehouse_' + 'a'.repeat(43) } })
      assertProblem(res, 503, 'database_unavailable')
      assert.equal(res.headers['retry-after'], '5')
      assertLoggedAsWarning(logLines, res.json().request_id, 'database_unavailable')
      assert.ok(!/ECONNREFUSED|127\.0\.0\.1|pg/.test(res.body), 'no driver detail leaks')
      const ready = await app.inject({ url: '/auth/readyz' })
      assert.equal(ready.statusCode, 503)
      assert.equal(ready.json().checks.database, 'unavailable')
      assert.equal((await app.inject({ url: '/auth/healthz' })).statusCode, 200)
    } finally {
      await app.close()
    }
  })
})

describe('password hashing limits', () => {
  for (const dialect of dialects().slice(0, 1)) {
    const logLines: string[] = []
    const t = useTestApp(dialect, { hashConcurrency: 1, hashQueueLimit: 0 }, { write: (line: string) => { logLines.push(line) } })

    it('hashes when idle even with no queue, and answers 503 server_busy with Retry-After once saturated', async () => {
      const create = async () => await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: 'correct horse battery staple' } })
      assert.equal((await create()).statusCode, 201)
      const burst = await Promise.all(Array.from({ length: 4 }, create))
      const statuses = burst.map(r => r.statusCode)
      assert.ok(statuses.includes(201), statuses.join())
      const busy = burst.find(r => r.statusCode === 503)
      assert.ok(busy, statuses.join())
      assert.equal(busy.json().code, 'server_busy')
      assert.equal(busy.headers['retry-after'], '1')
      assertLoggedAsWarning(logLines, busy.json().request_id, 'server_busy')
    })
  }
})
