import { strict as assert } from 'node:assert'
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises'
import { request } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { errorLog, NGINX, nginxConf } from './nginx.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'

/*
 * docs/operations.md's upgrade of several instances, carried out: two
 * instances of the previous release (the commit test/fixtures/previous-release
 * names, built from this repository's history) serve one PostgreSQL schema
 * behind nginx under steady reads, writes and sign-ins; this code's
 * `gatehouse migrate` runs beside them; then each instance is taken out of
 * nginx's upstream, stopped, started again as this code, and put back. No
 * request may fail, and every acknowledged write must be there at the end.
 * It is also the check that this release's migrations keep the previous
 * release's reads and writes working: the old instances serve on the migrated
 * schema for a while before they are replaced.
 */

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const DATABASE_URL = process.env.TEST_DATABASE_URL
const PREVIOUS = readFileSync(new URL('./fixtures/previous-release', import.meta.url), 'utf8')
  .split('\n').map(line => line.trim()).find(line => /^[0-9a-f]{40}$/.test(line))
const ADMIN_KEY = `gatehouse_${randomBytes(24).toString('hex')}`
const ADMIN = { authorization: `Bearer ${ADMIN_KEY}` }
/** Concurrent clients; each keeps one request in flight. */
const CLIENTS = 6
/** How long each phase of the upgrade runs under load before the next step. */
const PHASE_MS = 1500

const skip = DATABASE_URL === undefined || DATABASE_URL === ''
  ? 'TEST_DATABASE_URL is unset: instances of two releases share one PostgreSQL database (CI sets it)'
  : !existsSync(NGINX) ? `${NGINX} is missing; install Debian's nginx package to run this test (CI does)` : false

interface Instance { name: string, release: 'previous' | 'this', port: number, proc: ChildProcess, exited: Promise<void>, output: string[] }

function alive (instance: Instance): boolean {
  return instance.proc.exitCode === null && instance.proc.signalCode === null
}

function childEnv (extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, ...extra }
  // A child that believes it is a test file reports to the runner.
  delete env.NODE_TEST_CONTEXT
  for (const inherited of ['GATEHOUSE_ADMIN_USERNAME', 'GATEHOUSE_ADMIN_PASSWORD', 'BASE_PATH', 'REDIS_URL']) delete env[inherited]
  return env
}

function startInstance (name: string, release: Instance['release'], cwd: string, port: number, schema: string): Instance {
  const env = childEnv({
    HOST: '127.0.0.1',
    PORT: String(port),
    DATABASE_URL: DATABASE_URL!,
    DATABASE_SCHEMA: schema,
    GATEHOUSE_ADMIN_API_KEY: ADMIN_KEY,
    TRUST_PROXY: '127.0.0.1',
    // The load signs in from one address far more often than a person would.
    LOGIN_MAX_FAILURES_PER_ADDRESS: '1000000',
    RATE_LIMIT_PER_CREDENTIAL: '0',
    RATE_LIMIT_PER_ADDRESS: '0',
    LOG_LEVEL: 'warn'
  })
  const proc = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
  const output: string[] = []
  for (const stream of [proc.stdout!, proc.stderr!]) {
    stream.setEncoding('utf8').on('data', (chunk: string) => {
      output.push(chunk)
      if (output.length > 200) output.shift()
    })
  }
  const exited = new Promise<void>(resolve => {
    proc.once('exit', () => resolve())
    proc.once('error', () => resolve())
  })
  return { name, release, port, proc, exited, output }
}

async function waitReady (instance: Instance): Promise<void> {
  try {
    await waitFor(`instance ${instance.name} (${instance.release} release) to be ready`, async () => {
      if (!alive(instance)) throw new Error(`instance ${instance.name} exited (${instance.proc.exitCode ?? instance.proc.signalCode}) before it was ready:\n${instance.output.join('')}`)
      try {
        const res = await fetch(`http://127.0.0.1:${instance.port}/auth/readyz`)
        await res.arrayBuffer()
        return res.status === 200
      } catch {
        return false
      }
      // A start compiles the whole service through tsx: a second or two on a quiet machine, far more beside other work.
    }, 120_000)
  } catch (error) {
    throw new Error(`${String(error)}; its output:\n${instance.output.join('')}`)
  }
}

/** The previous release's source tree, from git history, with its dependencies. */
async function buildPrevious (commit: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'gatehouse-previous-'))
  execFileSync('sh', ['-c', `git -C "${ROOT}" archive --format=tar ${commit} | tar -x -C "${dir}"`], { stdio: ['ignore', 'ignore', 'pipe'] })
  const sameLock = readFileSync(join(dir, 'package-lock.json'), 'utf8') === readFileSync(join(ROOT, 'package-lock.json'), 'utf8')
  if (sameLock) {
    // The same dependencies, so this checkout's node_modules serves both releases.
    await symlink(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir')
  } else {
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', '--ignore-scripts'], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'], timeout: 600_000 })
    execFileSync('npm', ['rebuild', 'better-sqlite3'], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'], timeout: 600_000 })
  }
  return dir
}

/**
 * nginx with its master process, so that a changed upstream is taken up by
 * a reload (SIGHUP): new workers get the new configuration, old ones finish
 * the requests they hold and exit. Each configuration carries its generation
 * in a response header, so the test can tell when it is the one answering.
 */
class Gate {
  readonly dir: string
  readonly port: number
  generation = 0
  proc: ChildProcess | undefined
  constructor (dir: string, port: number) { this.dir = dir; this.port = port }

  async configure (upstreams: Array<{ port: number, down: boolean }>): Promise<void> {
    this.generation += 1
    await writeFile(join(this.dir, 'nginx.conf'), nginxConf(this.dir, `  upstream gatehouse {
${upstreams.map(u => `    server 127.0.0.1:${u.port} max_fails=1 fail_timeout=10s${u.down ? ' down' : ''};`).join('\n')}
  }
  server {
    listen 127.0.0.1:${this.port};
    add_header X-Gate-Generation ${this.generation} always;
    location /auth/ {
      proxy_pass http://gatehouse;
      proxy_next_upstream error timeout;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $remote_addr;
    }
  }`, { masterProcess: true }))
    if (this.proc === undefined) {
      this.proc = spawn(NGINX, ['-p', `${this.dir}/`, '-c', join(this.dir, 'nginx.conf'), '-e', join(this.dir, 'error.log')], { stdio: 'ignore' })
    } else {
      this.proc.kill('SIGHUP')
    }
    const generation = String(this.generation)
    await waitFor(`nginx to answer with configuration ${generation}`, async () => {
      if (this.proc!.exitCode !== null) throw new Error(`nginx exited (${this.proc!.exitCode}):\n${await errorLog(this.dir)}`)
      try {
        const res = await fetch(`http://127.0.0.1:${this.port}/auth/healthz`, { headers: { connection: 'close' } })
        await res.arrayBuffer()
        return res.headers.get('x-gate-generation') === generation && this.workers() === 1
      } catch {
        return false
      }
    }, 20_000)
  }

  /** nginx's worker processes: more than one while an old one is still finishing its requests. */
  workers (): number {
    const master = String(this.proc!.pid)
    let count = 0
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, 'utf8')
        if (stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1] === master) count += 1
      } catch {
        // gone meanwhile
      }
    }
    return count
  }

  async stop (): Promise<void> {
    if (this.proc === undefined || this.proc.exitCode !== null) return
    const exited = new Promise(resolve => this.proc!.once('exit', resolve))
    this.proc.kill('SIGTERM')
    if (await Promise.race([exited.then(() => 'exited'), sleep(5_000, 'timeout', { ref: false })]) === 'timeout') this.proc.kill('SIGKILL')
  }
}

interface Answer { status: number, text: string }

/** One request on a connection of its own, so that nginx's reloads never close a connection under a request. */
async function call (port: number, method: string, path: string, headers: Record<string, string>, json?: unknown): Promise<Answer> {
  const body = json === undefined ? undefined : JSON.stringify(json)
  return await new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, agent: false, headers: { ...headers, connection: 'close', ...(body !== undefined ? { 'content-type': 'application/json' } : {}) }, signal: AbortSignal.timeout(20_000) }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { text += chunk })
      res.on('end', () => resolve({ status: res.statusCode!, text }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

describe('an upgrade of two instances from the previous release, one at a time behind nginx', { skip, timeout: 600_000 }, () => {
  const schema = `gh_roll_${randomBytes(6).toString('hex')}`
  const instances: Instance[] = []
  const dirs: string[] = []
  let gate: Gate | undefined

  after(async () => {
    for (const instance of instances) if (alive(instance)) instance.proc.kill('SIGKILL')
    await Promise.all(instances.map(async i => await Promise.race([i.exited, sleep(5_000, undefined, { ref: false })])))
    await gate?.stop()
    for (const dir of dirs) await rm(dir, { recursive: true, force: true })
    await dropSchema(DATABASE_URL!, schema)
  })

  let previousDir = ''
  before(async () => {
    assert.ok(PREVIOUS !== undefined, 'test/fixtures/previous-release names a commit (40 hex digits)')
    try {
      execFileSync('git', ['-C', ROOT, 'cat-file', '-e', `${PREVIOUS}^{commit}`], { stdio: 'ignore' })
    } catch {
      assert.fail(`the previous release ${PREVIOUS} is not in this repository's history (a shallow clone?); fetch it with git fetch --unshallow`)
    }
    previousDir = await buildPrevious(PREVIOUS)
    dirs.push(previousDir)
  })

  it('answers every request and keeps every acknowledged write while the instances are replaced', async (t) => {
    const ports = [await freePort(), await freePort()]
    for (const [i, name] of ['A', 'B'].entries()) instances.push(startInstance(name, 'previous', previousDir, ports[i]!, schema))
    await Promise.all(instances.map(waitReady))

    const gateDir = await mkdtemp(join(tmpdir(), 'gatehouse-rolling-nginx-'))
    dirs.push(gateDir)
    gate = new Gate(gateDir, await freePort())
    const upstreams = ports.map(port => ({ port, down: false }))
    await gate.configure(upstreams)
    const g = gate

    const signer = `roll_signer_${randomBytes(3).toString('hex')}`
    const made = await call(g.port, 'POST', '/auth/api/users', ADMIN, { username: signer, password: GOOD_PASSWORD })
    assert.equal(made.status, 201, made.text)

    let phase = 'previous release'
    const load = { running: true }
    const failures: string[] = []
    const created: Array<{ id: string, username: string }> = []
    const renamed = new Map<string, Set<string>>()
    const answered = new Map<string, number>()
    let n = 0
    const expect = (what: string, answer: Answer, status: number): boolean => {
      if (answer.status === status) {
        answered.set(phase, (answered.get(phase) ?? 0) + 1)
        return true
      }
      failures.push(`${phase}: ${what} answered ${answer.status}: ${answer.text.slice(0, 300)}`)
      return false
    }
    const client = async (): Promise<void> => {
      while (load.running) {
        const i = n++
        try {
          if (i % 4 === 0) {
            const username = `roll_${randomBytes(5).toString('hex')}`
            const res = await call(g.port, 'POST', '/auth/api/users', ADMIN, { username, first_name: `Roll${i}` })
            if (expect('create a user', res, 201)) created.push({ id: (JSON.parse(res.text) as { id: string }).id, username })
          } else if (i % 4 === 1 && created.length > 0) {
            const user = created[i % created.length]!
            const display = `Renamed${i}`
            const res = await call(g.port, 'PATCH', `/auth/api/users/${user.id}`, ADMIN, { first_name: display })
            // Two clients may rename one user at once: what is read back must be one of the acknowledged names.
            if (expect('change a user', res, 200)) renamed.set(user.id, (renamed.get(user.id) ?? new Set()).add(display))
          } else if (i % 4 === 2) {
            const res = await call(g.port, 'POST', '/auth/api/login', {}, { username: signer, password: GOOD_PASSWORD })
            if (expect('sign in', res, 200)) {
              const token = (JSON.parse(res.text) as { token: string }).token
              expect('verify the new session', await call(g.port, 'GET', '/auth/api/verify', { authorization: `Bearer ${token}` }), 200)
            }
          } else {
            expect('list users', await call(g.port, 'GET', '/auth/api/users?limit=20', ADMIN), 200)
          }
        } catch (error) {
          failures.push(`${phase}: request ${i} failed without an answer: ${String(error)}`)
        }
      }
    }
    const clients = Promise.all(Array.from({ length: CLIENTS }, client))
    try {
      await sleep(PHASE_MS)

      phase = 'previous release on the migrated schema'
      const migrate = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', 'migrate'], {
        cwd: ROOT, env: childEnv({ DATABASE_URL: DATABASE_URL!, DATABASE_SCHEMA: schema }), stdio: ['ignore', 'pipe', 'pipe']
      })
      let migrateOutput = ''
      for (const stream of [migrate.stdout, migrate.stderr]) stream.setEncoding('utf8').on('data', (chunk: string) => { migrateOutput += chunk })
      const code = await new Promise<number | null>(resolve => migrate.once('exit', resolve))
      assert.equal(code, 0, `gatehouse migrate:\n${migrateOutput}`)
      t.diagnostic(`gatehouse migrate: ${migrateOutput.trim().split('\n').slice(-3).join(' | ')}`)
      await sleep(PHASE_MS)

      for (const [i, name] of ['A', 'B'].entries()) {
        phase = `instance ${name} leaving`
        upstreams[i]!.down = true
        await g.configure(upstreams)
        const old = instances.find(x => x.name === name && alive(x))!
        old.proc.kill('SIGTERM')
        await Promise.race([old.exited, sleep(15_000, undefined, { ref: false })])
        assert.ok(!alive(old), `the previous release's instance ${name} stopped within 15 s of SIGTERM`)

        phase = `instance ${name} replaced`
        const fresh = startInstance(name, 'this', ROOT, ports[i]!, schema)
        instances.push(fresh)
        await waitReady(fresh)
        upstreams[i]!.down = false
        await g.configure(upstreams)
        await sleep(PHASE_MS)
      }
      phase = 'this release'
      await sleep(PHASE_MS)
    } finally {
      load.running = false
      await clients
    }

    t.diagnostic(`answers per phase: ${[...answered].map(([p, count]) => `${p} ${count}`).join('; ')}`)
    assert.deepEqual(failures, [], 'no request failed during the upgrade')
    assert.ok((answered.get('previous release on the migrated schema') ?? 0) > 0, 'the previous release answered on the migrated schema')
    assert.ok((answered.get('this release') ?? 0) > 0, 'this release answered once both were replaced')

    // Every acknowledged write, read back from this release.
    for (const user of created) {
      const res = await call(g.port, 'GET', `/auth/api/users/${user.id}`, ADMIN)
      assert.equal(res.status, 200, `user ${user.username}, acknowledged during the upgrade: ${res.text}`)
      const body = JSON.parse(res.text) as { username: string, first_name: string | null }
      assert.equal(body.username, user.username)
      const names = renamed.get(user.id)
      if (names !== undefined) assert.ok(names.has(body.first_name ?? ''), `user ${user.username} reads ${String(body.first_name)}, one of its acknowledged renames (${[...names].join(', ')})`)
    }
    t.diagnostic(`${created.length} users created and ${renamed.size} renamed during the upgrade, all read back`)
    assert.ok(created.length > 0)
  })
})
