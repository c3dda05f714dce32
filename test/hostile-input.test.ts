import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { connect, type AddressInfo } from 'node:net'
import { after, before, describe, it } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { InjectOptions } from 'fastify'
import { Redis } from 'ioredis'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { eventually } from './polling.ts'
import { NO_REDIS, TEST_REDIS_URL } from './redis.ts'

interface Answer { statusCode: number, headers: Record<string, unknown>, body: string }

function assertProblem (res: Answer, status: number, code: string): Record<string, unknown> {
  assert.equal(res.statusCode, status, res.body)
  assert.match(String(res.headers['content-type']), /^application\/problem\+json/, res.body)
  const body = JSON.parse(res.body) as Record<string, unknown>
  assert.equal(body.code, code, res.body)
  assert.equal(body.status, status)
  return body
}

function cursorOf (tuple: unknown[]): string {
  return Buffer.from(JSON.stringify(tuple)).toString('base64url')
}

interface RawAnswer { text: string, closedAfterMs: number }

/**
 * Writes `chunks` to a fresh connection (`pauseMs` apart, the last one
 * repeated every `pauseMs` while `keepSending` says so) and reads until the
 * server closes it, or `deadlineMs` passes.
 */
async function rawExchange (port: number, chunks: string[], options: { pauseMs?: number, deadlineMs?: number, keepSending?: () => string | undefined } = {}): Promise<RawAnswer> {
  const { pauseMs = 0, deadlineMs = 10_000 } = options
  const socket = connect({ host: '127.0.0.1', port })
  await new Promise<void>((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
  const started = Date.now()
  let text = ''
  const state = { closed: false }
  socket.on('data', (data: Buffer) => { text += data.toString('latin1') })
  socket.on('error', () => {})
  const done = new Promise<void>(resolve => socket.once('close', () => { state.closed = true; resolve() }))
  for (const chunk of chunks) {
    if (state.closed) break
    socket.write(chunk)
    if (pauseMs > 0) await sleep(pauseMs)
  }
  while (!state.closed && Date.now() - started < deadlineMs) {
    const more = options.keepSending?.()
    if (more !== undefined && !socket.destroyed) socket.write(more)
    await Promise.race([done, sleep(pauseMs > 0 ? pauseMs : 50)])
  }
  const closedAfterMs = Date.now() - started
  socket.destroy()
  return { text, closedAfterMs: state.closed ? closedAfterMs : Infinity }
}

function parseRaw (text: string): Answer & { statusLine: string } {
  const end = text.indexOf('\r\n\r\n')
  const head = end === -1 ? text : text.slice(0, end)
  const [statusLine = '', ...lines] = head.split('\r\n')
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
  }
  return { statusLine, statusCode: Number(statusLine.split(' ')[1]), headers, body: end === -1 ? '' : text.slice(end + 4) }
}

for (const dialect of dialects()) {
  describe(`hostile input (${dialect.name})`, () => {
    const logLines: string[] = []
    // A short receive deadline, so the slow-client test can see it enforced.
    const t = useTestApp(dialect, { requestTimeoutMs: 1500 }, { write: (line: string) => { logLines.push(line) } })
    let port = 0
    let userId = ''
    before(async () => {
      await t.app.listen({ host: '127.0.0.1', port: 0 })
      port = (t.app.server.address() as AddressInfo).port
      for (let i = 0; i < 3; i++) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('hostile'), password: GOOD_PASSWORD } })
        assert.equal(res.statusCode, 201, res.body)
        userId = res.json().id
      }
    })

    it('answers multipart/form-data without a boundary with 400 malformed_body, on any path', async () => {
      for (const request of [
        { method: 'POST' as const, url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'multipart/form-data' }, payload: 'username=x' },
        { method: 'POST' as const, url: '/auth/api/nowhere', headers: { 'content-type': 'multipart/form-data' }, payload: 'x' },
        { method: 'PATCH' as const, url: '/auth/api/nowhere', headers: { 'content-type': 'multipart/form-data; charset=utf-8' }, payload: 'x' }
      ]) {
        const body = assertProblem(await t.app.inject(request), 400, 'malformed_body')
        assert.match(String(body.detail), /boundary/)
      }
    })

    it('rejects a NUL byte in any text input with 422 validation_failed naming the value, before touching the database', async () => {
      const form = (fields: Record<string, string>): string => new URLSearchParams(fields).toString()
      const multipart = (fields: Record<string, string>): string => Object.entries(fields)
        .map(([name, value]) => `--XyZ\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`).join('') + '--XyZ--\r\n'
      const cases: Array<{ request: InjectOptions, in: string, pointer: string }> = [
        { request: { method: 'POST', url: '/auth/api/login', payload: { username: 'ad\u0000min', password: GOOD_PASSWORD } }, in: 'body', pointer: '/username' },
        { request: { method: 'POST', url: '/auth/api/login', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: form({ username: 'someone', password: `x\u0000${GOOD_PASSWORD}` }) }, in: 'body', pointer: '/password' },
        { request: { method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), first_name: 'Ada\u0000' } }, in: 'body', pointer: '/first_name' },
        { request: { method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), groups: ['fine', 'not\u0000fine'] } }, in: 'body', pointer: '/groups/1' },
        { request: { method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'multipart/form-data; boundary=XyZ' }, payload: multipart({ username: uniqueName(), last_name: 'Love\u0000lace' }) }, in: 'body', pointer: '/last_name' },
        { request: { method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users: [{ username: uniqueName() }, { username: 'nul\u0000name' }] } }, in: 'body', pointer: '/users/1/username' },
        { request: { method: 'PATCH', url: `/auth/api/users/${userId}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ email: 'a\u0000@example.com' }) }, in: 'body', pointer: '/email' },
        { request: { method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'key\u0000' } }, in: 'body', pointer: '/name' },
        { request: { url: '/auth/api/users?q=%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/q' },
        { request: { url: '/auth/api/users?q=a%00&limit=5', headers: auth(t.adminKey) }, in: 'query', pointer: '/q' },
        { request: { url: '/auth/api/users?username=%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/username' },
        { request: { url: '/auth/api/users?email=x%00%40example.com&limit=2', headers: auth(t.adminKey) }, in: 'query', pointer: '/email' },
        { request: { url: '/auth/api/users?group=g%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/group' },
        { request: { url: '/auth/users?q=%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/q' },
        { request: { url: '/auth/api/events?actor_id=%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/actor_id' },
        { request: { url: '/auth/api/events?target_id=%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/target_id' },
        { request: { url: '/auth/api/events?type=user.created%00', headers: auth(t.adminKey) }, in: 'query', pointer: '/type' },
        { request: { url: '/auth/api/users/%00', headers: auth(t.adminKey) }, in: 'path', pointer: '/user_id' }
      ]
      for (const { request, in: part, pointer } of cases) {
        const res = await t.app.inject(request)
        const label = `${String(request.method ?? 'GET')} ${String(request.url)}`
        const body = assertProblem(res, 422, 'validation_failed')
        const errors = body.errors as Array<{ in: string, pointer: string, detail: string }>
        assert.ok(errors.some(e => e.in === part && e.pointer === pointer && /NUL/.test(e.detail)), `${label}: ${res.body}`)
      }
      // Nothing with a NUL byte was stored.
      const everyone = await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })
      assert.equal(everyone.statusCode, 200)
      assert.ok(!everyone.body.includes('\\u0000'))
      const keys = await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })
      assert.ok(!keys.body.includes('\\u0000'))
    })

    it('rejects a lone UTF-16 surrogate in any text input with 422 validation_failed naming the value, and keeps a real pair', async () => {
      const json = (method: 'POST' | 'PATCH', url: string, text: string, type = 'application/json'): InjectOptions =>
        ({ method, url, headers: { ...auth(t.adminKey), 'content-type': type }, payload: text })
      const cases: Array<{ request: InjectOptions, pointer: string }> = [
        { request: { method: 'POST', url: '/auth/api/login', headers: { 'content-type': 'application/json' }, payload: '{"username":"ab\\ud800cd","password":"whatever it is"}' }, pointer: '/username' },
        { request: json('PATCH', `/auth/api/users/${userId}`, '{"first_name":"Ada\\udc00"}', 'application/merge-patch+json'), pointer: '/first_name' },
        { request: json('POST', '/auth/api/users', `{"username":"${uniqueName()}","groups":["fine","\\udbff"]}`), pointer: '/groups/1' },
        { request: json('POST', '/auth/api/users', `{"username":"${uniqueName()}","last\\ud800":"x"}`), pointer: '/last\ud800' },
        { request: json('POST', '/auth/api/webhooks', '{"url":"https://hooks.example.com/x","description":"sync \\ud83d"}'), pointer: '/description' },
        { request: json('POST', '/auth/api/api-keys', '{"name":"\\ude00key"}'), pointer: '/name' }
      ]
      for (const { request, pointer } of cases) {
        const res = await t.app.inject(request)
        const body = assertProblem(res, 422, 'validation_failed')
        const errors = body.errors as Array<{ in: string, pointer: string, detail: string }>
        assert.ok(errors.some(e => e.in === 'body' && e.pointer === pointer && /surrogate/.test(e.detail)), `${String(request.method)} ${String(request.url)}: ${res.body}`)
      }
      // A surrogate pair is an ordinary character (here U+1F600), stored and read back as sent.
      const paired = await t.app.inject(json('PATCH', `/auth/api/users/${userId}`, '{"first_name":"Ada \\ud83d\\ude00"}', 'application/merge-patch+json'))
      assert.equal(paired.statusCode, 200, paired.body)
      assert.equal(paired.json().first_name, 'Ada \u{1F600}')
    })

    it('answers a numeric parameter that is not a plain finite decimal with 422, on every operation that has one', async () => {
      const document = t.app.swagger() as { paths: Record<string, Record<string, { parameters?: Array<{ in: string, name: string, schema?: { type?: string } }> }>> }
      const numeric: Array<{ method: string, path: string, name: string }> = []
      for (const [path, operations] of Object.entries(document.paths)) {
        for (const [method, operation] of Object.entries(operations)) {
          for (const parameter of operation.parameters ?? []) {
            if (parameter.in === 'query' && ['integer', 'number'].includes(parameter.schema?.type ?? '')) numeric.push({ method, path, name: parameter.name })
          }
        }
      }
      // The lists the issue named; any operation that gains a numeric parameter is covered by the same loop.
      for (const listed of ['/auth/api/users', '/auth/users', '/auth/api/events', '/auth/api/webhooks/{webhook_id}/deliveries', '/auth/api/webhooks/{webhook_id}/attempts']) {
        assert.ok(numeric.some(({ path }) => path === listed), `${listed} has a numeric query parameter`)
      }
      // SCIM answers in its own error body, with its own key: checked below.
      const scim = numeric.filter(({ path }) => path.startsWith('/auth/scim/'))
      for (const { method, path, name } of numeric.filter(({ path }) => !path.startsWith('/auth/scim/'))) {
        // Validation comes before any look-up, so an id that names nothing is enough here.
        const url = path.replace(/\{[a-z_]+\}/g, randomUUID())
        for (const value of ['Infinity', '-Infinity', '1e309', '9'.repeat(400), 'NaN', '1e3', '0x10', ' 5', '']) {
          const res = await t.app.inject({ method: method.toUpperCase() as 'GET', url: `${url}?${name}=${encodeURIComponent(value)}`, headers: auth(t.adminKey) })
          const body = assertProblem(res, 422, 'validation_failed')
          const errors = body.errors as Array<{ in: string, pointer: string }>
          assert.ok(errors.some(e => e.in === 'query' && e.pointer === `/${name}`), `${method} ${path}?${name}=${value}: ${res.body}`)
        }
        const plain = await t.app.inject({ method: method.toUpperCase() as 'GET', url: `${url}?${name}=2`, headers: auth(t.adminKey) })
        assert.ok(plain.statusCode === 200 || plain.statusCode === 404, `${method} ${path}?${name}=2: ${plain.body}`)
      }
      assert.ok(scim.length > 0, 'SCIM lists have numeric parameters (startIndex, count)')
      const scimKey = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'idp', scopes: ['scim'] } })).json().key as string
      for (const { method, path, name } of scim) {
        const url = path.replace(/\{[a-z_]+\}/g, randomUUID())
        for (const value of ['Infinity', '1e309', '9'.repeat(400), 'NaN', '0x10', ' 5']) {
          const res = await t.app.inject({ method: method.toUpperCase() as 'GET', url: `${url}?${name}=${encodeURIComponent(value)}`, headers: { authorization: `Bearer ${scimKey}` } })
          assert.equal(res.statusCode, 400, `${method} ${path}?${name}=${value}: ${res.body}`)
          assert.deepEqual(res.json().schemas, ['urn:ietf:params:scim:api:messages:2.0:Error'], res.body)
        }
      }
    })

    it('answers a cursor whose values do not fit its sort with 422 invalid_cursor', async () => {
      const someId = userId
      for (const [url, cursor] of [
        ['/auth/api/users?sort=username&limit=1', cursorOf(['username', "'", "'"])],
        ['/auth/api/users?sort=-username&limit=1', cursorOf(['-username', 'ada', 'not-a-uuid'])],
        ['/auth/api/users?sort=username&limit=1', cursorOf(['username', 'ada\u0000', someId])],
        ['/auth/api/users?sort=username&limit=1', cursorOf(['username', 7, someId])],
        ['/auth/api/users?limit=1', cursorOf(['created_at', "'", someId])],
        ['/auth/api/users?limit=1', cursorOf(['created_at', '2026-13-45T99:00:00.000Z', someId])],
        ['/auth/api/users?sort=updated_at&limit=1', cursorOf(['updated_at', '2026-01-01T00:00:00.000Z', "'"])],
        ['/auth/api/events?limit=1', cursorOf(['events', "'"])],
        ['/auth/api/events?limit=1', cursorOf(['events', 'x\u0000'])]
      ] as const) {
        const res = await t.app.inject({ url: `${url}&cursor=${cursor}`, headers: auth(t.adminKey) })
        assertProblem(res, 422, 'invalid_cursor')
      }
    })

    it('still follows the cursors it issues, for every sort', async () => {
      for (const sort of ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at']) {
        const first = await t.app.inject({ url: `/auth/api/users?sort=${sort}&limit=1`, headers: auth(t.adminKey) })
        assert.equal(first.statusCode, 200, first.body)
        const next = /<([^>]+)>; rel="next"/.exec(String(first.headers.link))
        assert.ok(next, `${sort}: a next page`)
        const second = await t.app.inject({ url: next[1]!, headers: auth(t.adminKey) })
        assert.equal(second.statusCode, 200, `${sort}: ${second.body}`)
        assert.notEqual(second.json()[0].id, first.json()[0].id)
      }
      const events = await t.app.inject({ url: '/auth/api/events?limit=1', headers: auth(t.adminKey) })
      const next = /<([^>]+)>; rel="next"/.exec(String(events.headers.link))
      assert.ok(next)
      assert.equal((await t.app.inject({ url: next[1]!, headers: auth(t.adminKey) })).statusCode, 200)
    })

    it('never writes a percent-encoded API_KEY parameter into the log or a Link header', async () => {
      logLines.length = 0
      for (const name of ['API%5FKEY', '%41PI_KEY', '%41%50%49%5F%4B%45%59']) {
        const res = await t.app.inject({ url: `/auth/api/users?limit=1&${name}=${t.adminKey}` })
        assert.equal(res.statusCode, 200, `${name} is the API_KEY parameter, percent-encoded`)
        assert.ok(!String(res.headers.link).includes(t.adminKey), `the Link header of ${name} carries the key`)
      }
      // The access line is written once the response is done, which inject may report first.
      await eventually(5000, async () => {
        for (const name of ['API%5FKEY', '%41PI_KEY', '%41%50%49%5F%4B%45%59']) assert.ok(logLines.some(line => line.includes(`${name}=[redacted]`)), `${name} was logged, redacted`)
      })
      assert.ok(!logLines.join('\n').includes(t.adminKey), 'the key is in the log')
    })

    it('answers an undecodable URL and an over-long path parameter with problem+json', async () => {
      for (const url of ['/auth/api/users/%E0%A4%A', '/auth/api/nowhere/%E0%A4%A']) {
        const res = await t.app.inject({ url, headers: auth(t.adminKey) })
        const body = assertProblem(res, 404, 'route_not_found')
        assert.equal(body.request_id, res.headers['x-request-id'])
        assert.equal(res.headers['cache-control'], 'no-store')
      }
      const long = await t.app.inject({ url: `/auth/api/users/${'a'.repeat(300)}`, headers: auth(t.adminKey) })
      assertProblem(long, 422, 'validation_failed')
      const head = await t.app.inject({ method: 'HEAD', url: '/auth/api/users/%E0%A4%A' })
      assert.equal(head.statusCode, 404)
      assert.equal(head.body, '')
    })

    it('answers oversized headers with 431 problem+json, and without a body to HEAD', async () => {
      const big = `X-Big: ${'a'.repeat(20_000)}\r\n`
      logLines.length = 0
      const get = parseRaw((await rawExchange(port, [`GET /auth/healthz HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\n${big}\r\n`])).text)
      assertProblem(get, 431, 'headers_too_large')
      assert.equal(get.headers.connection, 'close')
      const head = parseRaw((await rawExchange(port, [`HEAD /auth/healthz HTTP/1.1\r\nHost: localhost\r\n${big}\r\n`])).text)
      assert.equal(head.statusCode, 431)
      assert.equal(head.body, '', 'a HEAD answer has no body')
      // Headers that arrive over several packets: the method is not known when they overflow, so no body either.
      const split = await rawExchange(port, ['HEAD /auth/healthz HTTP/1.1\r\nHost: localhost\r\n', big, '\r\n'], { pauseMs: 30 })
      const splitAnswer = parseRaw(split.text)
      assert.equal(splitAnswer.statusCode, 431)
      assert.equal(splitAnswer.body, '')
      // Garbage that is not HTTP at all: 400, problem+json.
      const garbage = parseRaw((await rawExchange(port, ['GET /auth/healthz HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n'])).text)
      assertProblem(garbage, 400, 'malformed_request')
      assert.ok(logLines.some(line => line.includes('headers_too_large')), 'the refusal was logged')
      // Node attaches the raw bytes (headers, the key among them) to the error it reports; they stay out of the log.
      assert.ok(!logLines.some(line => line.includes(t.adminKey) || line.includes('rawPacket')), 'the raw request was logged')
    })

    it('cuts a client that sends its headers slowly at REQUEST_TIMEOUT_MS, with 408', async () => {
      let n = 0
      const answer = await rawExchange(port, ['GET /auth/healthz HTTP/1.1\r\nHost: localhost\r\n'], {
        pauseMs: 200,
        deadlineMs: 10_000,
        keepSending: () => `X-Slow-${n++}: still here\r\n`
      })
      assert.ok(answer.closedAfterMs >= 1400 && answer.closedAfterMs <= 3500, `closed after ${answer.closedAfterMs} ms, not about 1500 ms`)
      assert.equal(parseRaw(answer.text).statusCode, 408)
    })

    it('cuts a client that sends its body slowly at REQUEST_TIMEOUT_MS too', async () => {
      const answer = await rawExchange(port, [
        `POST /auth/api/api-keys HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`
      ], { pauseMs: 200, deadlineMs: 10_000, keepSending: () => ' ' })
      assert.ok(answer.closedAfterMs >= 1400 && answer.closedAfterMs <= 3500, `closed after ${answer.closedAfterMs} ms, not about 1500 ms`)
      const parsed = parseRaw(answer.text)
      assertProblem(parsed, 408, 'request_timeout')
    })

    it('answers the next request on a kept-alive connection after refusing a multipart upload part-way', async () => {
      // A file part is refused as soon as its headers arrive, while the rest of the body is still on its way.
      const boundary = 'KeepAliveBoundary'
      const head = `--${boundary}\r\nContent-Disposition: form-data; name="username"\r\n\r\n${uniqueName('upload')}\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="users.csv"\r\nContent-Type: text/csv\r\n\r\nusername\r\n`
      // Within BODY_LIMIT_BYTES; the first of its two pieces is more than the request's read buffer holds (16 KiB).
      const rest = `${'x'.repeat(40_000)}\r\n--${boundary}--\r\n`
      const socket = connect({ host: '127.0.0.1', port })
      await new Promise<void>((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
      let text = ''
      let closed = false
      socket.on('data', (data: Buffer) => { text += data.toString('latin1') })
      socket.on('error', () => {})
      socket.once('close', () => { closed = true })
      const waitFor = async (done: () => boolean, what: string): Promise<void> => {
        const deadline = Date.now() + 10_000
        while (!done() && Date.now() < deadline) await sleep(20)
        assert.ok(done(), `${what}; received: ${text.slice(0, 500)}`)
      }
      socket.write(`POST /auth/api/users HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\nContent-Type: multipart/form-data; boundary=${boundary}\r\n` +
        `Content-Length: ${head.length + rest.length}\r\n\r\n${head}`)
      await waitFor(() => /\r\n\r\n\{[^]*\}$/.test(text) || closed, 'no answer to the upload')
      const first = parseRaw(text)
      assertProblem(first, 422, 'validation_failed')
      assert.equal(first.headers.connection, 'keep-alive')
      text = ''
      // In two pieces, as the network delivers a body: the server reads the first before the second arrives.
      socket.write(rest.slice(0, 20_000))
      await sleep(200)
      socket.write(rest.slice(20_000))
      socket.write('GET /auth/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n')
      // Before the fix, the connection had stopped reading: this request waited for REQUEST_TIMEOUT_MS and got 408.
      await waitFor(() => closed, 'the connection was not closed after the second answer')
      socket.destroy()
      assert.equal(parseRaw(text).statusCode, 200, text.slice(0, 500))
    })

    it('refuses a multipart body declared larger than BODY_LIMIT_BYTES with 413 before reading it, and closes the connection', async () => {
      const boundary = 'TooLargeBoundary'
      const answer = await rawExchange(port, [
        `POST /auth/api/users HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\nContent-Type: multipart/form-data; boundary=${boundary}\r\n` +
        `Content-Length: ${t.config.bodyLimitBytes + 1}\r\n\r\n--${boundary}\r\nContent-Disposition: form-data; name="username"\r\n\r\n`
      ], { deadlineMs: 5000 })
      const parsed = parseRaw(answer.text)
      assert.match(String(assertProblem(parsed, 413, 'payload_too_large').detail), new RegExp(`at most ${t.config.bodyLimitBytes} bytes`))
      assert.equal(parsed.headers.connection, 'close')
      assert.ok(answer.closedAfterMs < 5000, 'the connection was left open, waiting for the rest of the body')
    })

    it('logs a client that hangs up mid-request at info, not as an error', async () => {
      const id = `abort-${randomBytes(6).toString('hex')}`
      for (const [suffix, type, body] of [
        ['json', 'application/json', '{"name": "half'],
        ['form', 'application/x-www-form-urlencoded', 'username=half'],
        ['multipart', 'multipart/form-data; boundary=XyZ', '--XyZ\r\nContent-Disposition: form-data; name="username"\r\n\r\nhalf']
      ] as const) {
        const url = suffix === 'json' ? '/auth/api/api-keys' : '/auth/api/users'
        const socket = connect({ host: '127.0.0.1', port })
        await new Promise(resolve => socket.once('connect', resolve))
        socket.write(`POST ${url} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\nX-Request-Id: ${id}-${suffix}\r\nContent-Type: ${type}\r\nContent-Length: 1000\r\n\r\n${body}`)
        await sleep(100)
        socket.destroy()
      }
      const deadline = Date.now() + 3000
      const mine = (): Array<{ level: number, reqId: string, msg: string }> => logLines.filter(line => line.includes(id)).map(line => JSON.parse(line) as { level: number, reqId: string, msg: string })
      while (new Set(mine().map(l => l.reqId)).size < 3 && Date.now() < deadline) await sleep(50)
      await sleep(200)
      const lines = mine()
      assert.equal(new Set(lines.map(l => l.reqId)).size, 3, 'each abort was logged')
      for (const line of lines) assert.ok(line.level <= 30, `logged at level ${line.level}: ${line.msg}`)
    })

    it('tells a client that sent JSON without Content-Type: application/json to send that header', async () => {
      const json = JSON.stringify({ username: uniqueName() })
      // curl -d sends application/x-www-form-urlencoded unless told otherwise.
      const asForm = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' }, payload: json })
      assert.match(String(assertProblem(asForm, 422, 'validation_failed').detail), /Content-Type: application\/json/)
      const loginAsForm = await t.app.inject({ method: 'POST', url: '/auth/api/login', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: JSON.stringify({ username: 'x', password: GOOD_PASSWORD }) })
      assert.match(String(assertProblem(loginAsForm, 422, 'validation_failed').detail), /Content-Type: application\/json/)
      const untyped = parseRaw((await rawExchange(port, [`POST /auth/api/users HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${t.adminKey}\r\nContent-Length: ${json.length}\r\nConnection: close\r\n\r\n${json}`])).text)
      assert.match(String(assertProblem(untyped, 415, 'unsupported_media_type').detail), /Content-Type: application\/json/)
      const empty = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey) })
      assert.match(String(assertProblem(empty, 422, 'validation_failed').detail), /Content-Type: application\/json/)
    })
  })

  describe(`request-limit keys in Redis (${dialect.name})`, () => {
    let t: TestApp | undefined
    let redis: Redis | undefined
    before(async () => {
      if (TEST_REDIS_URL === undefined) return
      t = await createTestApp(dialect, { redisUrl: TEST_REDIS_URL })
      redis = new Redis(TEST_REDIS_URL)
    })
    after(async () => {
      await t?.app.close()
      redis?.disconnect()
    })

    it('names each counter by its budget alone, without "undefined"', async (ctx) => {
      if (t === undefined || redis === undefined) {
        ctx.skip(NO_REDIS)
        return
      }
      // An address no other test uses, so only this test's keys match.
      const address = `10.${randomBytes(1)[0]!}.${randomBytes(1)[0]!}.${randomBytes(1)[0]!}`
      const res = await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey), remoteAddress: address })
      assert.equal(res.statusCode, 200)
      const byAddress = await redis.keys(`gatehouse:rate:*${address}`)
      try {
        assert.deepEqual(byAddress, [`gatehouse:rate:addr:${address}`])
        const keys = await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })
        const adminKeyId = (keys.json() as Array<{ id: string, prefix: string }>).find(k => t!.adminKey.startsWith(k.prefix))!.id
        const byCredential = await redis.keys(`gatehouse:rate:*${adminKeyId}`)
        assert.deepEqual(byCredential, [`gatehouse:rate:cred:api_key:${adminKeyId}`])
        await redis.del(...byCredential)
      } finally {
        if (byAddress.length > 0) await redis.del(...byAddress)
      }
    })
  })
}
