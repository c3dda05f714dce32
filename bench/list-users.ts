/**
 * `npm run bench`: issue 39's floors in one run (bench/floors.ts prints them).
 * Seeds 100,000 users, starts the compiled server and a bare Fastify route
 * that returns the same 50 users from memory (child processes on 127.0.0.1),
 * and measures with autocannon: the cached page beside bare, creates against
 * the argon2id limit, the uncached page in interleaved rounds (SQLite and
 * PostgreSQL), start-up and idle memory; then the storm and search parts.
 * Writes bench/results/list-users-<timestamp>.json. See bench/README.md.
 *
 *   npm run bench
 *   BENCH_PG_URL=off npm run bench
 */
import { closeSync, fsyncSync, openSync, statSync } from 'node:fs'
import type autocannon from 'autocannon'
import { randomBytes } from 'node:crypto'
import { availableParallelism } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { User } from '../src/users/users.schemas.ts'
import { seedRow, seedSqliteUsers, USERS_PATH } from './fixtures.ts'
import {
  benchAppName, backendPids, formatPageRounds, measureFloor, measurePageRounds, measureUncached, pageRatios, pageRoundMeasurements, type PageEngine, type PageRound
} from './uncached-page.ts'
import { floorRows, formatFloors, loadNow, measureParts, type ListFigures, type Parts } from './floors.ts'
import { argon2Limit, BENCH_PASSWORD, dropSchema, eventLoopP99Ms, postgresReachable, rssMiB, seedPostgres, startTimed } from './issue-rows.ts'
import {
  busyDuring, childEnv, cleanUp, envFlag, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, isQuiet,
  log, machineInfo, makeTmpDir, measureLoad, migrateSqliteFile, runBench, RESULTS_DIR, startChild, stopChild, waitReady, writeResults, type Child, type LoadCpu, type LoadSummary
} from './harness.ts'

const PAGE_SIZE = 50
/**
 * The first admin an operator configures: the start-up and memory floors are measured with it (issue 39), and
 * its first start creates that admin (one argon2id hash). The API key is how the bench itself signs in, since a
 * server given these issues no generated key.
 */
const ADMIN_KEY = randomBytes(32).toString('hex')
const ADMIN_ENV = { GATEHOUSE_ADMIN_API_KEY: ADMIN_KEY, GATEHOUSE_ADMIN_USERNAME: 'bench.admin', GATEHOUSE_ADMIN_PASSWORD: BENCH_PASSWORD }
/** Idle RSS is read this long after the spawn. */
const IDLE_AFTER_MS = 5000

const connections = envInt('BENCH_CONNECTIONS', 50)
const settings = {
  durationS: envInt('BENCH_DURATION', 15),
  connections,
  warmupS: envInt('BENCH_WARMUP', 3),
  users: envInt('BENCH_USERS', 100_000),
  pageSize: PAGE_SIZE,
  /** Unset means gatehouse's own default (info). Only for experiments: the ratio that counts is with the default. */
  gatehouseLogLevel: process.env.BENCH_LOG_LEVEL === undefined || process.env.BENCH_LOG_LEVEL === '' ? undefined : process.env.BENCH_LOG_LEVEL,
  cpuProfile: envFlag('BENCH_CPU_PROF'),
  keepTmp: envFlag('BENCH_KEEP_TMP'),
  /** The PostgreSQL half of the run; a schema of its own is created there and dropped at the end. `off` skips it. */
  postgresUrl: process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  createConnections: envInt('BENCH_CREATE_CONNECTIONS', 10),
  /** `uncached`: only the bare route, the cached page and the uncached pages (SQLite and PostgreSQL), for quick comparisons while working on them. */
  only: process.env.BENCH_ONLY === 'uncached' ? 'uncached' as const : undefined,
  /** The uncached pages in rounds (uncached-page.ts, measurePageRounds): how many, and each load's warm-up and measured seconds. */
  pageRounds: envInt('BENCH_PAGE_ROUNDS', 5),
  pageTiming: { warmupS: envInt('BENCH_PAGE_WARMUP', 2), durationS: envInt('BENCH_PAGE_DURATION', 6), connections }
}

installCleanUp({ keepTmp: settings.keepTmp })

// ---------------------------------------------------------------- helpers

const USER_KEYS = Object.keys(User.properties).sort().join(',')

/** One request by hand: 200, a JSON array of `expected` objects shaped exactly like User. */
async function checkList (url: string, headers: Record<string, string>, expected: number): Promise<{ users: Array<Record<string, unknown>>, bodyBytes: number, headers: Headers }> {
  const res = await fetch(url, { headers })
  const body = await res.text()
  if (res.status !== 200) throw new Error(`GET ${url} answered ${res.status}: ${body.slice(0, 500)}`)
  const users = JSON.parse(body) as unknown
  if (!Array.isArray(users) || users.length !== expected) {
    throw new Error(`GET ${url} returned ${Array.isArray(users) ? `${users.length} items` : typeof users}, expected an array of ${expected}`)
  }
  for (const user of users as Array<Record<string, unknown>>) {
    const keys = Object.keys(user).sort().join(',')
    if (keys !== USER_KEYS) throw new Error(`GET ${url}: an item has keys ${keys}, a User has ${USER_KEYS}`)
  }
  return { users, bodyBytes: Buffer.byteLength(body), headers: res.headers }
}

/** The JSON fields of one target, in this order: what measureLoad reports (see LoadSummary, LoadCpu) plus the page and its throughput. */
interface Measurement extends LoadSummary, LoadCpu {
  url: string
  bodyBytes: number
  throughputBytesPerSec: number
  non2xx: number
  errors: number
  timeouts: number
}

async function measure (name: string, child: Child, url: string, headers: Record<string, string>, bodyBytes: number, timing: { warmupS: number, durationS: number } = settings): Promise<Measurement> {
  const { result: r, summary, serverCpu, loadGeneratorCpu, otherCpu } = await measureLoad(name, child, { url, connections: settings.connections, headers }, timing)
  return {
    url,
    bodyBytes,
    ...summary,
    throughputBytesPerSec: r.throughput.average,
    serverCpu,
    loadGeneratorCpu,
    otherCpu,
    non2xx: r.non2xx,
    errors: r.errors,
    timeouts: r.timeouts
  }
}

/** Further starts on the same database (the first created the configured admin), each to its first 2xx and stopped. */
async function restarts (name: string, env: NodeJS.ProcessEnv, count: number): Promise<number[]> {
  const times: number[] = []
  for (let i = 0; i < count; i++) {
    const port = await freePort()
    const { child, startupMs } = await startTimed(`${name}-${i + 1}`, { ...env, PORT: String(port) }, `http://${HOST}:${port}`)
    await stopChild(child)
    times.push(startupMs)
  }
  return times
}

/** One start is one sample of a noisy machine (the same start took 390 and 600 ms in two runs): the median of five. */
const STARTS = 5

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

function printTable (rows: Array<[string, Measurement]>, ratio: number, cpuRatio: number | null): void {
  const header = ['target', 'req/s (avg)', 'p50 ms', 'p99 ms', 'non-2xx', 'errors', 'body bytes', 'server CPU', 'CPU µs/req', 'autocannon CPU', 'other CPU']
  const body = rows.map(([name, m]) => [
    name, fmt(m.reqPerSec.average, 1), fmt(m.latencyMs.p50, 2), fmt(m.latencyMs.p99, 2), String(m.non2xx), String(m.errors), String(m.bodyBytes),
    m.serverCpu === null ? 'n/a' : `${fmt(m.serverCpu.cores * 100)}%`,
    m.serverCpu === null ? 'n/a' : fmt(m.serverCpu.usPerRequest, 1),
    `${fmt(m.loadGeneratorCpu.cores * 100)}%`,
    m.otherCpu === null ? 'n/a' : `${fmt(m.otherCpu.cores * 100)}%`
  ])
  const table = formatTable(header, body)
  const busy = busyDuring(rows)
  const logLevel = settings.gatehouseLogLevel === undefined
    ? 'default (info)'
    : `${settings.gatehouseLogLevel} (BENCH_LOG_LEVEL: not the default, so not the run to report)`
  const out = [
    '',
    `${fmt(settings.users)} users, GET ${USERS_PATH}?limit=${PAGE_SIZE}; ${settings.connections} connections, ${settings.warmupS} s warm-up + ${settings.durationS} s per target; ` +
      `node ${process.version}, ${availableParallelism()} CPUs; gatehouse LOG_LEVEL ${logLevel}`,
    '',
    ...table.lines,
    '',
    `cached page, gatehouse/bare req/s: ${ratio.toFixed(3)}` +
      (cpuRatio !== null ? `; by CPU time (bare CPU µs/req ÷ gatehouse's): ${cpuRatio.toFixed(3)}, the same comparison, less sensitive to other load` : ''),
    ...(busy.length > 0
      ? [`WARNING: other processes used ${busy.join(', ')} of the CPU while measuring; this run's numbers (and ratio) are disturbed.`]
      : []),
    ''
  ]
  process.stdout.write(out.join('\n') + '\n')
}

// ---------------------------------------------------------------- the run

/** POST /auth/api/users with a password (one argon2id hash each), unique usernames; and the event loop's p99 meanwhile. */
async function measureCreates (child: Child, base: string, key: string): Promise<{ run: Measurement, limit: { hashesPerSec: number, before: number, after: number, concurrency: number }, eventLoopP99Ms: number | null }> {
  // Nothing else is loaded now, so the hashes measure the machine, not the servers. Measured before
  // and after the creates, and the two averaged: this machine's speed drifts over a run (the limit moved
  // by half between runs), and one side alone takes all of that drift.
  const limitSeconds = Math.max(3, Math.round(settings.durationS / 2))
  const before = await argon2Limit(limitSeconds)
  await eventLoopP99Ms(base, key)
  let counter = 0
  const { result: r, summary, serverCpu, loadGeneratorCpu, otherCpu } = await measureLoad('create', child, {
    url: `${base}${USERS_PATH}`,
    connections: settings.createConnections,
    requests: [{
      method: 'POST',
      headers: { 'x-api-key': key, 'content-type': 'application/json' },
      setupRequest: (request: autocannon.Request) => ({ ...request, body: JSON.stringify({ username: `bench.create${counter++}`, password: BENCH_PASSWORD }) })
    }]
  }, settings)
  const p99 = await eventLoopP99Ms(base, key)
  const after = await argon2Limit(limitSeconds)
  return {
    run: { url: `${base}${USERS_PATH}`, bodyBytes: 0, ...summary, throughputBytesPerSec: r.throughput.average, serverCpu, loadGeneratorCpu, otherCpu, non2xx: r.non2xx, errors: r.errors, timeouts: r.timeouts },
    limit: { hashesPerSec: (before.hashesPerSec + after.hashesPerSec) / 2, before: before.hashesPerSec, after: after.hashesPerSec, concurrency: before.concurrency },
    eventLoopP99Ms: p99
  }
}

/** A first start with the admin configured: to its first answer, the page checked, and the RSS once idle. */
async function firstStart (name: string, env: NodeJS.ProcessEnv, base: string, nodeArgs: string[]): Promise<{ child: Child, startupMs: number, page: Awaited<ReturnType<typeof checkList>>, idleRss: number | null }> {
  const { child, startupMs } = await startTimed(name, env, base, nodeArgs)
  const spawned = performance.now() - startupMs
  const page = await checkList(`${base}${USERS_PATH}?limit=${PAGE_SIZE}`, { 'x-api-key': ADMIN_KEY }, PAGE_SIZE)
  if (!/rel="next"/.test(page.headers.get('link') ?? '')) throw new Error(`${name}: the page has no Link: rel="next" although more users exist`)
  await sleep(Math.max(0, spawned + IDLE_AFTER_MS - performance.now()))
  return { child, startupMs, page, idleRss: rssMiB(child) }
}

interface Startup { medianMs: number, startsMs: number[], idleRssMiB: number | null, load: string }

type PostgresPart = { ran: false, why: string } | { ran: true, startup: Startup, list: Measurement | undefined, listLoad: string, seedMs: number }

/**
 * The cached page on PostgreSQL: a schema of its own, seeded like the SQLite file, the compiled server on it.
 * `pageRounds` runs while that server is up, with its uncached page and floor.
 */
async function measurePostgres (nodeArgs: string[], pageRounds: (postgres: PageEngine) => Promise<void>): Promise<PostgresPart> {
  if (settings.postgresUrl === 'off') return { ran: false, why: 'BENCH_PG_URL=off' }
  const unreachable = await postgresReachable(settings.postgresUrl)
  if (unreachable !== undefined) return { ran: false, why: `PostgreSQL at ${settings.postgresUrl}: ${unreachable}` }
  const schema = `gatehouse_bench_${process.pid}`
  await dropSchema(settings.postgresUrl, schema)
  try {
    const db = createDb({ databaseUrl: settings.postgresUrl, databaseSchema: schema, databasePoolSize: 1, databaseStatementTimeoutMs: 60_000, databaseQueryTimeoutMs: 61_000, databaseAcquireTimeoutMs: 5000 })
    await migrateToLatest(db, schema)
    await db.destroy()
    const seedStart = performance.now()
    await seedPostgres(settings.postgresUrl, schema, settings.users)
    const seedMs = performance.now() - seedStart
    log(`seeded ${fmt(settings.users)} users into PostgreSQL schema ${schema} in ${fmt(seedMs)} ms`)
    const port = await freePort()
    const base = `http://${HOST}:${port}`
    const pgEnv = childEnv({
      HOST,
      PORT: String(port),
      DATABASE_URL: settings.postgresUrl,
      DATABASE_SCHEMA: schema,
      // Names the server's connections, so that the uncached target can count its PostgreSQL backends' CPU.
      PGAPPNAME: benchAppName(),
      RATE_LIMIT_PER_CREDENTIAL: '1000000000',
      RATE_LIMIT_PER_ADDRESS: '1000000000',
      ...ADMIN_ENV
    })
    const { child, startupMs: firstStartMs, page, idleRss } = await firstStart('gatehouse-pg', pgEnv, base, nodeArgs)
    const startLoad = loadNow()
    const quick = settings.only === 'uncached'
    const list = quick ? undefined : await measure('gatehouse-pg', child, `${base}${USERS_PATH}?limit=${PAGE_SIZE}`, { 'x-api-key': ADMIN_KEY }, page.bodyBytes)
    const listLoad = loadNow()
    const postgresUrl = settings.postgresUrl
    await pageRounds({
      engine: 'postgres',
      gatehouse: async () => await measureUncached('gatehouse-pg-uncached', 'postgres', child, base, ADMIN_KEY, settings.users, settings.pageTiming, backendPids(postgresUrl, benchAppName())),
      floor: async () => await measureFloor('postgres', postgresUrl, schema, settings.users, settings.pageTiming)
    })
    await stopChild(child)
    const startsMs = [firstStartMs, ...quick ? [] : await restarts('gatehouse-pg-restart', pgEnv, STARTS - 1)]
    return { ran: true, startup: { medianMs: median(startsMs), startsMs, idleRssMiB: idleRss, load: startLoad }, list, listLoad, seedMs }
  } finally {
    await dropSchema(settings.postgresUrl, schema)
  }
}

async function main (): Promise<void> {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const tmpDir = makeTmpDir('gatehouse-bench-')
  const dbPath = join(tmpDir, 'bench.db')
  const cpuProfDir = join(RESULTS_DIR, `cpu-${stamp}`)
  // One folder per server: tsx's loader thread writes a profile of its own next to the main thread's (the larger file).
  const profArgs = (name: string): string[] => settings.cpuProfile ? ['--cpu-prof', `--cpu-prof-dir=${join(cpuProfDir, name)}`] : []

  // 1. Schema through the product's own migrations, then 100,000 users straight into the file.
  log(`temp dir ${tmpDir}`)
  await migrateSqliteFile(dbPath)
  const seedStart = performance.now()
  seedSqliteUsers(dbPath, settings.users)
  const seedMs = performance.now() - seedStart
  // The seed's 50 MB go to disk now, not during the timed start that follows.
  const seeded = openSync(dbPath, 'r+')
  try { fsyncSync(seeded) } finally { closeSync(seeded) }
  log(`seeded ${fmt(settings.users)} users in ${fmt(seedMs)} ms`)

  // 2. The real server, configured only by the environment an operator would set.
  const gatehousePort = await freePort()
  const env = childEnv({
    HOST,
    PORT: String(gatehousePort),
    DATABASE_URL: `sqlite:${dbPath}`,
    // One key from one address at thousands of requests a second is the point of the run; the
    // general limits (60,000 a minute per credential and per address by default) would answer 429
    // within seconds. Raised, not switched off, so the limiters' own cost stays in the measurement.
    RATE_LIMIT_PER_CREDENTIAL: '1000000000',
    RATE_LIMIT_PER_ADDRESS: '1000000000',
    ...ADMIN_ENV,
    ...(settings.gatehouseLogLevel !== undefined ? { LOG_LEVEL: settings.gatehouseLogLevel } : {})
  })
  const gatehouseBase = `http://${HOST}:${gatehousePort}`
  const first = await firstStart('gatehouse', env, gatehouseBase, profArgs('gatehouse'))
  const { child: gatehouse, startupMs: firstStartMs, page, idleRss } = first
  const startLoad = loadNow()
  const auth = { 'x-api-key': ADMIN_KEY }
  log(`gatehouse ready on ${gatehouseBase} (pid ${gatehouse.proc.pid})`)
  const one = await checkList(`${gatehouseBase}${USERS_PATH}?limit=1`, auth, 1)
  if (one.users[0]?.username !== seedRow(0).username) throw new Error(`the first user is ${String(one.users[0]?.username)}, not the first seeded one`)
  const gatehouseUrl = `${gatehouseBase}${USERS_PATH}?limit=${PAGE_SIZE}`

  // 3. The baseline.
  const barePort = await freePort()
  const bare = startChild('bare', 'bench/bare-server.ts', childEnv({ PORT: String(barePort) }), profArgs('bare'))
  const bareUrl = `http://${HOST}:${barePort}${USERS_PATH}`
  await waitReady(bare, bareUrl)
  const barePage = await checkList(bareUrl, {}, PAGE_SIZE)
  log(`bare server ready on ${bareUrl} (pid ${bare.proc.pid})`)
  const sqlitePage: SqlitePage = { dbPath, bare, bareUrl, bareBodyBytes: barePage.bodyBytes, gatehouse, gatehouseBase }

  if (settings.only === 'uncached') {
    await uncachedOnly({ ...sqlitePage, stamp, pgProfArgs: profArgs('gatehouse-pg') })
    return
  }

  // 4. Load, one target at a time.
  const bareResult = await measure('bare', bare, bareUrl, {}, barePage.bodyBytes)
  const logBytesBefore = statSync(gatehouse.stdoutPath).size
  const gatehouseResult = await measure('gatehouse', gatehouse, gatehouseUrl, auth, page.bodyBytes)
  const cachedLoad = loadNow()
  const logBytes = statSync(gatehouse.stdoutPath).size - logBytesBefore
  const creates = await measureCreates(gatehouse, gatehouseBase, ADMIN_KEY)
  const createLoad = loadNow()
  const rounds = await withPageRounds(sqlitePage, async run => await measurePostgres(profArgs('gatehouse-pg'), run))
  const postgres = rounds.postgres
  // More starts on the same file, beside the idle server.
  const startsMs = [firstStartMs, ...await restarts('gatehouse-restart', env, STARTS - 1)]

  // 5. The list's own report, then the parts with servers of their own (the list's stop first), then the floors.
  const ratio = gatehouseResult.reqPerSec.average / bareResult.reqPerSec.average
  const cpuRatio = bareResult.serverCpu !== null && gatehouseResult.serverCpu !== null
    ? bareResult.serverCpu.usPerRequest / gatehouseResult.serverCpu.usPerRequest
    : null
  printTable([['bare', bareResult], ['gatehouse', gatehouseResult]], ratio, cpuRatio)
  process.stdout.write(`create ÷ argon2id limit: ${(creates.run.reqPerSec.average / creates.limit.hashesPerSec).toFixed(3)} (${fmt(creates.run.reqPerSec.average, 1)} creates/s; ` +
    `${fmt(creates.limit.hashesPerSec, 1)} hashes/s at ${creates.limit.concurrency}: ${fmt(creates.limit.before, 1)} before, ${fmt(creates.limit.after, 1)} after); event-loop p99 ${creates.eventLoopP99Ms?.toFixed(1) ?? 'n/a'} ms\n`)
  process.stdout.write(formatPageRounds(rounds.rounds))
  await Promise.all([bare, gatehouse].map(stopChild))
  const parts = await measureParts(settings.postgresUrl === 'off' ? undefined : settings.postgresUrl)

  const list: ListFigures = {
    users: settings.users,
    pages: pageRatios(rounds.rounds),
    cached: {
      sqlite: { ratio, load: cachedLoad },
      ...(postgres.ran && postgres.list !== undefined ? { postgres: { ratio: postgres.list.reqPerSec.average / bareResult.reqPerSec.average, load: postgres.listLoad } } : {})
    },
    create: { ratio: creates.run.reqPerSec.average / creates.limit.hashesPerSec, load: createLoad },
    startup: {
      sqlite: { medianMs: median(startsMs), startsMs, idleRssMiB: idleRss, load: startLoad },
      ...(postgres.ran ? { postgres: postgres.startup } : {})
    },
    ...(postgres.ran ? {} : { postgresSkipped: postgres.why })
  }
  const floors = floorRows(list, parts)
  process.stdout.write(formatFloors(floors))

  const stormFailed = 'results' in parts.storm && parts.storm.results.some(r => r.measurements.some(m => m.non2xx > 0 || m.errors > 0 || (m.helper?.failed ?? 0) > 0))
  const valid = !stormFailed && [bareResult, gatehouseResult, creates.run, ...(postgres.ran && postgres.list !== undefined ? [postgres.list] : []), ...pageRoundMeasurements(rounds.rounds)]
    .every(m => m.non2xx === 0 && m.errors === 0 && m.timeouts === 0)
  writeResults('list-users', stamp, {
    benchmark: 'list-users',
    floors,
    startedAt: stamp,
    valid,
    /** False when other processes competed for the CPU (see otherCpu): compare such runs with care. */
    quiet: isQuiet([bareResult, gatehouseResult]),
    list,
    parts,
    pageRounds: rounds.rounds,
    creates,
    postgres,
    settings: { ...settings, gatehouseLogLevel: settings.gatehouseLogLevel ?? 'default (info)' },
    machine: machineInfo(),
    git: gitInfo(),
    seed: { users: settings.users, ms: Math.round(seedMs) },
    bare: bareResult,
    gatehouse: {
      ...gatehouseResult,
      log: {
        bytesDuringWarmupAndMeasurement: logBytes,
        bytesPerRequest: logBytes / Math.max(1, gatehouseResult.warmupRequests + gatehouseResult.requests)
      }
    },
    ...(settings.cpuProfile ? { cpuProfiles: cpuProfDir } : {})
  })

  await cleanUp()
  if (settings.cpuProfile) log(`CPU profiles in ${cpuProfDir} (open in Chrome DevTools > Performance, or speedscope)`)
  if (!valid) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see the JSON)')
    process.exitCode = 1
  }
}

/** The servers the page rounds measure on SQLite: the bare route and gatehouse, both already up. */
interface SqlitePage { dbPath: string, bare: Child, bareUrl: string, bareBodyBytes: number, gatehouse: Child, gatehouseBase: string }

/**
 * The uncached page rounds, run inside the PostgreSQL part while its server is up (so that both databases' pages
 * are in every round), or on SQLite alone when that part does not run.
 */
async function withPageRounds (m: SqlitePage, postgresPart: (run: (postgres: PageEngine) => Promise<void>) => Promise<PostgresPart>): Promise<{ rounds: PageRound[], postgres: PostgresPart }> {
  const sqlite: PageEngine = {
    engine: 'sqlite',
    gatehouse: async () => await measureUncached('gatehouse-uncached', 'sqlite', m.gatehouse, m.gatehouseBase, ADMIN_KEY, settings.users, settings.pageTiming),
    floor: async () => await measureFloor('sqlite', `sqlite:${m.dbPath}`, undefined, settings.users, settings.pageTiming)
  }
  const bare = async (): Promise<Measurement> => await measure('bare', m.bare, m.bareUrl, {}, m.bareBodyBytes, settings.pageTiming)
  let rounds: PageRound[] | undefined
  const postgres = await postgresPart(async pg => { rounds = await measurePageRounds(bare, [sqlite, pg], settings.pageRounds) })
  if (!postgres.ran) log(`PostgreSQL part skipped: ${postgres.why}`)
  rounds ??= await measurePageRounds(bare, [sqlite], settings.pageRounds)
  return { rounds, postgres }
}

/** BENCH_ONLY=uncached: the cached page beside bare, then the uncached page rounds on SQLite and PostgreSQL, and their floors. */
async function uncachedOnly (m: SqlitePage & { stamp: string, pgProfArgs: string[] }): Promise<void> {
  const bareResult = await measure('bare', m.bare, m.bareUrl, {}, m.bareBodyBytes)
  // The repeated first page (a cache hit) beside it: what the uncached page costs beyond the rest of the request.
  const cachedResult = await measure('gatehouse', m.gatehouse, `${m.gatehouseBase}${USERS_PATH}?limit=${PAGE_SIZE}`, { 'x-api-key': ADMIN_KEY }, m.bareBodyBytes)
  const cachedLoad = loadNow()
  const { rounds } = await withPageRounds(m, async run => await measurePostgres(m.pgProfArgs, run))
  const header = ['target', 'req/s (avg)', 'p99 ms', 'non-2xx', 'server CPU µs/req', 'other CPU']
  const body = ([['bare', bareResult], ['gatehouse, repeated page (cache hit, sqlite)', cachedResult]] as const).map(([name, r]) => [
    name, fmt(r.reqPerSec.average, 1), fmt(r.latencyMs.p99, 2), String(r.non2xx),
    r.serverCpu === null ? 'n/a' : fmt(r.serverCpu.usPerRequest, 1),
    r.otherCpu === null ? 'n/a' : `${fmt(r.otherCpu.cores * 100)}%`
  ])
  process.stdout.write(['', ...formatTable(header, body).lines, ''].join('\n') + '\n')
  process.stdout.write(formatPageRounds(rounds))
  const skipped: Parts = { storm: { skipped: 'BENCH_ONLY=uncached' }, search: { skipped: 'BENCH_ONLY=uncached' } }
  const list: ListFigures = { users: settings.users, pages: pageRatios(rounds), cached: { sqlite: { ratio: cachedResult.reqPerSec.average / bareResult.reqPerSec.average, load: cachedLoad } }, startup: {} }
  // Only the rows this mode measures.
  const floors = floorRows(list, skipped).filter(r => r.met !== null)
  process.stdout.write(formatFloors(floors))
  writeResults('list-users-uncached', m.stamp, { benchmark: 'list-users (BENCH_ONLY=uncached)', floors, bare: bareResult, cached: cachedResult, pageRounds: rounds, settings, machine: machineInfo(), git: gitInfo() })
  await cleanUp()
  if (![bareResult, cachedResult, ...pageRoundMeasurements(rounds)].every(r => r.non2xx === 0 && r.errors === 0 && r.timeouts === 0)) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see the JSON)')
    process.exitCode = 1
  }
}

await runBench(main)
