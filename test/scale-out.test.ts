import { strict as assert } from 'node:assert'
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes, randomInt } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { Agent, request, type IncomingHttpHeaders } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { pino } from 'pino'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig } from '../src/config.ts'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { PasswordHasher } from '../src/lib/passwords.ts'
import { dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { errorLog, NGINX, nginxConf, startNginx, stopNginx, type Nginx } from './nginx.ts'
import { freePort } from './ports.ts'
import { NO_REDIS, TEST_REDIS_URL } from './redis.ts'

/*
 * Three gatehouse processes on one PostgreSQL schema and one Redis, behind
 * nginx as a round-robin load balancer, with the nginx configuration that
 * docs/scale-out.md shows.
 */

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const DOC = new URL('../docs/scale-out.md', import.meta.url)
const DATABASE_URL = process.env.TEST_DATABASE_URL
const REDIS_URL = TEST_REDIS_URL
const ADMIN_KEY = `gatehouse_${randomBytes(24).toString('hex')}`
const ADMIN = { authorization: `Bearer ${ADMIN_KEY}` }
const WRONG = 'not the password at all'
/** Small budgets, so that reaching them takes few (argon2-priced) attempts. */
const ACCOUNT_BUDGET = 4
const ADDRESS_BUDGET = 40
const LOCK_THRESHOLD = 6
const LOAD = { creates: 300, concurrency: 16, killAfterAcks: 100 }
const SURVIVOR_REQUESTS = 30

const NO_POSTGRES = 'TEST_DATABASE_URL is unset: several instances need one PostgreSQL database to share (CI sets it)'
const noDatabase = DATABASE_URL === undefined || DATABASE_URL === ''
const skip = noDatabase
  ? NO_POSTGRES
  : !existsSync(NGINX)
      ? `${NGINX} is missing; install Debian's nginx package to run this test (CI does)`
      : REDIS_URL === undefined ? `${NO_REDIS}: the instances share the sign-in budgets there` : false

/** A block of docs/scale-out.md's nginx example, between `# >>> scale-out NAME` and `# <<< scale-out NAME`. */
function documented (name: string): string {
  const match = new RegExp(`^[ \\t]*# >>> scale-out ${name}\\n([\\s\\S]*?)^[ \\t]*# <<< scale-out ${name}$`, 'm').exec(readFileSync(DOC, 'utf8'))
  assert.ok(match !== null, `docs/scale-out.md marks its ${name} with lines "# >>> scale-out ${name}" and "# <<< scale-out ${name}"`)
  return match[1]!
}

/** The documented upstream with its three example addresses replaced by the instances' ones, and its fail_timeout. */
function upstreamFor (ports: number[]): { conf: string, failTimeoutMs: number } {
  let n = 0
  const conf = documented('upstream').replace(/^(\s*server\s+)\S+?(?=[\s;])/gm, (_all, lead: string) => `${lead}127.0.0.1:${ports[n++]}`)
  assert.equal(n, ports.length, 'the documented upstream lists one server per instance')
  const failTimeout = /fail_timeout=(\d+)s/.exec(conf)
  assert.ok(failTimeout !== null, 'the documented upstream sets fail_timeout in seconds')
  return { conf, failTimeoutMs: Number(failTimeout[1]) * 1000 }
}

// SQLite is one machine's file and so one instance's: this is about PostgreSQL.
describe('several instances starting at the same moment on one empty database', { skip: noDatabase ? NO_POSTGRES : false }, () => {
  it('all start, and register GATEHOUSE_ADMIN_API_KEY and GATEHOUSE_ADMIN_USERNAME once', async () => {
    const schema = `gh_start_${randomBytes(6).toString('hex')}`
    const config = defaultConfig({
      databaseUrl: DATABASE_URL!,
      databaseSchema: schema,
      bootstrapAdminApiKey: ADMIN_KEY,
      bootstrapAdminUsername: 'first_admin',
      bootstrapAdminPassword: GOOD_PASSWORD
    })
    const log = pino({ level: 'silent' })
    // One pool per instance, so that their statements really do interleave.
    const instances = Array.from({ length: 4 }, () => ({ db: createDb(config), passwords: new PasswordHasher(config) }))
    try {
      await Promise.all(instances.map(async ({ db }) => await migrateToLatest(db, schema)))
      const started = await Promise.allSettled(instances.map(async ({ db, passwords }) => await bootstrap(db, passwords, config, log)))
      assert.deepEqual(started.map(s => s.status === 'rejected' ? String(s.reason) : s.status), instances.map(() => 'fulfilled'))
      const db = instances[0]!.db
      const keys = await db.selectFrom('api_keys').select('name').execute()
      assert.deepEqual(keys.map(k => k.name), ['GATEHOUSE_ADMIN_API_KEY'])
      const users = await db.selectFrom('users').select(['username', 'role']).execute()
      assert.deepEqual(users, [{ username: 'first_admin', role: 'admin' }])
    } finally {
      await Promise.all(instances.map(async ({ db }) => await db.destroy()))
      await dropSchema(DATABASE_URL!, schema)
    }
  })
})

interface Answer { status: number, headers: IncomingHttpHeaders, text: string }

/** One keep-alive pool for every request, so the load measures the servers rather than connection set-up. */
const agent = new Agent({ keepAlive: true, maxSockets: 64 })

/**
 * An HTTP request from a loopback address of the caller's choosing (all of
 * 127.0.0.0/8 is local on Linux): each part of the test signs in from
 * addresses of its own, unseen by any other test that shares the Redis.
 */
async function call (base: string, path: string, options: { from: string, method?: string, headers?: Record<string, string>, json?: unknown }): Promise<Answer> {
  const body = options.json === undefined ? undefined : JSON.stringify(options.json)
  const headers: Record<string, string> = { ...options.headers }
  if (body !== undefined) headers['content-type'] = 'application/json'
  return await new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, {
      method: options.method ?? 'GET', headers, agent, localAddress: options.from, signal: AbortSignal.timeout(15_000)
    }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { text += chunk })
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, text }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

const subnet = `127.${randomInt(100, 250)}.${randomInt(0, 256)}`
let hosts = 0
/** A loopback address no other part of this run uses. */
function newAddress (): string {
  hosts += 1
  return `${subnet}.${hosts}`
}

interface Instance {
  name: string
  port: number
  base: string
  proc: ChildProcess
  exited: Promise<void>
  /** The process's stdout and stderr, for failure messages. */
  output: string[]
}

function alive (instance: Instance): boolean {
  return instance.proc.exitCode === null && instance.proc.signalCode === null
}

function startInstance (name: string, port: number, schema: string): Instance {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    HOST: '127.0.0.1',
    PORT: String(port),
    DATABASE_URL,
    DATABASE_SCHEMA: schema,
    REDIS_URL,
    GATEHOUSE_ADMIN_API_KEY: ADMIN_KEY,
    // Only nginx (which connects from 127.0.0.1) is believed about the client's address; a request
    // the test sends an instance directly counts under the address it was sent from.
    TRUST_PROXY: '127.0.0.1',
    LOGIN_MAX_FAILURES_PER_ACCOUNT: String(ACCOUNT_BUDGET),
    LOGIN_MAX_FAILURES_PER_ADDRESS: String(ADDRESS_BUDGET),
    ACCOUNT_LOCK_THRESHOLD: String(LOCK_THRESHOLD),
    LOG_LEVEL: 'warn',
    // Longer than any wait for a NOTIFY below, so a cached answer cannot simply expire in time.
    CREDENTIAL_CACHE_TTL_MS: '5000'
  }
  // Not the runner's business: a child that believes it is a test file reports to the runner.
  delete env.NODE_TEST_CONTEXT
  for (const inherited of ['GATEHOUSE_ADMIN_USERNAME', 'GATEHOUSE_ADMIN_PASSWORD', 'BASE_PATH']) delete env[inherited]
  const proc = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
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
  return { name, port, base: `http://127.0.0.1:${port}`, proc, exited, output }
}

async function waitReady (instance: Instance, deadline: number): Promise<void> {
  while (Date.now() < deadline) {
    if (!alive(instance)) {
      throw new Error(`instance ${instance.name} exited (${instance.proc.exitCode ?? instance.proc.signalCode}) before it was ready:\n${instance.output.join('')}`)
    }
    try {
      const res = await fetch(`${instance.base}/auth/readyz`)
      await res.arrayBuffer()
      if (res.status === 200) return
    } catch {
      // not listening yet
    }
    await sleep(100)
  }
  throw new Error(`instance ${instance.name} was not ready within the deadline:\n${instance.output.join('')}`)
}

async function kill (instance: Instance): Promise<void> {
  if (alive(instance)) instance.proc.kill('SIGKILL')
  await Promise.race([instance.exited, sleep(5_000, undefined, { ref: false })])
}

function json<T> (answer: Answer): T {
  return JSON.parse(answer.text) as T
}

describe('three instances behind nginx on one PostgreSQL and one Redis', { skip, timeout: 120_000 }, () => {
  const schema = `gh_scale_${randomBytes(6).toString('hex')}`
  const instances: Instance[] = []
  let dir: string | undefined
  let nginx: Nginx | undefined
  let gate = ''
  let failTimeoutMs = 0
  let readyMs = 0
  /** Which instance answered, from the `X-Upstream` header ($upstream_addr) the test's nginx adds: one entry per instance tried. */
  let upstreamsOf: (answer: Answer) => string[] = () => []
  const byName = (name: string): Instance => instances.find(i => i.name === name)!

  before(async () => {
    const ports = [await freePort(), await freePort(), await freePort()]
    // All three at once on an empty schema, as a deployment's instances start.
    for (const [i, name] of ['A', 'B', 'C'].entries()) instances.push(startInstance(name, ports[i]!, schema))
    const started = Date.now()
    await Promise.all(instances.map(instance => waitReady(instance, started + 45_000)))
    readyMs = Date.now() - started

    dir = await mkdtemp(join(tmpdir(), 'gatehouse-scale-out-'))
    const port = await freePort()
    gate = `http://127.0.0.1:${port}`
    const upstream = upstreamFor(ports)
    failTimeoutMs = upstream.failTimeoutMs
    await writeFile(join(dir, 'nginx.conf'), nginxConf(dir, `${upstream.conf.replace(/^/gm, '  ')}
  server {
    listen 127.0.0.1:${port};
    server_name localhost;
    add_header X-Upstream $upstream_addr always;
${documented('location')}
  }`))
    nginx = await startNginx(dir, gate)
    const names = new Map(instances.map(i => [`127.0.0.1:${i.port}`, i.name]))
    upstreamsOf = (answer) => String(answer.headers['x-upstream'] ?? '').split(/,\s*|\s+:\s+/).filter(a => a !== '')
      .map(a => names.get(a) ?? `unknown ${a}`)
  })

  after(async () => {
    await Promise.all(instances.map(kill))
    if (nginx !== undefined) await stopNginx(nginx)
    agent.destroy()
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
    await dropSchema(DATABASE_URL!, schema)
  })

  async function createUser (from: string, username: string, password?: string): Promise<{ id: string, username: string }> {
    const res = await call(gate, '/auth/api/users', { from, method: 'POST', headers: ADMIN, json: { username, ...(password !== undefined ? { password } : {}) } })
    assert.equal(res.status, 201, res.text)
    return json(res)
  }

  async function loginFailures (from: string, userId: string): Promise<Array<{ data: { reason: string } }>> {
    const res = await call(gate, `/auth/api/events?type=user.login_failed&target_id=${userId}`, { from, headers: ADMIN })
    assert.equal(res.status, 200, res.text)
    return json(res)
  }

  it('verifies on one instance a session started on another, and ends it everywhere by a sign-out on a third', async (t) => {
    t.diagnostic(`the three instances were ready ${readyMs} ms after they were started`)
    const from = newAddress()
    const user = await createUser(from, `so_session_${randomBytes(3).toString('hex')}`, GOOD_PASSWORD)
    const [a, b, c] = [byName('A'), byName('B'), byName('C')]

    const login = await call(a.base, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(login.status, 200, login.text)
    const bearer = { authorization: `Bearer ${json<{ token: string }>(login).token}` }

    for (const instance of [b, c, a]) {
      const verify = await call(instance.base, '/auth/api/verify', { from, headers: bearer })
      assert.equal(verify.status, 200, `verify on ${instance.name}: ${verify.text}`)
      assert.equal(verify.headers['x-auth-username'], user.username, `verify on ${instance.name}`)
      assert.equal(verify.headers['x-auth-user-id'], user.id, `verify on ${instance.name}`)
    }
    const seen = new Set<string>()
    for (let i = 0; i < 3; i++) {
      const verify = await call(gate, '/auth/api/verify', { from, headers: bearer })
      assert.equal(verify.status, 200, verify.text)
      assert.equal(verify.headers['x-auth-username'], user.username)
      for (const name of upstreamsOf(verify)) seen.add(name)
    }
    assert.deepEqual([...seen].sort(), ['A', 'B', 'C'], 'nginx spread three requests over the three instances')

    const logout = await call(c.base, '/auth/api/logout', { from, method: 'POST', headers: bearer })
    assert.equal(logout.status, 204, logout.text)
    // The other instances hear of the sign-out by PostgreSQL's NOTIFY on commit, which
    // can land a moment after the 204 on a busy machine: each is asked until it answers 401,
    // within a deadline well inside the credential cache's TTL (5 s), so only the notice,
    // never an entry's expiry, can make this pass.
    for (const instance of [a, b, c]) {
      const deadline = Date.now() + 2_500
      let verify = await call(instance.base, '/auth/api/verify', { from, headers: bearer })
      while (verify.status === 200 && Date.now() < deadline) {
        await sleep(25)
        verify = await call(instance.base, '/auth/api/verify', { from, headers: bearer })
      }
      assert.equal(verify.status, 401, `verify on ${instance.name} after sign-out: ${verify.text}`)
    }
    for (let i = 0; i < 3; i++) {
      assert.equal((await call(gate, '/auth/api/verify', { from, headers: bearer })).status, 401, 'through nginx after sign-out')
    }
  })

  it('shares the sign-in budget of one account and address: a budget of N allows N checks over all three instances', async () => {
    const setup = newAddress()
    const user = await createUser(setup, `so_budget_${randomBytes(3).toString('hex')}`, GOOD_PASSWORD)
    const from = newAddress()

    // Through nginx, which takes the instances in turn; nginx passes on the client's address in X-Forwarded-For.
    const answeredBy = new Set<string>()
    for (let i = 0; i < ACCOUNT_BUDGET; i++) {
      const res = await call(gate, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password: WRONG } })
      assert.equal(res.status, 401, `guess ${i + 1} of a budget of ${ACCOUNT_BUDGET}: ${res.text}`)
      for (const name of upstreamsOf(res)) answeredBy.add(name)
    }
    assert.equal(answeredBy.size, Math.min(3, ACCOUNT_BUDGET), 'the guesses were spread over the instances')
    for (const password of [WRONG, GOOD_PASSWORD]) {
      const res = await call(gate, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password } })
      assert.equal(res.status, 429, `the attempt after the budget, ${password === WRONG ? 'wrong' : 'right'} password: ${res.text}`)
      assert.equal(json<{ code: string }>(res).code, 'rate_limited')
    }
    // Every instance knows, also when asked directly from the same address.
    for (const instance of instances) {
      const res = await call(instance.base, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
      assert.equal(res.status, 429, `${instance.name}, directly: ${res.text}`)
    }
    const checked = await loginFailures(setup, user.id)
    assert.equal(checked.length, ACCOUNT_BUDGET, 'exactly the budget\'s worth of passwords was checked; throttled attempts check none')

    // Another address has a budget of its own.
    const other = await call(gate, '/auth/api/login', { from: newAddress(), method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(other.status, 200, other.text)
  })

  it('takes the budget atomically across instances: a concurrent burst of guesses through nginx gets exactly N checks', async () => {
    const setup = newAddress()
    const user = await createUser(setup, `so_burst_${randomBytes(3).toString('hex')}`, GOOD_PASSWORD)
    const from = newAddress()
    const burst = await Promise.all(Array.from({ length: 5 * ACCOUNT_BUDGET }, async () =>
      await call(gate, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password: WRONG } })))
    const statuses = burst.map(res => res.status)
    assert.deepEqual(new Set(burst.flatMap(upstreamsOf)), new Set(['A', 'B', 'C']), 'the burst reached all three instances')
    assert.equal(statuses.filter(s => s === 401).length, ACCOUNT_BUDGET, statuses.join(','))
    assert.equal(statuses.filter(s => s === 429).length, burst.length - ACCOUNT_BUDGET, statuses.join(','))
    assert.equal((await loginFailures(setup, user.id)).length, ACCOUNT_BUDGET, 'exactly the budget\'s worth of passwords was checked')
  })

  it('locks an account at exactly the threshold of wrong passwords counted over all instances, and lets its known clients in on every instance', async () => {
    const setup = newAddress()
    const user = await createUser(setup, `so_lock_${randomBytes(3).toString('hex')}`, GOOD_PASSWORD)
    const [a, b, c] = [byName('A'), byName('B'), byName('C')]
    const locks = async (): Promise<Array<{ data: { failed_logins: number } }>> => {
      const res = await call(gate, `/auth/api/events?type=user.locked&target_id=${user.id}`, { from: setup, headers: ADMIN })
      assert.equal(res.status, 200, res.text)
      return json(res)
    }

    // The owner signs in once, on A: this address and this browser's device cookie are now known clients of the account.
    const home = newAddress()
    const first = await call(a.base, '/auth/api/login', { from: home, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(first.status, 200, first.text)
    const device = (first.headers['set-cookie'] ?? []).map(cookie => cookie.split(';')[0]!).find(cookie => cookie.startsWith('gatehouse_device='))
    assert.ok(device !== undefined, `a device cookie: ${JSON.stringify(first.headers['set-cookie'])}`)

    // Strangers guess, from as many addresses as the per-address budget requires, through nginx's rotation.
    const answeredBy = new Set<string>()
    let guesses = 0
    while (guesses < LOCK_THRESHOLD) {
      const from = newAddress()
      for (let i = 0; i < ACCOUNT_BUDGET && guesses < LOCK_THRESHOLD; i++, guesses++) {
        if (guesses === LOCK_THRESHOLD - 1) assert.deepEqual(await locks(), [], `not locked after ${guesses} wrong passwords`)
        const res = await call(gate, '/auth/api/login', { from, method: 'POST', json: { username: user.username, password: WRONG } })
        assert.equal(res.status, 401, `wrong password ${guesses + 1}: ${res.text}`)
        for (const name of upstreamsOf(res)) answeredBy.add(name)
      }
    }
    assert.deepEqual([...answeredBy].sort(), ['A', 'B', 'C'], 'the wrong passwords were spread over the three instances')
    const locked = await locks()
    assert.equal(locked.length, 1, JSON.stringify(locked))
    assert.equal(locked[0]!.data.failed_logins, LOCK_THRESHOLD)

    // The lock refuses even the right password to a new client, on every instance.
    const stranger = newAddress()
    for (const instance of instances) {
      const res = await call(instance.base, '/auth/api/login', { from: stranger, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
      assert.equal(res.status, 401, `${instance.name}, right password from a new client while locked: ${res.text}`)
    }
    // Known clients are known to every instance: the address on B, the device cookie (from a new address) on C.
    const fromHome = await call(b.base, '/auth/api/login', { from: home, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(fromHome.status, 200, `B, the address that signed in on A: ${fromHome.text}`)
    const withDevice = await call(c.base, '/auth/api/login', { from: newAddress(), method: 'POST', headers: { cookie: device }, json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(withDevice.status, 200, `C, the device cookie A set: ${withDevice.text}`)
    // Their getting in does not lift the lock for strangers.
    const still = await call(gate, '/auth/api/login', { from: stranger, method: 'POST', json: { username: user.username, password: GOOD_PASSWORD } })
    assert.equal(still.status, 401, still.text)

    const reasons = (await loginFailures(setup, user.id)).map(e => e.data.reason).sort()
    assert.deepEqual(reasons, [...Array(instances.length + 1).fill('locked'), ...Array(LOCK_THRESHOLD).fill('wrong_password')])
    const signIns = await call(gate, `/auth/api/events?type=user.login_succeeded&target_id=${user.id}`, { from: setup, headers: ADMIN })
    assert.equal(signIns.status, 200, signIns.text)
    assert.deepEqual(json<Array<{ data: { while_locked?: boolean } }>>(signIns).map(e => e.data.while_locked === true).sort(), [false, true, true])
  })

  it('loses no acknowledged write when an instance is killed under load, and acknowledges none twice', async (t) => {
    const from = newAddress()
    const victim = byName('C')
    const survivors = instances.filter(i => i !== victim)
    const prefix = `so_load_${randomBytes(3).toString('hex')}_`
    interface Create { username: string, status: number, upstreams: string[], id?: string, error?: string }
    const creates: Create[] = []
    const reads: Array<{ id: string, status: number, upstreams: string[], username?: string }> = []
    let next = 0
    let acked = 0
    let killedAfter: number | undefined
    const started = Date.now()

    const worker = async (): Promise<void> => {
      while (next < LOAD.creates) {
        const username = `${prefix}${next++}`
        let res: Answer
        try {
          res = await call(gate, '/auth/api/users', { from, method: 'POST', headers: ADMIN, json: { username } })
        } catch (error) {
          creates.push({ username, status: 0, upstreams: [], error: String(error) })
          continue
        }
        const create: Create = { username, status: res.status, upstreams: upstreamsOf(res) }
        creates.push(create)
        if (res.status !== 201) continue
        create.id = json<{ id: string }>(res).id
        acked += 1
        if (acked === LOAD.killAfterAcks) {
          killedAfter = acked
          victim.proc.kill('SIGKILL')
        }
        // Read back at once, through nginx, so reads are in flight on the victim too when it dies.
        const read = await call(gate, `/auth/api/users/${create.id}`, { from, headers: ADMIN })
        reads.push({ id: create.id, status: read.status, upstreams: upstreamsOf(read), ...(read.status === 200 ? { username: json<{ username: string }>(read).username } : {}) })
      }
    }
    await Promise.all(Array.from({ length: LOAD.concurrency }, worker))
    const loadMs = Date.now() - started
    await victim.exited

    assert.equal(killedAfter, LOAD.killAfterAcks, 'the victim was killed midway')
    assert.equal(victim.proc.signalCode, 'SIGKILL')
    const ackedCreates = creates.filter(c => c.status === 201)
    const failed = creates.filter(c => c.status !== 201)
    t.diagnostic(`${creates.length} creates in ${loadMs} ms: ${ackedCreates.length} acknowledged, ${failed.length} failed ` +
      `(${failed.map(f => f.status).join(',') || 'none'}); ${ackedCreates.filter(c => c.upstreams.at(-1) === victim.name).length} acknowledged by the victim before it died`)

    assert.equal(creates.length, LOAD.creates)
    assert.ok(ackedCreates.some(c => c.upstreams.at(-1) === victim.name), 'the victim took part in the load before it died')
    // A POST is not resent once an instance has it (no non_idempotent): it fails, and is never answered twice.
    for (const f of failed) {
      assert.equal(f.status, 502, `only nginx's 502 for a request the victim had when it died: ${JSON.stringify(f)}`)
      assert.equal(f.upstreams.at(-1), victim.name, JSON.stringify(f))
    }
    assert.ok(failed.length <= LOAD.concurrency, `at most one request per client was in flight on the victim: ${failed.length}`)
    // Reads are idempotent: nginx resends them to a survivor, so every one succeeds.
    assert.equal(reads.length, ackedCreates.length)
    for (const read of reads) {
      assert.equal(read.status, 200, JSON.stringify(read))
      assert.equal(read.username, ackedCreates.find(c => c.id === read.id)!.username)
    }

    // Every acknowledged write is in the database, as a survivor reads it directly.
    const survivor = survivors[0]!
    for (const create of ackedCreates) {
      const res = await call(survivor.base, `/auth/api/users/${create.id}`, { from, headers: ADMIN })
      assert.equal(res.status, 200, `${create.username} was acknowledged but is missing: ${res.text}`)
      assert.equal(json<{ username: string }>(res).username, create.username)
    }
    const list = await call(survivors[1]!.base, `/auth/api/users?q=${prefix}`, { from, headers: ADMIN })
    assert.equal(list.status, 200, list.text)
    const stored = json<Array<{ id: string, username: string }>>(list)
    const storedNames = stored.map(u => u.username)
    assert.equal(new Set(storedNames).size, storedNames.length, 'no username is stored twice')
    const storedIds = new Map(stored.map(u => [u.username, u.id]))
    for (const create of ackedCreates) assert.equal(storedIds.get(create.username), create.id, `${create.username} is stored once, as acknowledged`)
    // A failed create may still have been committed just before the victim died; nothing else is stored.
    const unacknowledged = storedNames.filter(name => !ackedCreates.some(c => c.username === name))
    assert.ok(unacknowledged.every(name => failed.some(f => f.username === name)), `stored but never requested or acknowledged: ${unacknowledged.join(', ')}`)
    t.diagnostic(`${stored.length} stored: ${unacknowledged.length} of the ${failed.length} failed creates were committed before the victim died`)
  })

  it('keeps answering through nginx on the survivors, which no longer sends requests to the dead instance', async () => {
    const victim = byName('C')
    assert.equal(alive(victim), false, 'the previous test killed C')
    const from = newAddress()
    const prefix = `so_after_${randomBytes(3).toString('hex')}_`
    const started = Date.now()
    let triedVictim = 0
    let lastId: string | undefined
    for (let i = 0; i < SURVIVOR_REQUESTS; i++) {
      const res = i % 2 === 0 || lastId === undefined
        ? await call(gate, '/auth/api/users', { from, method: 'POST', headers: ADMIN, json: { username: `${prefix}${i}` } })
        : await call(gate, `/auth/api/users/${lastId}`, { from, headers: ADMIN })
      assert.ok(res.status === 200 || res.status === 201, `request ${i + 1}: ${res.status} ${res.text}`)
      if (res.status === 201) lastId = json<{ id: string }>(res).id
      const upstreams = upstreamsOf(res)
      assert.notEqual(upstreams.at(-1), victim.name, `request ${i + 1} was answered by a survivor`)
      if (upstreams.includes(victim.name)) triedVictim += 1
    }
    // max_fails=1: one failure takes the instance out for fail_timeout; nginx then tries it once more.
    const windows = 1 + Math.floor((Date.now() - started) / failTimeoutMs)
    assert.ok(triedVictim <= windows, `nginx tried the dead instance ${triedVictim} times in ${windows} fail_timeout window(s)`)
    const log = await readFile(join(dir!, 'error.log'), 'utf8')
    assert.match(log, new RegExp(`upstream server temporarily disabled[^\\n]*upstream: "http://127\\.0\\.0\\.1:${victim.port}/`),
      `nginx marked the dead instance:\n${await errorLog(dir!)}`)
    for (const survivor of instances.filter(i => i !== victim)) {
      const ready = await call(survivor.base, '/auth/readyz', { from })
      assert.equal(ready.status, 200, `${survivor.name}: ${ready.text}`)
    }
  })
})
