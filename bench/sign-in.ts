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
import { randomBytes } from 'node:crypto'
import { availableParallelism } from 'node:os'
import { join } from 'node:path'
import {
  busyDuring, childEnv, cleanUp, envFlag, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, isQuiet,
  log, machineInfo, makeTmpDir, measureLoad, runBench, startChild, waitReady, writeResults, type Child, type LoadCpu, type LoadSummary
} from './harness.ts'
import type autocannon from 'autocannon'

const BASE_PATH = '/auth'
const SESSION_COOKIE = 'gatehouse_session'
/** Requests a minute for the general request limit: never reached (see the header). */
const RAISED_RATE_LIMIT = 1_000_000_000

const settings = {
  durationS: envInt('BENCH_DURATION', 10),
  warmupS: envInt('BENCH_WARMUP', 2),
  loginConnections: envInt('BENCH_LOGIN_CONNECTIONS', 10),
  verifyConnections: envInt('BENCH_VERIFY_CONNECTIONS', 50),
  keepTmp: envFlag('BENCH_KEEP_TMP')
}

installCleanUp({ keepTmp: settings.keepTmp })

let child: Child | undefined

// ---------------------------------------------------------------- helpers

async function expectStatus (res: Response, status: number, what: string): Promise<string> {
  const body = await res.text()
  if (res.status !== status) throw new Error(`${what} answered ${res.status}, expected ${status}: ${body.slice(0, 500)}`)
  return body
}

/** The JSON fields of one target, in this order: what measureLoad reports (see LoadSummary, LoadCpu) plus the request and its status codes. */
interface Measurement extends LoadSummary, LoadCpu {
  request: string
  connections: number
  durationS: number
  /** Responses by status class; the run is valid only when all are 2xx. */
  statusCodes: Record<string, number>
  non2xx: number
  errors: number
  timeouts: number
}

async function measure (name: string, request: string, options: autocannon.Options & { connections: number }): Promise<Measurement> {
  const { result: r, summary, serverCpu, loadGeneratorCpu, otherCpu } = await measureLoad(name, child!, options, settings)
  return {
    request,
    connections: options.connections,
    durationS: r.duration,
    ...summary,
    serverCpu,
    loadGeneratorCpu,
    otherCpu,
    statusCodes: { '1xx': r['1xx'], '2xx': r['2xx'], '3xx': r['3xx'], '4xx': r['4xx'], '5xx': r['5xx'] },
    non2xx: r.non2xx,
    errors: r.errors,
    timeouts: r.timeouts
  }
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
  const { widths, lines } = formatTable(header, body)
  const busy = busyDuring(rows)
  const out = [
    '',
    `gatehouse defaults (SQLite, LOG_LEVEL info) but RATE_LIMIT_PER_* ${fmt(RAISED_RATE_LIMIT)}/min; ${settings.warmupS} s warm-up + ${settings.durationS} s per target; node ${process.version}, ${availableParallelism()} CPUs`,
    ...rows.map(([name, m]) => `  ${name.padEnd(widths[0]!)}  ${m.request}`),
    '',
    ...lines,
    ...(busy.length > 0 ? ['', `WARNING: other processes used ${busy.join(', ')} of the CPU while measuring; these numbers are disturbed.`] : []),
    ''
  ]
  process.stdout.write(out.join('\n') + '\n')
}

// ---------------------------------------------------------------- the run

async function main (): Promise<void> {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const tmpDir = makeTmpDir('gatehouse-bench-sign-in-')
  log(`temp dir ${tmpDir}`)

  // 1. The real server, configured only as an operator would: a fresh SQLite file and an admin key.
  const port = await freePort()
  const adminKey = randomBytes(32).toString('hex')
  child = startChild('gatehouse', 'src/server.ts', childEnv({
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
    quiet: isQuiet([login, verify]),
    settings: { ...settings, rateLimitPerMinute: RAISED_RATE_LIMIT },
    machine: machineInfo(),
    git: gitInfo(),
    login,
    verify
  }
  writeResults('sign-in', stamp, report)

  await cleanUp()
  if (!valid) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see statusCodes in the JSON)')
    process.exitCode = 1
  }
}

await runBench(main)
