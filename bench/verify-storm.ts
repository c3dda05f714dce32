/**
 * `npm run bench:storm` (issue 20, the gate during a sign-in storm): how much
 * of its throughput does `GET /auth/api/verify` with a session cookie keep
 * while password sign-ins run at the argon2id limit, compared with what is
 * physically left beside a bare argon2id loop on the same cores?
 *
 * One run, on the compiled server (dist/server.js; run `node scripts/build.js`
 * first, as `npm run bench:storm` does), SQLite by default, and PostgreSQL too
 * with BENCH_DATABASE_URL:
 *
 *   alone   verify under autocannon, nothing else running;
 *   argon2  verify beside a bare argon2id loop in a separate process, at
 *           gatehouse's default parameters and HASH_CONCURRENCY's default
 *           concurrency (as argon2Limit in issue-rows.ts measures the limit);
 *   storm   verify beside a sign-in storm: a separate process keeps
 *           BENCH_STORM_CONNECTIONS POST /auth/api/login in flight, rotating
 *           over BENCH_STORM_USERS real users with their own passwords, enough
 *           to keep the server's argon2 slots busy all the time.
 *
 * `argon2` and `storm` alternate (argon2, storm, argon2, storm, …:
 * BENCH_ROUNDS pairs) so that drift in the machine's load hits both alike.
 * For each target: verify req/s, p50/p99, the server's CPU (all threads, and
 * its main thread alone: the event loop), the helper process's CPU (the argon2
 * loop's, or the storm client's: the bare loop's requests cost the load
 * generator nothing, the storm's do), sign-ins or hashes per second, and the
 * event loop delay p99 (from /auth/metrics). The row: storm ÷ argon2 req/s
 * (goal ≥ 0.9) and the storm's worst verify p99 (goal < 10 ms).
 *
 * `verifyStormRows` is exported for `npm run bench`'s floors (bench/floors.ts); call it
 * after installCleanUp and makeTmpDir (harness.ts), as list-users.ts does.
 * BENCH_CPU_PROF=1 writes a CPU profile of the server (bench/results/cpu-storm-*).
 * BENCH_SERVER=<path to a server.js> runs another build (an older commit's) instead of dist/server.js.
 * BENCH_HASH_NICE=<0 to 19> starts the server with HASH_NICE (19 by default on Linux: hashing on worker threads below the
 * event loop's priority; 0: on libuv's pool at its priority): compare the row and the sign-ins/s of the values side by side.
 *
 *   npm run bench:storm
 *   BENCH_DURATION=5 BENCH_ROUNDS=1 npm run bench:storm
 *   BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run bench:storm
 */
import { randomBytes } from 'node:crypto'
import { Agent, request } from 'node:http'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { availableParallelism, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { hash } from '@node-rs/argon2'
import { defaultConfig } from '../src/config.ts'
import {
  childEnv, cleanUp, cpuSecondsOf, envFlag, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, log, machineInfo,
  makeTmpDir, measureLoad, RESULTS_DIR, runBench, startChild, stopChild, writeResults, type Child, type IssueRow, type LoadCpu, type LoadSummary
} from './harness.ts'
import { dropSchema, eventLoopP99Ms, postgresReachable, startTimed } from './issue-rows.ts'

const GOAL_RATIO = 0.9
const GOAL_P99_MS = 10
/** The general request limit, raised as in sign-in.ts: one load generator would meet it within seconds; its bookkeeping still runs. */
const RAISED_RATE_LIMIT = '1000000000'

export interface StormSettings {
  durationS: number
  warmupS: number
  rounds: number
  verifyConnections: number
  stormConnections: number
  stormUsers: number
  cpuProfile: boolean
  postgresUrl: string | undefined
  /** The compiled server to run, relative to the repository: another build (an older commit's) to compare with. */
  server: string
  /** HASH_NICE for the server (BENCH_HASH_NICE); undefined: the server's default (config.ts). */
  hashNice: number | undefined
}

/** BENCH_HASH_NICE: 0 (off) to 19, or unset (the server's default); envInt refuses 0. */
function hashNiceSetting (value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined
  if (!/^\d+$/.test(value) || Number(value) > 19) throw new Error(`BENCH_HASH_NICE must be 0 to 19, got "${value}"`)
  return Number(value)
}

export function stormSettings (): StormSettings {
  return {
    durationS: envInt('BENCH_DURATION', 10),
    warmupS: envInt('BENCH_WARMUP', 2),
    rounds: envInt('BENCH_ROUNDS', 2),
    verifyConnections: envInt('BENCH_VERIFY_CONNECTIONS', 20),
    stormConnections: envInt('BENCH_STORM_CONNECTIONS', 8),
    stormUsers: envInt('BENCH_STORM_USERS', 50),
    cpuProfile: envFlag('BENCH_CPU_PROF'),
    postgresUrl: process.env.BENCH_DATABASE_URL,
    server: process.env.BENCH_SERVER ?? 'dist/server.js',
    hashNice: hashNiceSetting(process.env.BENCH_HASH_NICE)
  }
}

// ---------------------------------------------------------------- the helper processes

/** What a helper process (BENCH_STORM_ROLE=argon2 or storm) prints on its last line. */
interface HelperReport { done: number, failed: number, seconds: number, statuses: Record<string, number>, latencyMs?: { p50: number, p99: number } }

/** The p-th percentile (0 to 100) of `values`, sorted in place. */
function percentile (values: number[], p: number): number {
  values.sort((a, b) => a - b)
  return values[Math.min(values.length - 1, Math.floor(values.length * p / 100))] ?? NaN
}

/** A bare argon2id loop at gatehouse's defaults, HASH_CONCURRENCY's default at a time, for BENCH_HELPER_S seconds. */
async function argon2Loop (seconds: number): Promise<HelperReport> {
  const config = defaultConfig()
  const options = { memoryCost: config.argon2MemoryKib, timeCost: config.argon2TimeCost, parallelism: config.argon2Parallelism, algorithm: 2 as const }
  const started = performance.now()
  const end = started + seconds * 1000
  let done = 0
  await Promise.all(Array.from({ length: config.hashConcurrency }, async () => {
    while (performance.now() < end) {
      await hash('correct horse battery staple', options)
      done++
    }
  }))
  return { done, failed: 0, seconds: (performance.now() - started) / 1000, statuses: {} }
}

const keepAlive = new Agent({ keepAlive: true })

/** node:http on kept-alive connections: the storm client's own CPU is part of what the storm costs the machine, so it is kept small. */
async function post (url: string, body: string): Promise<number> {
  return await new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', agent: keepAlive, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, res => {
      res.resume()
      res.once('end', () => resolve(res.statusCode ?? 0))
      res.once('error', reject)
    })
    req.once('error', reject)
    req.end(body)
  })
}

/** Sign-ins, `connections` in flight, each user with their own password, round-robin, for BENCH_HELPER_S seconds. */
async function signInStorm (seconds: number): Promise<HelperReport> {
  const url = process.env.BENCH_LOGIN_URL!
  const users = JSON.parse(readFileSync(process.env.BENCH_USERS_FILE!, 'utf8')) as Array<{ username: string, password: string }>
  const connections = Number(process.env.BENCH_STORM_CONNECTIONS)
  const statuses: Record<string, number> = {}
  const started = performance.now()
  const end = started + seconds * 1000
  let next = 0
  let done = 0
  let failed = 0
  const latencies: number[] = []
  await Promise.all(Array.from({ length: connections }, async () => {
    while (performance.now() < end) {
      const user = users[next++ % users.length]!
      try {
        const sent = performance.now()
        const status = await post(url, JSON.stringify(user))
        statuses[status] = (statuses[status] ?? 0) + 1
        if (status === 200) {
          done++
          latencies.push(performance.now() - sent)
        } else failed++
      } catch {
        failed++
      }
    }
  }))
  return { done, failed, seconds: (performance.now() - started) / 1000, statuses, latencyMs: { p50: percentile(latencies, 50), p99: percentile(latencies, 99) } }
}

/** CPU seconds of one thread of a process (the main thread's id is the pid), from /proc. */
function threadCpuSeconds (pid: number, tid: number): number | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ').at(-1)!.split(' ')
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch {
    return undefined
  }
}

// ---------------------------------------------------------------- one database

type Target = 'alone' | 'argon2' | 'storm'

interface Measurement extends LoadSummary, LoadCpu {
  target: Target
  round: number
  /** The server's main thread (the event loop) alone, per verify response. */
  mainThreadUsPerRequest: number | null
  /** The helper process (argon2 loop or storm client): its CPU in cores, and hashes or successful sign-ins per second. */
  helper: { cores: number | null, perSec: number, failed: number, statuses: Record<string, number>, latencyMs: { p50: number, p99: number } | null } | null
  eventLoopP99Ms: number | null
  non2xx: number
  errors: number
  load: number[]
}

/** The storm with no verify load: what one sign-in costs the server's main thread, and all its threads. */
export interface SignInCost { signInsPerSec: number, latencyMs: { p50: number, p99: number } | null, mainThreadMsPerSignIn: number | null, serverMsPerSignIn: number | null, clientMsPerSignIn: number | null, eventLoopP99Ms: number | null }

export interface EngineResult {
  engine: string
  hashNice: number
  signIns: SignInCost
  measurements: Measurement[]
  ratio: number
  stormP99Ms: number
  signInsPerSec: number
  hashesPerSec: number
  /** The storm rounds' sign-in latency (the storm client's, successful sign-ins): the mean of the rounds' p50, the worst p99. */
  signInLatencyMs: { p50: number, p99: number } | null
}

async function expectOk (res: Response, status: number, what: string): Promise<string> {
  const body = await res.text()
  if (res.status !== status) throw new Error(`${what} answered ${res.status}, expected ${status}: ${body.slice(0, 300)}`)
  return body
}

async function measureEngine (engine: 'sqlite' | 'postgres', settings: StormSettings, dir: string): Promise<EngineResult> {
  const port = await freePort()
  const adminKey = randomBytes(32).toString('hex')
  const schema = `gatehouse_storm_${process.pid}`
  const database: Record<string, string> = engine === 'sqlite'
    ? { DATABASE_URL: `sqlite:${join(dir, 'storm.db')}` }
    : { DATABASE_URL: settings.postgresUrl!, DATABASE_SCHEMA: schema }
  if (engine === 'postgres') await dropSchema(settings.postgresUrl!, schema)
  const profDir = join(RESULTS_DIR, `cpu-storm-${engine}-${new Date().toISOString().replace(/[:.]/g, '-')}`)
  const { child: server } = await startTimed(`gatehouse-storm-${engine}`, childEnv({
    HOST,
    PORT: String(port),
    ...database,
    GATEHOUSE_ADMIN_API_KEY: adminKey,
    RATE_LIMIT_PER_CREDENTIAL: RAISED_RATE_LIMIT,
    RATE_LIMIT_PER_ADDRESS: RAISED_RATE_LIMIT,
    ...(settings.hashNice !== undefined ? { HASH_NICE: String(settings.hashNice) } : {})
  }), `http://${HOST}:${port}`, settings.cpuProfile ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : [], settings.server)
  const origin = `http://${HOST}:${port}`
  const base = `${origin}/auth`
  try {
    // Real users with real passwords, through the API (one argon2id hash each).
    const users = Array.from({ length: settings.stormUsers }, (_, i) => ({ username: `storm.user${i}`, password: `Storm-${randomBytes(12).toString('base64url')}` }))
    for (const user of users) {
      await expectOk(await fetch(`${base}/api/users`, {
        method: 'POST', headers: { 'x-api-key': adminKey, 'content-type': 'application/json' }, body: JSON.stringify(user)
      }), 201, 'POST /api/users')
    }
    const usersFile = join(dir, `storm-users-${engine}.json`)
    writeFileSync(usersFile, JSON.stringify(users))
    const gate = { username: 'storm.gate', password: `Gate-${randomBytes(12).toString('base64url')}` }
    await expectOk(await fetch(`${base}/api/users`, {
      method: 'POST', headers: { 'x-api-key': adminKey, 'content-type': 'application/json' }, body: JSON.stringify(gate)
    }), 201, 'POST /api/users')
    const login = JSON.parse(await expectOk(await fetch(`${base}/api/login`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(gate)
    }), 200, 'POST /api/login')) as { token: string }
    const cookie = `gatehouse_session=${login.token}`
    const verified = await fetch(`${base}/api/verify`, { headers: { cookie } })
    await expectOk(verified, 200, 'GET /api/verify')
    if (verified.headers.get('x-auth-username') !== gate.username) throw new Error('verify named someone else')
    log(`${engine}: ${users.length} users created; gatehouse pid ${server.proc.pid}`)

    const measurements: Measurement[] = []
    const startHelper = async (target: 'argon2' | 'storm', name: string, seconds: number): Promise<Child> => {
      const helper = startChild(name, 'bench/verify-storm.ts', childEnv({
        BENCH_STORM_ROLE: target,
        BENCH_HELPER_S: String(seconds),
        BENCH_LOGIN_URL: `${base}/api/login`,
        BENCH_USERS_FILE: usersFile,
        BENCH_STORM_CONNECTIONS: String(settings.stormConnections)
      }))
      // tsx's start-up and the first hashes happen before the measured window.
      await sleep(1000)
      return helper
    }
    const helperReport = (helper: Child): HelperReport => JSON.parse(readFileSync(helper.stdoutPath, 'utf8').trim().split('\n').at(-1) ?? '{}') as HelperReport

    // The storm alone: the server's CPU per sign-in, split into its main thread and the rest (argon2 on the thread pool).
    const signIns = await (async (): Promise<SignInCost> => {
      const seconds = settings.durationS
      const helper = await startHelper('storm', `signins-${engine}`, seconds + 1)
      await eventLoopP99Ms(origin, adminKey)
      const pid = server.proc.pid!
      const before = { main: threadCpuSeconds(pid, pid), all: cpuSecondsOf(pid), client: cpuSecondsOf(helper.proc.pid) }
      await sleep(seconds * 1000 - 1000)
      const after = { main: threadCpuSeconds(pid, pid), all: cpuSecondsOf(pid), client: cpuSecondsOf(helper.proc.pid) }
      const loopP99 = await eventLoopP99Ms(origin, adminKey)
      await helper.exited
      const report = helperReport(helper)
      const perSec = report.done / report.seconds
      const windowCount = perSec * (seconds - 1)
      const msEach = (a: number | undefined, b: number | undefined): number | null => a === undefined || b === undefined ? null : (b - a) * 1000 / Math.max(1, windowCount)
      return {
        signInsPerSec: perSec,
        latencyMs: report.latencyMs ?? null,
        mainThreadMsPerSignIn: msEach(before.main, after.main),
        serverMsPerSignIn: msEach(before.all, after.all),
        clientMsPerSignIn: msEach(before.client, after.client),
        eventLoopP99Ms: loopP99
      }
    })()
    log(`${engine}: sign-ins alone ${signIns.signInsPerSec.toFixed(1)}/s; ms per sign-in: server main thread ${signIns.mainThreadMsPerSignIn?.toFixed(2)}, ` +
      `server all threads ${signIns.serverMsPerSignIn?.toFixed(2)}, storm client ${signIns.clientMsPerSignIn?.toFixed(2)}`)

    const run = async (target: Target, round: number): Promise<void> => {
      const helper = target === 'alone' ? undefined : await startHelper(target, `${target}-${engine}-${round}`, settings.warmupS + settings.durationS + 2)
      await eventLoopP99Ms(origin, adminKey)
      const mainBefore = threadCpuSeconds(server.proc.pid!, server.proc.pid!)
      const helperBefore = helper !== undefined ? cpuSecondsOf(helper.proc.pid) : undefined
      const load = await measureLoad(`${engine} ${target} ${round}`, server, {
        url: `${base}/api/verify`, headers: { cookie }, connections: settings.verifyConnections
      }, settings)
      // Warm-up and measurement both count here; the per-request figures below use both.
      const helperAfter = helper !== undefined ? cpuSecondsOf(helper.proc.pid) : undefined
      const mainAfter = threadCpuSeconds(server.proc.pid!, server.proc.pid!)
      const loopP99 = await eventLoopP99Ms(origin, adminKey)
      let helperPart: Measurement['helper'] = null
      if (helper !== undefined) {
        await helper.exited
        const report = helperReport(helper)
        const windowS = settings.warmupS + settings.durationS
        helperPart = {
          cores: helperBefore !== undefined && helperAfter !== undefined ? (helperAfter - helperBefore) / windowS : null,
          perSec: report.done / report.seconds,
          failed: report.failed,
          statuses: report.statuses,
          latencyMs: report.latencyMs ?? null
        }
      }
      const totalRequests = load.warm.requests.total + load.result.requests.total
      measurements.push({
        target,
        round,
        ...load.summary,
        serverCpu: load.serverCpu,
        loadGeneratorCpu: load.loadGeneratorCpu,
        otherCpu: load.otherCpu,
        mainThreadUsPerRequest: mainBefore !== undefined && mainAfter !== undefined ? (mainAfter - mainBefore) * 1e6 / Math.max(1, totalRequests) : null,
        helper: helperPart,
        eventLoopP99Ms: loopP99,
        non2xx: load.result.non2xx,
        errors: load.result.errors + load.result.timeouts,
        load: loadavg()
      })
      if (helper !== undefined) await stopChild(helper)
    }

    await run('alone', 0)
    for (let round = 1; round <= settings.rounds; round++) {
      await run('argon2', round)
      await run('storm', round)
    }
    const mean = (target: Target, pick: (m: Measurement) => number): number => {
      const of = measurements.filter(m => m.target === target)
      return of.reduce((sum, m) => sum + pick(m), 0) / of.length
    }
    const ratio = mean('storm', m => m.reqPerSec.average) / mean('argon2', m => m.reqPerSec.average)
    const stormP99Ms = Math.max(...measurements.filter(m => m.target === 'storm').map(m => m.latencyMs.p99))
    const stormLatencies = measurements.flatMap(m => m.target === 'storm' && m.helper?.latencyMs != null ? [m.helper.latencyMs] : [])
    return {
      engine,
      hashNice: settings.hashNice ?? defaultConfig().hashNice,
      signIns,
      measurements,
      ratio,
      stormP99Ms,
      signInsPerSec: mean('storm', m => m.helper?.perSec ?? 0),
      hashesPerSec: mean('argon2', m => m.helper?.perSec ?? 0),
      signInLatencyMs: stormLatencies.length === 0
        ? null
        : { p50: stormLatencies.reduce((sum, l) => sum + l.p50, 0) / stormLatencies.length, p99: Math.max(...stormLatencies.map(l => l.p99)) }
    }
  } finally {
    await stopChild(server)
    if (engine === 'postgres') await dropSchema(settings.postgresUrl!, schema).catch(() => {})
    if (settings.cpuProfile) log(`CPU profile of the ${engine} server in ${profDir}`)
  }
}

function printEngine (r: EngineResult): void {
  const header = ['target', 'req/s', 'p50 ms', 'p99 ms', 'server CPU', 'µs/req', 'main µs/req', 'helper CPU', 'helper /s', 'loop p99 ms', 'autocannon CPU', 'other CPU', 'load 1m']
  const body = r.measurements.map(m => [
    `${m.target}${m.round > 0 ? ` ${m.round}` : ''}`,
    fmt(m.reqPerSec.average), fmt(m.latencyMs.p50, 1), fmt(m.latencyMs.p99, 1),
    m.serverCpu === null ? 'n/a' : `${fmt(m.serverCpu.cores * 100)}%`,
    m.serverCpu === null ? 'n/a' : fmt(m.serverCpu.usPerRequest, 1),
    m.mainThreadUsPerRequest === null ? 'n/a' : fmt(m.mainThreadUsPerRequest, 1),
    m.helper?.cores == null ? '-' : `${fmt(m.helper.cores * 100)}%`,
    m.helper === null ? '-' : fmt(m.helper.perSec, 1) + (m.helper.failed > 0 ? ` (${m.helper.failed} failed)` : ''),
    m.eventLoopP99Ms === null ? 'n/a' : fmt(m.eventLoopP99Ms, 1),
    `${fmt(m.loadGeneratorCpu.cores * 100)}%`,
    m.otherCpu === null ? 'n/a' : `${fmt(m.otherCpu.cores * 100)}%`,
    m.load[0]!.toFixed(2)
  ])
  const { lines } = formatTable(header, body)
  process.stdout.write([
    '',
    `verify during a sign-in storm, ${r.engine}, HASH_NICE=${r.hashNice}${r.hashNice > 0 ? ' (the server hashes at a lower priority than its event loop)' : ''}: helper /s is argon2id hashes/s (argon2) or successful sign-ins/s (storm)`,
    ...lines,
    `sign-ins alone (no verify load): ${r.signIns.signInsPerSec.toFixed(1)}/s; per sign-in ${r.signIns.mainThreadMsPerSignIn?.toFixed(2) ?? 'n/a'} ms on the server's main thread, ` +
      `${r.signIns.serverMsPerSignIn?.toFixed(2) ?? 'n/a'} ms on all its threads, ${r.signIns.clientMsPerSignIn?.toFixed(2) ?? 'n/a'} ms in the storm client; event loop p99 ${r.signIns.eventLoopP99Ms?.toFixed(1) ?? 'n/a'} ms; ` +
      `sign-in latency p50 ${r.signIns.latencyMs?.p50.toFixed(1) ?? 'n/a'} ms, p99 ${r.signIns.latencyMs?.p99.toFixed(1) ?? 'n/a'} ms`,
    `storm ÷ argon2 (mean req/s): ${r.ratio.toFixed(3)} (goal ≥ ${GOAL_RATIO}); worst storm p99 ${r.stormP99Ms.toFixed(1)} ms (goal < ${GOAL_P99_MS} ms); ` +
      `sign-ins/s ${r.signInsPerSec.toFixed(1)} against ${r.hashesPerSec.toFixed(1)} bare hashes/s (${r.hashesPerSec > 0 ? fmt(r.signInsPerSec / r.hashesPerSec * 100, 0) : 'n/a'}%); ` +
      `storm sign-in latency p50 ${r.signInLatencyMs?.p50.toFixed(1) ?? 'n/a'} ms, worst p99 ${r.signInLatencyMs?.p99.toFixed(1) ?? 'n/a'} ms`,
    ''
  ].join('\n') + '\n')
}

export function rowsOf (results: EngineResult[]): IssueRow[] {
  return results.map(r => ({
    work: `/verify while sign-ins run at the argon2id limit (${r.engine}${r.hashNice > 0 ? `, HASH_NICE=${r.hashNice}` : ''})`,
    measured: `p99 ${r.stormP99Ms.toFixed(1)} ms; ${fmt(r.ratio * 100, 0)}% of the req/s beside a bare argon2id loop ` +
      `(${r.ratio.toFixed(2)}; ${fmt(r.signInsPerSec)} sign-ins/s vs ${fmt(r.hashesPerSec)} hashes/s; load ${loadavg()[0]!.toFixed(2)})`,
    goal: `p99 < ${GOAL_P99_MS} ms and ≥ ${GOAL_RATIO}`,
    met: r.stormP99Ms < GOAL_P99_MS && r.ratio >= GOAL_RATIO
  }))
}

/**
 * Issue 20's `/verify` row(s): SQLite, and PostgreSQL when settings.postgresUrl
 * is set and reachable. Prints each engine's table as it goes.
 */
export async function verifyStormRows (settings = stormSettings()): Promise<{ rows: IssueRow[], results: EngineResult[] }> {
  const dir = mkdtempSync(join(tmpdir(), 'gatehouse-storm-'))
  try {
    const results: EngineResult[] = []
    const sqlite = await measureEngine('sqlite', settings, dir)
    printEngine(sqlite)
    results.push(sqlite)
    if (settings.postgresUrl !== undefined) {
      const unreachable = await postgresReachable(settings.postgresUrl)
      if (unreachable !== undefined) {
        log(`PostgreSQL skipped: ${unreachable}`)
      } else {
        const pg = await measureEngine('postgres', settings, dir)
        printEngine(pg)
        results.push(pg)
      }
    }
    return { rows: rowsOf(results), results }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

async function main (): Promise<void> {
  const settings = stormSettings()
  installCleanUp({ keepTmp: envFlag('BENCH_KEEP_TMP') })
  makeTmpDir('gatehouse-bench-storm-')
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  log(`load average ${loadavg().map(n => n.toFixed(2)).join(' ')}; ${availableParallelism()} CPUs; HASH_CONCURRENCY default ${defaultConfig().hashConcurrency}`)
  const { rows, results } = await verifyStormRows(settings)
  const { lines } = formatTable(['issue 20 row', 'this run', 'goal', 'met'], rows.map(r => [r.work, r.measured, r.goal, r.met ? 'yes' : 'NO']))
  process.stdout.write(['', ...lines, `load average at the end: ${loadavg().map(n => n.toFixed(2)).join(' ')}`, ''].join('\n') + '\n')
  writeResults('verify-storm', stamp, { benchmark: 'verify-storm', startedAt: stamp, settings, machine: machineInfo(), git: gitInfo(), rows, results })
  await cleanUp()
  const invalid = results.some(r => r.measurements.some(m => m.non2xx > 0 || m.errors > 0 || (m.helper?.failed ?? 0) > 0))
  if (invalid) {
    log('INVALID RUN: a verify or a sign-in failed under load (see the JSON)')
    process.exitCode = 1
  }
}

const role = process.env.BENCH_STORM_ROLE
if (role === 'argon2' || role === 'storm') {
  const seconds = Number(process.env.BENCH_HELPER_S)
  const report = role === 'argon2' ? await argon2Loop(seconds) : await signInStorm(seconds)
  process.stdout.write(JSON.stringify(report) + '\n')
} else if (process.argv[1]?.endsWith('verify-storm.ts') === true) {
  await runBench(main)
}
