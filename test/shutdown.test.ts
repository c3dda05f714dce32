import assert from 'node:assert/strict'
import { spawn, spawnSync, type ChildProcessByStdio } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { request as httpRequest } from 'node:http'
import { mkdtempSync, rmSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Readable } from 'node:stream'
import { after, before, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { dialects, dropSchema } from './helpers.ts'
import { freePort } from './ports.ts'
import { waitFor } from './polling.ts'
import { SHUTDOWN_CAP_MS } from '../src/server.ts'

const root = fileURLToPath(new URL('..', import.meta.url))
/** Beyond the cap: the process has to start exiting by then, on a machine shared with other test runs. */
const EXIT_MARGIN_MS = 3000

type Child = ChildProcessByStdio<null, Readable, Readable>

interface Service {
  child: Child
  port: number
  base: string
  key: string
  /** Everything the service wrote to stderr so far. */
  stderr: () => string
  /** Everything the service wrote to stdout (its log) so far. */
  stdout: () => string
  exited: () => boolean
  /** Ends the process if a test left it running (a hung shutdown), and removes what it made. */
  cleanUp: () => Promise<void>
}

/** Starts dist/server.js, as `npm start` does, with stdout and stderr piped to this process; resolves once it serves. */
async function startService (dialect: { name: string, url?: string }, dir: string): Promise<Service> {
  const port = await freePort()
  const key = `gatehouse_${randomBytes(24).toString('hex')}`
  const schema = `gh_shutdown_${randomBytes(6).toString('hex')}`
  const child = spawn(process.execPath, [join(root, 'dist/server.js')], {
    env: {
      PATH: process.env.PATH,
      HOST: '127.0.0.1',
      PORT: String(port),
      LOG_LEVEL: 'info',
      DATABASE_URL: dialect.url ?? `sqlite:${join(dir, `${schema}.db`)}`,
      ...(dialect.url !== undefined ? { DATABASE_SCHEMA: schema } : {}),
      GATEHOUSE_ADMIN_API_KEY: key,
      RATE_LIMIT_PER_ADDRESS: '0',
      RATE_LIMIT_PER_CREDENTIAL: '0'
    },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  const exited = (): boolean => child.exitCode !== null || child.signalCode !== null
  const service: Service = {
    child,
    port,
    base: `http://127.0.0.1:${port}/auth`,
    key,
    stderr: () => stderr,
    stdout: () => stdout,
    exited,
    cleanUp: async () => {
      if (!exited()) {
        child.kill('SIGKILL')
        await once(child, 'exit')
      }
      if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
    }
  }
  try {
    await waitFor('the serving line', () => {
      assert.ok(!exited(), `dist/server.js exited: ${stdout}${stderr}`)
      return stdout.includes('"msg":"gatehouse is serving"')
    }, 30_000)
  } catch (error) {
    await service.cleanUp()
    throw error
  }
  return service
}

/** Requests that each write a log line, from `workers` clients at once, until stopped. */
function startLoad (service: Service, workers: number, padding = 0): { stop: () => Promise<void>, answered: () => number } {
  const state = { running: true }
  let answered = 0
  const worker = async (): Promise<void> => {
    while (state.running) {
      try {
        const res = await fetch(`${service.base}/api/users?limit=5${padding > 0 ? `&pad=${'x'.repeat(padding)}` : ''}`, { headers: { authorization: `Bearer ${service.key}` } })
        await res.arrayBuffer()
        answered++
      } catch {
        // Refused once the listener is closed: pace the retries rather than spin.
        await new Promise(resolve => setTimeout(resolve, 20))
      }
    }
  }
  const all = Promise.all(Array.from({ length: workers }, worker))
  return { stop: async () => { state.running = false; await all }, answered: () => answered }
}

async function droppedLines (service: Service): Promise<number | undefined> {
  const metrics = await (await fetch(`${service.base}/metrics`)).text()
  const value = /^gatehouse_log_lines_dropped_total (\d+)$/m.exec(metrics)?.[1]
  return value === undefined ? undefined : Number(value)
}

async function listenerClosed (port: number): Promise<boolean> {
  return await new Promise(resolve => {
    const socket = connect({ host: '127.0.0.1', port })
    socket.once('connect', () => { socket.destroy(); resolve(false) })
    socket.once('error', () => { resolve(true) })
  })
}

async function expectExitWithinCap (service: Service): Promise<void> {
  const signalled = Date.now()
  await waitFor(`exit after SIGTERM (stderr: ${service.stderr()})`, () => service.exited(), SHUTDOWN_CAP_MS + EXIT_MARGIN_MS)
  assert.ok(Date.now() - signalled <= SHUTDOWN_CAP_MS + EXIT_MARGIN_MS)
}

/**
 * A harness that starts gatehouse with stdout piped and then goes away must
 * not leave it running: a stdout whose reader is gone drops log lines and
 * counts them, and SIGTERM ends the process within the shutdown cap.
 */
let dir: string
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'gatehouse-shutdown-'))
  const build = spawnSync(process.execPath, [join(root, 'scripts/build.js')], { cwd: root, encoding: 'utf8' })
  assert.equal(build.status, 0, build.stderr)
})
after(() => { rmSync(dir, { recursive: true, force: true }) })

describe('shutdown when the reader of stdout is gone (node dist/server.js)', () => {
  for (const dialect of dialects()) {
    it(`on ${dialect.name}: under load, drops and counts the log lines once stdout's reader is gone, and exits within the cap on SIGTERM`, { timeout: 60_000 }, async () => {
      const service = await startService(dialect, dir)
      const load = startLoad(service, 8)
      try {
        await waitFor('requests answered under load', () => load.answered() >= 50, 10_000)
        service.child.stdout.destroy()
        // Lines keep coming: the ones written after this are counted, and the service keeps serving.
        let dropped: number | undefined
        await waitFor('a count of dropped log lines', async () => {
          dropped = await droppedLines(service)
          return dropped !== undefined && dropped > 0
        }, 10_000)
        assert.ok(!service.exited())
        const before = load.answered()
        await waitFor('requests answered after stdout went away', () => load.answered() > before + 20, 10_000)

        service.child.kill('SIGTERM')
        await expectExitWithinCap(service)
        assert.equal(service.child.exitCode, 0, service.stderr())
        assert.match(service.stderr(), /log lines can no longer be written \(EPIPE\)/)
        assert.match(service.stderr(), /gatehouse: \d+ log line\(s\) could not be written to stdout \(EPIPE\)/)
      } finally {
        await load.stop()
        await service.cleanUp()
      }
    })

    it(`on ${dialect.name}: exits within the cap when stdout's reader is alive but has stopped reading, the pipe full`, { timeout: 60_000 }, async () => {
      const service = await startService(dialect, dir)
      // Paused, this process stops reading the pipe once its own buffer is full: the pipe fills behind it.
      service.child.stdout.pause()
      // Log lines of some 2 KiB each (the query string is logged): 200 of them are more than the pipe and that buffer hold.
      const load = startLoad(service, 8, 2000)
      try {
        await waitFor('requests answered with stdout not read', () => load.answered() >= 200, 20_000)
        service.child.kill('SIGTERM')
        await expectExitWithinCap(service)
        assert.equal(service.child.exitCode, 0, service.stderr())
        assert.match(service.stderr(), /gatehouse: \d+ log line\(s\) could not be written to stdout\n/)
      } finally {
        await load.stop()
        await service.cleanUp()
      }
    })

    it(`on ${dialect.name}: exits within the cap when stdout's reader goes away during the shutdown, with a request in flight`, { timeout: 60_000 }, async () => {
      const service = await startService(dialect, dir)
      let socket: Socket | undefined
      try {
        // A request whose body is still coming: the shutdown waits for it.
        socket = connect({ host: '127.0.0.1', port: service.port })
        await once(socket, 'connect')
        let answer = ''
        socket.setEncoding('utf8').on('data', (d: string) => { answer += d })
        const body = JSON.stringify({ username: 'in-flight', password: 'x' })
        socket.write(`POST /auth/api/users HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${service.key}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nExpect: 100-continue\r\n\r\n`)
        socket.write(body.slice(0, 5))
        await waitFor('the server reading the request', () => answer.startsWith('HTTP/1.1 100 Continue'), 10_000)

        service.child.kill('SIGTERM')
        await waitFor('the listener closing', async () => await listenerClosed(service.port), 10_000)
        assert.ok(!service.exited(), 'the shutdown waits for the request in flight')
        service.child.stdout.destroy()
        // The request ends and writes its log line, to a stdout nobody reads any more.
        socket.write(body.slice(5))
        await expectExitWithinCap(service)
        assert.match(answer, /HTTP\/1\.1 (400|422) /)
        assert.equal(service.child.exitCode, 0, service.stderr())
        assert.match(service.stderr(), /log line\(s\) could not be written to stdout \(EPIPE\)/)
      } finally {
        socket?.destroy()
        await service.cleanUp()
      }
    })
  }
})

const PASSWORD = 'correct horse battery staple'

async function createUsers (service: Service, count: number): Promise<string[]> {
  return await Promise.all(Array.from({ length: count }, async (_, i) => {
    const username = `signer-${i}-${randomBytes(4).toString('hex')}`
    const res = await fetch(`${service.base}/api/users`, {
      method: 'POST', headers: { authorization: `Bearer ${service.key}`, 'content-type': 'application/json' }, body: JSON.stringify({ username, password: PASSWORD })
    })
    assert.equal(res.status, 201, await res.text())
    return username
  }))
}

/**
 * A sign-in on a connection of its own: resolves with the status of its
 * answer, or the error code when the connection ended without one; `sent`
 * resolves once the connection is open and the request written to it.
 */
function signInOnItsOwnConnection (service: Service, username: string): { sent: Promise<void>, answer: Promise<number | string> } {
  const body = JSON.stringify({ username, password: PASSWORD })
  let sent!: () => void
  const written = new Promise<void>(resolve => { sent = resolve })
  const answer = new Promise<number | string>(resolve => {
    const req = httpRequest({ host: '127.0.0.1', port: service.port, path: '/auth/api/login', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, res => {
      res.resume()
      res.on('end', () => { resolve(res.statusCode ?? 0) })
      res.on('error', (error: NodeJS.ErrnoException) => { resolve(error.code ?? error.message) })
    })
    req.on('error', (error: NodeJS.ErrnoException) => { sent(); resolve(error.code ?? error.message) })
    req.on('finish', () => { sent() })
    req.end(body)
  })
  return { sent: written, answer }
}

describe('a stop with sign-ins in flight (node dist/server.js)', () => {
  for (const dialect of dialects()) {
    it(`on ${dialect.name}: answers every sign-in it accepted (200, or 503 before starting it), closes the database after the last, and exits 0 within the cap`, { timeout: 90_000 }, async () => {
      const service = await startService(dialect, dir)
      let socket: Socket | undefined
      try {
        const [slow, ...names] = await createUsers(service, 21)
        // One sign-in the server is reading at the signal (its body is still coming), with a wrong password: its
        // failure is counted and the account's known addresses read, in the database, after the stop has begun.
        socket = connect({ host: '127.0.0.1', port: service.port })
        await once(socket, 'connect')
        let slowAnswer = ''
        socket.setEncoding('utf8').on('data', (d: string) => { slowAnswer += d })
        const slowBody = JSON.stringify({ username: slow, password: 'not the password at all' })
        socket.write('POST /auth/api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n' +
          `Content-Length: ${Buffer.byteLength(slowBody)}\r\nExpect: 100-continue\r\n\r\n`)
        socket.write(slowBody.slice(0, 5))
        await waitFor('the server reading the slow sign-in', () => slowAnswer.startsWith('HTTP/1.1 100 Continue'), 10_000)

        // Twenty more, each on a connection of its own, and the signal as soon as all are written: some are being
        // hashed, some read, some still in the kernel's queue of connections not yet accepted.
        const signIns = names!.map(name => signInOnItsOwnConnection(service, name))
        await Promise.all(signIns.map(async s => { await s.sent }))
        service.child.kill('SIGTERM')
        await waitFor('the shutting-down line', () => service.stdout().includes('"msg":"shutting down"'), 10_000)
        socket.write(slowBody.slice(5))

        const answers = await Promise.all(signIns.map(async s => await s.answer))
        await expectExitWithinCap(service)
        await waitFor('the slow sign-in\'s answer', () => /\r\n\r\n\{/.test(slowAnswer), 5_000)
        const counts: Record<string, number> = {}
        for (const answer of answers) counts[String(answer)] = (counts[String(answer)] ?? 0) + 1
        assert.deepEqual(Object.keys(counts).filter(answer => answer !== '200' && answer !== '503'), [], `every sign-in answered 200 or 503: ${JSON.stringify(counts)}`)
        assert.match(slowAnswer, /HTTP\/1\.1 401 /, 'the sign-in read at the signal ran to its end')
        assert.equal(service.child.exitCode, 0, service.stderr())
        const errors = service.stdout().split('\n').filter(line => /"level":(50|60)|has already been destroyed/.test(line))
        assert.deepEqual(errors, [])
      } finally {
        socket?.destroy()
        await service.cleanUp()
      }
    })
  }
})

describe('a build that fails leaves nothing open', () => {
  const postgres = dialects().find(d => d.name === 'postgres')
  it('when the migration fails on PostgreSQL, buildApp rejects and the process exits by itself (no pool, no credential listener left)', { skip: postgres === undefined ? 'TEST_DATABASE_URL is not set' : false, timeout: 60_000 }, async () => {
    const url = new URL(postgres!.url!)
    url.pathname = `/gatehouse_no_such_db_${randomBytes(4).toString('hex')}`
    const script = `
      const { buildApp } = await import(${JSON.stringify(join(root, 'src/app.ts'))})
      const { defaultConfig } = await import(${JSON.stringify(join(root, 'src/config.ts'))})
      try {
        await buildApp({ config: defaultConfig({ databaseUrl: ${JSON.stringify(url.href)}, logLevel: 'silent', credentialCacheTtlMs: 5000 }), logger: false })
        console.log('built')
      } catch (error) {
        console.log('refused: ' + error.code)
      }`
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    child.stdout.on('data', (chunk: Buffer) => { stdout += chunk.toString() })
    const exited = once(child, 'exit')
    const deadline = setTimeout(() => { child.kill('SIGKILL') }, 30_000)
    const [code, signal] = await exited as [number | null, NodeJS.Signals | null]
    clearTimeout(deadline)
    assert.match(stdout, /^refused: 3D000/m, 'the database does not exist')
    assert.deepEqual([code, signal], [0, null], 'the process ended by itself, not by the 30 s kill')
  })
})
