/**
 * Sign-in and verify throughput of the real server. Starts gatehouse as a
 * child process on 127.0.0.1 (SQLite in a temporary directory, default
 * settings but one), creates one user through the API, then measures with autocannon:
 *
 *   login   POST /auth/api/login with the right password (one argon2id verify each)
 *   verify  GET /auth/api/verify with the session cookie (what nginx asks on every UI request)
 *
 * The one setting changed: the general request limit (RATE_LIMIT_PER_CREDENTIAL,
 * RATE_LIMIT_PER_ADDRESS) is raised to 1e9 a minute. At its defaults it answers
 * 429 to one load generator long before sign-in or verify is the limit; raised,
 * its bookkeeping still runs on every request. Sign-in throttling
 * (LOGIN_MAX_FAILURES_*) stays at its defaults: every sign-in here succeeds.
 *
 * Prints a table and writes bench/results/sign-in-<timestamp>.json. See bench/README.md.
 *
 *   npm run bench:sign-in
 *   BENCH_DURATION=30 npm run bench:sign-in
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { availableParallelism, cpus, tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import autocannon from 'autocannon'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const RESULTS_DIR = join(ROOT, 'bench', 'results')
const HOST = '127.0.0.1'
const BASE_PATH = '/auth'
const SESSION_COOKIE = 'gatehouse_session'
const READY_TIMEOUT_MS = 60_000
/** Requests a minute for the general request limit: never reached (see the header). */
const RAISED_RATE_LIMIT = 1_000_000_000
/** Other processes busier than this (in cores) during a measurement make the run noisy; the table says so. */
const NOISY_OTHER_CPU = 0.1

function envInt (name: string, fallback: number): number {
  const value = process.env[name]
  if (value === undefined || value === '') return fallback
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new Error(`${name} must be a positive whole number, got "${value}"`)
  return Number(value)
}

const settings = {
  durationS: envInt('BENCH_DURATION', 10),
  warmupS: envInt('BENCH_WARMUP', 2),
  loginConnections: envInt('BENCH_LOGIN_CONNECTIONS', 10),
  verifyConnections: envInt('BENCH_VERIFY_CONNECTIONS', 50),
  keepTmp: /^(1|true|yes|on)$/i.test(process.env.BENCH_KEEP_TMP ?? '')
}

/**
 * The only variables the server inherits from this shell: what a process needs to run. Everything else
 * (LOG_LEVEL, DATABASE_URL, LOGIN_MAX_FAILURES_*, NODE_OPTIONS, …) stays out, so the server under test
 * runs with its defaults plus the few settings given below.
 */
const INHERITED_ENV = ['PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_ALL', 'TZ', 'SYSTEMROOT']

function childEnv (extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const name of INHERITED_ENV) if (process.env[name] !== undefined) env[name] = process.env[name]
  return { ...env, ...extra }
}

// ---------------------------------------------------------------- the child and clean-up

interface Child { proc: ChildProcess, exited: Promise<void>, stdoutPath: string, stderrPath: string }

let child: Child | undefined
let tmpDir: string | undefined
let cannon: autocannon.Instance | undefined
let stopping = false
let cleanedUp: Promise<void> | undefined

function log (line: string): void {
  process.stderr.write(`[bench] ${line}\n`)
}

function isRunning (c: Child): boolean {
  return c.proc.exitCode === null && c.proc.signalCode === null
}

function tail (path: string, lines = 20): string {
  try {
    return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return '(no output)'
  }
}

/** `node --import tsx src/server.ts`, its stdout and stderr going to files in the temporary directory. */
function startGatehouse (env: NodeJS.ProcessEnv): Child {
  const stdoutPath = join(tmpDir!, 'gatehouse.stdout.log')
  const stderrPath = join(tmpDir!, 'gatehouse.stderr.log')
  const out = openSync(stdoutPath, 'w')
  const err = openSync(stderrPath, 'w')
  const proc = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], { cwd: ROOT, env, stdio: ['ignore', out, err] })
  closeSync(out)
  closeSync(err)
  const exited = new Promise<void>(resolve => {
    proc.once('exit', () => resolve())
    proc.once('error', () => resolve())
  })
  return { proc, exited, stdoutPath, stderrPath }
}

async function stopGatehouse (c: Child): Promise<void> {
  if (!isRunning(c)) return
  c.proc.kill('SIGTERM')
  if (await Promise.race([c.exited.then(() => 'exited'), sleep(10_000, 'timeout', { ref: false })]) === 'timeout') {
    log('gatehouse did not stop within 10 s of SIGTERM; killing it')
    c.proc.kill('SIGKILL')
    await c.exited
  }
}

async function cleanUp (): Promise<void> {
  cleanedUp ??= (async () => {
    stopping = true
    cannon?.stop()
    if (child !== undefined) await stopGatehouse(child)
    if (tmpDir !== undefined) {
      if (settings.keepTmp) log(`kept ${tmpDir} (BENCH_KEEP_TMP)`)
      else rmSync(tmpDir, { recursive: true, force: true })
    }
  })()
  await cleanedUp
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping`)
    cleanUp().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143))
  })
}

// Last resort if something exits the process without going through cleanUp.
process.once('exit', () => {
  if (child !== undefined && isRunning(child)) child.proc.kill('SIGKILL')
  if (tmpDir !== undefined && !settings.keepTmp) rmSync(tmpDir, { recursive: true, force: true })
})

// ---------------------------------------------------------------- helpers

async function freePort (): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, HOST, () => {
      const address = server.address()
      server.close(() => typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port')))
    })
  })
}

async function waitReady (c: Child, url: string): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS
  while (Date.now() < deadline) {
    if (!isRunning(c)) throw new Error(`gatehouse exited before it was ready:\n${tail(c.stderrPath)}\n${tail(c.stdoutPath)}`)
    try {
      const res = await fetch(url)
      await res.arrayBuffer()
      if (res.ok) return
    } catch {
      // not listening yet
    }
    await sleep(100)
  }
  throw new Error(`gatehouse did not answer ${url} within ${READY_TIMEOUT_MS / 1000} s`)
}

async function expectStatus (res: Response, status: number, what: string): Promise<string> {
  const body = await res.text()
  if (res.status !== status) throw new Error(`${what} answered ${res.status}, expected ${status}: ${body.slice(0, 500)}`)
  return body
}

const CLOCK_TICKS = ((): number => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
  } catch {
    return 100
  }
})()

/** CPU seconds (user + system) a process has used so far, from /proc; undefined where there is no /proc. */
function cpuSecondsOf (pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined
  try {
    // Fields after the command name (which may contain spaces): utime and stime are the 12th and 13th.
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ').at(-1)!.split(' ')
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS
  } catch {
    return undefined
  }
}

/** Busy CPU seconds of the whole machine so far (all cores), from /proc/stat; undefined where there is no /proc. */
function machineBusySeconds (): number | undefined {
  try {
    const [, ...ticks] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).map(Number)
    // user nice system idle iowait irq softirq steal (guest time is already inside user)
    const busy = ticks.slice(0, 8).reduce((sum, t, i) => i === 3 || i === 4 ? sum : sum + t, 0)
    return busy / CLOCK_TICKS
  } catch {
    return undefined
  }
}

async function runCannon (options: autocannon.Options): Promise<autocannon.Result> {
  return await new Promise((resolve, reject) => {
    cannon = autocannon(options, (err, result) => {
      cannon = undefined
      if (err !== null && err !== undefined) reject(err instanceof Error ? err : new Error(String(err)))
      else resolve(result)
    })
  })
}

interface Measurement {
  request: string
  connections: number
  durationS: number
  warmupRequests: number
  requests: number
  reqPerSec: { average: number, stddev: number, min: number, max: number }
  latencyMs: { average: number, p50: number, p90: number, p99: number, max: number }
  /** Cores the server used during the measured run, and its CPU time per response. */
  serverCpu: { cores: number, usPerRequest: number } | null
  /** The same for this process, which runs autocannon. */
  loadGeneratorCpu: { cores: number }
  /** Busy cores of the whole machine minus the server and this process: other work competing for the CPU. */
  otherCpu: { cores: number } | null
  /** Responses by status class; the run is valid only when all are 2xx. */
  statusCodes: Record<string, number>
  non2xx: number
  errors: number
  timeouts: number
}

async function measure (name: string, request: string, options: autocannon.Options & { connections: number }): Promise<Measurement> {
  log(`${name}: warm-up ${settings.warmupS} s`)
  const warm = await runCannon({ ...options, duration: settings.warmupS })
  if (stopping) throw new Error('interrupted')
  if (warm.non2xx > 0 || warm.errors > 0) log(`${name}: warm-up had ${warm.non2xx} non-2xx and ${warm.errors} errors`)
  log(`${name}: measuring ${settings.durationS} s with ${options.connections} connections`)
  const serverBefore = cpuSecondsOf(child!.proc.pid)
  const machineBefore = machineBusySeconds()
  const ownBefore = process.cpuUsage()
  const r = await runCannon({ ...options, duration: settings.durationS })
  const own = process.cpuUsage(ownBefore)
  const machineAfter = machineBusySeconds()
  const serverAfter = cpuSecondsOf(child!.proc.pid)
  if (stopping) throw new Error('interrupted')
  const serverS = serverBefore !== undefined && serverAfter !== undefined ? serverAfter - serverBefore : undefined
  const ownS = (own.user + own.system) / 1e6
  const otherS = serverS !== undefined && machineBefore !== undefined && machineAfter !== undefined
    ? Math.max(0, machineAfter - machineBefore - serverS - ownS)
    : undefined
  return {
    request,
    connections: options.connections,
    durationS: r.duration,
    warmupRequests: warm.requests.total,
    requests: r.requests.total,
    reqPerSec: { average: r.requests.average, stddev: r.requests.stddev, min: r.requests.min, max: r.requests.max },
    latencyMs: { average: r.latency.average, p50: r.latency.p50, p90: r.latency.p90, p99: r.latency.p99, max: r.latency.max },
    serverCpu: serverS === undefined ? null : { cores: serverS / r.duration, usPerRequest: serverS * 1e6 / Math.max(1, r.requests.total) },
    loadGeneratorCpu: { cores: ownS / r.duration },
    otherCpu: otherS === undefined ? null : { cores: otherS / r.duration },
    statusCodes: { '1xx': r['1xx'], '2xx': r['2xx'], '3xx': r['3xx'], '4xx': r['4xx'], '5xx': r['5xx'] },
    non2xx: r.non2xx,
    errors: r.errors,
    timeouts: r.timeouts
  }
}

function fmt (n: number, digits = 0): string {
  return n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })
}

function printTable (rows: Array<[string, Measurement]>): void {
  const header = ['target', 'conns', 'req/s (avg)', 'p50 ms', 'p99 ms', 'requests', 'non-2xx', 'errors', 'server CPU', 'CPU µs/req', 'autocannon CPU', 'other CPU']
  const body = rows.map(([name, m]) => [
    name, String(m.connections), fmt(m.reqPerSec.average, 1), fmt(m.latencyMs.p50, 2), fmt(m.latencyMs.p99, 2), fmt(m.requests),
    String(m.non2xx), String(m.errors + m.timeouts),
    m.serverCpu === null ? 'n/a' : `${fmt(m.serverCpu.cores * 100)}%`,
    m.serverCpu === null ? 'n/a' : fmt(m.serverCpu.usPerRequest, 1),
    `${fmt(m.loadGeneratorCpu.cores * 100)}%`,
    m.otherCpu === null ? 'n/a' : `${fmt(m.otherCpu.cores * 100)}%`
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...body.map(r => r[i]!.length)))
  const line = (cells: string[]): string => cells.map((c, i) => i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)).join('  ')
  const busy = rows.filter(([, m]) => (m.otherCpu?.cores ?? 0) > NOISY_OTHER_CPU).map(([name, m]) => `${fmt(m.otherCpu!.cores * 100)}% (during ${name})`)
  const out = [
    '',
    `gatehouse defaults (SQLite, LOG_LEVEL info) but RATE_LIMIT_PER_* ${fmt(RAISED_RATE_LIMIT)}/min; ${settings.warmupS} s warm-up + ${settings.durationS} s per target; node ${process.version}, ${availableParallelism()} CPUs`,
    ...rows.map(([name, m]) => `  ${name.padEnd(widths[0]!)}  ${m.request}`),
    '',
    line(header),
    line(widths.map(w => '-'.repeat(w))),
    ...body.map(line),
    ...(busy.length > 0 ? ['', `WARNING: other processes used ${busy.join(', ')} of the CPU while measuring; these numbers are disturbed.`] : []),
    ''
  ]
  process.stdout.write(out.join('\n') + '\n')
}

function gitInfo (): { commit: string | null, srcDirty: boolean | null } {
  try {
    const git = (...args: string[]): string => execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    return { commit: git('rev-parse', 'HEAD').trim(), srcDirty: git('status', '--porcelain', '--', 'src').trim() !== '' }
  } catch {
    return { commit: null, srcDirty: null }
  }
}

// ---------------------------------------------------------------- the run

async function main (): Promise<void> {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  tmpDir = mkdtempSync(join(tmpdir(), 'gatehouse-bench-sign-in-'))
  log(`temp dir ${tmpDir}`)

  // 1. The real server, configured only as an operator would: a fresh SQLite file and an admin key.
  const port = await freePort()
  const adminKey = randomBytes(32).toString('hex')
  child = startGatehouse(childEnv({
    HOST,
    PORT: String(port),
    DATABASE_URL: `sqlite:${join(tmpDir, 'bench.db')}`,
    GATEHOUSE_ADMIN_API_KEY: adminKey,
    RATE_LIMIT_PER_CREDENTIAL: String(RAISED_RATE_LIMIT),
    RATE_LIMIT_PER_ADDRESS: String(RAISED_RATE_LIMIT)
  }))
  const base = `http://${HOST}:${port}${BASE_PATH}`
  await waitReady(child, `${base}/readyz`)
  log(`gatehouse ready on ${base} (pid ${child.proc.pid})`)

  // 2. One user, through the API.
  const username = 'bench.sign-in'
  const password = `Bench-${randomBytes(18).toString('base64url')}`
  const created = JSON.parse(await expectStatus(await fetch(`${base}/api/users`, {
    method: 'POST',
    headers: { 'x-api-key': adminKey, 'content-type': 'application/json' },
    body: JSON.stringify({ username, password })
  }), 201, 'POST /api/users')) as { id: string }

  // 3. Check both requests by hand before loading them.
  const loginBody = JSON.stringify({ username, password })
  const signedIn = await fetch(`${base}/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: loginBody })
  const session = JSON.parse(await expectStatus(signedIn, 200, 'POST /api/login')) as { token?: unknown }
  if (typeof session.token !== 'string') throw new Error('POST /api/login returned no token')
  if (!signedIn.headers.getSetCookie().some(c => c.startsWith(`${SESSION_COOKIE}=${session.token as string};`))) {
    throw new Error(`POST /api/login set no ${SESSION_COOKIE} cookie with the token`)
  }
  const cookie = `${SESSION_COOKIE}=${session.token}`
  const verified = await fetch(`${base}/api/verify`, { headers: { cookie } })
  await expectStatus(verified, 200, 'GET /api/verify')
  if (verified.headers.get('x-auth-username') !== username || verified.headers.get('x-auth-user-id') !== created.id) {
    throw new Error(`GET /api/verify named ${String(verified.headers.get('x-auth-username'))} (${String(verified.headers.get('x-auth-user-id'))}), not ${username} (${created.id})`)
  }

  // 4. Load, one target at a time.
  const login = await measure('login', `POST ${BASE_PATH}/api/login {username, password} (right password)`, {
    url: `${base}/api/login`,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: loginBody,
    connections: settings.loginConnections
  })
  const verify = await measure('verify', `GET ${BASE_PATH}/api/verify with the session cookie`, {
    url: `${base}/api/verify`,
    headers: { cookie },
    connections: settings.verifyConnections
  })

  // 5. Report.
  printTable([['login', login], ['verify', verify]])
  const valid = [login, verify].every(m => m.non2xx === 0 && m.errors === 0 && m.timeouts === 0)
  const report = {
    benchmark: 'sign-in',
    startedAt: stamp,
    valid,
    /** False when other processes competed for the CPU (see otherCpu): compare such runs with care. */
    quiet: [login, verify].every(m => (m.otherCpu?.cores ?? 0) <= NOISY_OTHER_CPU),
    settings: { ...settings, rateLimitPerMinute: RAISED_RATE_LIMIT },
    machine: { node: process.version, platform: `${process.platform} ${process.arch}`, cpus: availableParallelism(), cpuModel: cpus()[0]?.model ?? null },
    git: gitInfo(),
    login,
    verify
  }
  mkdirSync(RESULTS_DIR, { recursive: true })
  const file = join(RESULTS_DIR, `sign-in-${stamp}.json`)
  writeFileSync(file, JSON.stringify(report, null, 2) + '\n')
  log(`results written to ${file}`)

  await cleanUp()
  if (!valid) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see statusCodes in the JSON)')
    process.exitCode = 1
  }
}

try {
  await main()
} catch (error) {
  if (!stopping) log(`failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}`)
  if (!stopping && child !== undefined && !isRunning(child)) log(`gatehouse stderr:\n${tail(child.stderrPath)}`)
  await cleanUp()
  process.exitCode = 1
}
