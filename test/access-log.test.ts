import assert from 'node:assert/strict'
import { after, before, describe, it } from 'node:test'
import fc from 'fast-check'
import pino from 'pino'
import { ACCESS_MESSAGE, loggerOptions } from '../src/system/access-log.ts'
import { auth, createTestApp, dialects, type TestApp } from './helpers.ts'

interface AccessEntry { reqId: string, msg: string, time: number, req: { method: string, url: string, remoteAddress?: string }, res: { statusCode: number }, responseTime: number }

/**
 * The line pino writes for the same request with the production logger's
 * options, from what the request was: its method, its URL (pino's
 * serializer redacts it), its address, status and time taken, at the
 * time the line carries.
 */
function pinoLine (entry: AccessEntry, url: string): string {
  const lines: string[] = []
  // Fastify takes the destination among the options; pino takes it beside them.
  const { stream, ...options } = loggerOptions('info', { write: (line: string) => { lines.push(line) } })
  const logger = pino({ ...options, timestamp: () => `,"time":${entry.time}` }, stream)
  logger.child({ reqId: entry.reqId }).info({
    req: { method: entry.req.method, url, ip: entry.req.remoteAddress },
    res: { statusCode: entry.res.statusCode },
    responseTime: entry.responseTime
  }, ACCESS_MESSAGE)
  assert.equal(lines.length, 1)
  return lines[0]!
}

/** The access lines among `lines` of the request with this id. */
function accessLinesIn (lines: string[], requestId: string): string[] {
  return lines.filter(line => line.includes(`"reqId":"${requestId}"`) && line.includes(`"msg":"${ACCESS_MESSAGE}"`))
}

describe('the access log line', () => {
  const lines: string[] = []
  let t: TestApp
  before(async () => { t = await createTestApp(dialects()[0]!, {}, { write: (line: string) => { lines.push(line) } }) })
  after(async () => { await t.app.close() })

  function accessLinesOf (requestId: string): string[] {
    return accessLinesIn(lines, requestId)
  }

  it('is one pino line of the method, the redacted URL, the status and the time taken, whatever the URL holds', async () => {
    const queryValue = fc.string({ unit: fc.constantFrom('a', 'Z', '0', '"', '\\', '%22', '%00', '/', 'é', '😀', '=', ' ', '\u2028', '\t', '{'), maxLength: 12 })
    const parameter = fc.tuple(fc.constantFrom('limit', 'q', 'API_KEY', 'api%5Fkey', 'token', 'code', 'cursor', 'x"y', 'State'), queryValue)
    await fc.assert(fc.asyncProperty(
      fc.constantFrom('/auth/api/users', '/auth/api/users/"quoted"', '/auth/api/nothing/é', '/auth/version'),
      fc.array(parameter, { maxLength: 4 }),
      fc.constantFrom('GET', 'DELETE', 'OPTIONS'),
      async (path, parameters, method) => {
        const url = parameters.length === 0 ? path : `${path}?${parameters.map(([k, v]) => `${k}=${v}`).join('&')}`
        const res = await t.app.inject({ method: method as 'GET', url, headers: auth(t.adminKey) })
        const requestId = res.headers['x-request-id'] as string
        const written = accessLinesOf(requestId)
        assert.equal(written.length, 1, `one access line for ${url}`)
        const entry = JSON.parse(written[0]!) as AccessEntry
        assert.equal(entry.res.statusCode, res.statusCode)
        // The URL as the server saw it (light-my-request percent-encodes what is not ASCII); redacting it again changes nothing.
        assert.equal(written[0], pinoLine(entry, entry.req.url))
      }), { numRuns: 150 })
  })

  it('carries no credential or one-time secret given in the query string', async () => {
    const res = await t.app.inject({ url: '/auth/api/users?limit=1&API_KEY=gatehouse_leaked&%41PI_KEY=also&token=tok_secret&code=c0de', headers: auth(t.adminKey) })
    const [line] = accessLinesOf(res.headers['x-request-id'] as string)
    assert.ok(line !== undefined)
    assert.equal((JSON.parse(line) as AccessEntry).req.url, '/auth/api/users?limit=1&API_KEY=[redacted]&%41PI_KEY=[redacted]&token=[redacted]&code=[redacted]')
    for (const secret of ['gatehouse_leaked', 'also', 'tok_secret', 'c0de']) assert.ok(!line.includes(secret), secret)
  })

  it('carries no password or other secret given in the query string of any route, whatever the name\'s case or escapes', async () => {
    const secrets = ['password=hunter2a', 'PassWord=hunter2b', 'pass%77ord=hunter2c', 'new_password=hunter2d', 'current_password=hunter2e',
      'client_secret=hunter2f', 'otp=hunter2g', 'TOTP=hunter2h', 'key=hunter2i', 'recovery_code=hunter2j', 'access_token=hunter2k']
    const res = await t.app.inject({ url: `/auth/api/users?limit=1&${secrets.join('&')}&q=kept`, headers: auth(t.adminKey) })
    const [line] = accessLinesOf(res.headers['x-request-id'] as string)
    assert.ok(line !== undefined)
    const names = secrets.map(pair => pair.split('=')[0]!)
    assert.equal((JSON.parse(line) as AccessEntry).req.url, `/auth/api/users?limit=1&${names.map(name => `${name}=[redacted]`).join('&')}&q=kept`)
    assert.ok(!line.includes('hunter2'), line)
  })

  it('redacts the password of a sign-in sent in the query string, which is refused', async () => {
    const res = await t.app.inject({ method: 'POST', url: '/auth/api/login?username=admin&password=hunter2-login', payload: { username: 'nobody', password: 'not this one either' } })
    assert.equal(res.statusCode, 400)
    const [line] = accessLinesOf(res.headers['x-request-id'] as string)
    assert.ok(line !== undefined)
    assert.equal((JSON.parse(line) as AccessEntry).req.url, '/auth/api/login?username=admin&password=[redacted]')
    assert.ok(!lines.some(written => written.includes('hunter2-login')), 'no line carries the password')
  })

  it('names the client\'s address for a request over a real socket', async () => {
    const address = await t.app.listen({ host: '127.0.0.1', port: 0 })
    const res = await fetch(`${address}/auth/api/users?limit=2`, { headers: auth(t.adminKey) })
    assert.equal(res.status, 200)
    await res.arrayBuffer()
    const requestId = res.headers.get('x-request-id')!
    // The line is written once the response has been sent, which the client may see first.
    const deadline = Date.now() + 5000
    while (accessLinesOf(requestId).length === 0 && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 10))
    const [line] = accessLinesOf(requestId)
    assert.ok(line !== undefined, 'the access line was written')
    const entry = JSON.parse(line) as AccessEntry
    assert.equal(entry.req.remoteAddress, '127.0.0.1')
    assert.equal(line, pinoLine(entry, '/auth/api/users?limit=2'))
  })

  it('is written, time taken included, for a request refused before routing (an undecodable path)', async () => {
    const res = await t.app.inject({ url: '/auth/api/users/%E0%A4%A', headers: auth(t.adminKey) })
    assert.equal(res.statusCode, 404)
    const written = accessLinesOf(res.headers['x-request-id'] as string)
    assert.equal(written.length, 1)
    const entry = JSON.parse(written[0]!) as AccessEntry
    assert.equal(entry.res.statusCode, 404)
    assert.equal(typeof entry.responseTime, 'number')
    assert.equal(written[0], pinoLine(entry, '/auth/api/users/%E0%A4%A'))
  })

  it('is not written for a route that logs only warnings (health checks)', async () => {
    const res = await t.app.inject({ url: '/auth/healthz' })
    assert.equal(res.statusCode, 200)
    assert.deepEqual(accessLinesOf(res.headers['x-request-id'] as string), [])
  })
})

describe('the access log line under LOG_LEVEL=warn', () => {
  const lines: string[] = []
  let t: TestApp
  before(async () => { t = await createTestApp(dialects()[0]!, { logLevel: 'warn' }, { write: (line: string) => { lines.push(line) } }) })
  after(async () => { await t.app.close() })

  it('is not written', async () => {
    const res = await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) })
    assert.equal(res.statusCode, 200)
    assert.deepEqual(lines.filter(line => line.includes(ACCESS_MESSAGE)), [])
  })
})

describe('the access line behind a trusted proxy', () => {
  const lines: string[] = []
  let t: TestApp
  before(async () => { t = await createTestApp(dialects()[0]!, { trustProxy: '127.0.0.1' }, { write: (line: string) => { lines.push(line) } }) })
  after(async () => { await t.app.close() })

  /** The client address the access line of a request from `peer`, forwarding 198.51.100.7, names. */
  async function clientLogged (url: string, peer: string): Promise<string | undefined> {
    const res = await t.app.inject({ url, remoteAddress: peer, headers: { ...auth(t.adminKey), 'x-forwarded-for': '198.51.100.7' } })
    const [line] = accessLinesIn(lines, res.headers['x-request-id'] as string)
    assert.ok(line !== undefined, `an access line for ${url}`)
    return (JSON.parse(line) as AccessEntry).req.remoteAddress
  }

  it('names the client the proxy reports, also for a request refused before routing', async () => {
    for (const url of ['/auth/api/users?limit=1', '/auth/api/users/%E0%A4%A']) {
      assert.equal(await clientLogged(url, '127.0.0.1'), '198.51.100.7', url)
    }
    // A peer the setting does not name is itself the client, whatever it forwards.
    assert.equal(await clientLogged('/auth/api/users/%E0%A4%A', '192.0.2.1'), '192.0.2.1')
  })
})
