/**
 * How close does `GET /auth/api/users?limit=50` come to a bare Fastify route
 * that returns 50 users from memory? Starts both servers as child processes
 * on 127.0.0.1, seeds 100,000 users, measures both with autocannon, prints a
 * table and writes bench/results/list-users-<timestamp>.json. See bench/README.md.
 *
 *   npm run bench
 *   BENCH_DURATION=30 BENCH_CONNECTIONS=100 npm run bench
 */
import { closeSync, fsyncSync, openSync, statSync } from 'node:fs'
import type autocannon from 'autocannon'
import { availableParallelism } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { User } from '../src/users/users.schemas.ts'
import { seedRow, seedSqliteUsers, USERS_PATH } from './fixtures.ts'
import {
  benchAppName, backendPids, formatIssue20, formatPageRounds, issue20PageRows, measureFloor, measurePageRounds, measureUncached, pageRoundMeasurements, type PageEngine, type PageRound
} from './uncached-page.ts'
import { formatIssue20Table, measureIssue20Parts } from './issue20.ts'
import { argon2Limit, BENCH_PASSWORD, dropSchema, eventLoopP99Ms, postgresReachable, rssMiB, seedPostgres, sessionCookie, startTimed } from './issue-rows.ts'
import {
  busyDuring, childEnv, cleanUp, envFlag, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, isQuiet,
  log, machineInfo, makeTmpDir, measureLoad, migrateSqliteFile, readAdminKey, runBench, RESULTS_DIR, startChild, stopChild, waitReady, writeResults, type Child, type LoadCpu, type LoadSummary
} from './harness.ts'

const PAGE_SIZE = 50
const TARGET_RATIO = 0.5

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
  /** `uncached`: only the bare route and issue 20's uncached pages (SQLite and PostgreSQL), for quick comparisons while working on them. */
  only: process.env.BENCH_ONLY === 'uncached' ? 'uncached' as const : undefined,
  /** Issue 20's rows 1 and 2 in rounds (uncached-page.ts, measurePageRounds): how many, and each load's warm-up and measured seconds. */
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

/** Further starts on the same database (the first start issued the admin key), each to its first 2xx and stopped. */
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

/** One start is one sample of a noisy machine (stop 16 saw the same start take 390 and 600 ms in two runs): the median of five. */
const STARTS = 5

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

function printTable (rows: Array<[string, Measurement]>, ratio: number, meets: boolean, cpuRatio: number | null): void {
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
    : `${settings.gatehouseLogLevel} (BENCH_LOG_LEVEL: not the default, so not the ratio to report)`
  const out = [
    '',
    `${fmt(settings.users)} users, GET ${USERS_PATH}?limit=${PAGE_SIZE}; ${settings.connections} connections, ${settings.warmupS} s warm-up + ${settings.durationS} s per target; ` +
      `node ${process.version}, ${availableParallelism()} CPUs; gatehouse LOG_LEVEL ${logLevel}`,
    '',
    ...table.lines,
    '',
    `ratio gatehouse/bare: ${ratio.toFixed(3)}   target >= ${TARGET_RATIO}: ${meets ? 'MET' : 'NOT MET'}`,
    ...(cpuRatio !== null ? [`CPU-time ratio (bare CPU µs/req / gatehouse CPU µs/req): ${cpuRatio.toFixed(3)}  (the same comparison, less sensitive to other load)`] : []),
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
  // and after the creates, and the two averaged: this machine's speed drifts over a run (stop 15's
  // runs saw the limit move by half between runs), and one side alone takes all of that drift.
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

type PostgresPart = { ran: false, why: string } | { ran: true, startupMs: number, startsMs: number[], idleRss: number | null, list: Measurement | undefined, verify: Measurement | undefined, seedMs: number }

/**
 * The list and verify on PostgreSQL: a schema of its own, seeded like the SQLite file, the compiled server on it.
 * `pageRounds` runs while that server is up, with its uncached page and floor: issue 20's rounds.
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
      RATE_LIMIT_PER_ADDRESS: '1000000000'
    })
    const { child, startupMs: firstStartMs } = await startTimed('gatehouse-pg', pgEnv, base, nodeArgs)
    const key = await readAdminKey(child)
    const url = `${base}${USERS_PATH}?limit=${PAGE_SIZE}`
    const page = await checkList(url, { 'x-api-key': key }, PAGE_SIZE)
    await sleep(2000)
    const idleRss = rssMiB(child)
    const quick = settings.only === 'uncached'
    const list = quick ? undefined : await measure('gatehouse-pg', child, url, { 'x-api-key': key }, page.bodyBytes)
    const postgresUrl = settings.postgresUrl
    await pageRounds({
      engine: 'postgres',
      gatehouse: async () => await measureUncached('gatehouse-pg-uncached', 'postgres', child, base, key, settings.users, settings.pageTiming, backendPids(postgresUrl, benchAppName())),
      floor: async () => await measureFloor('postgres', postgresUrl, schema, settings.users, settings.pageTiming)
    })
    const verify = quick ? undefined : await measure('verify-pg', child, `${base}/auth/api/verify`, { cookie: await sessionCookie(base, key, 'bench.verify') }, 0)
    await stopChild(child)
    const startsMs = [firstStartMs, ...quick ? [] : await restarts('gatehouse-pg-restart', pgEnv, STARTS - 1)]
    return { ran: true, startupMs: median(startsMs), startsMs, idleRss, list, verify, seedMs }
  } finally {
    await dropSchema(settings.postgresUrl, schema)
  }
}

/** Issue 8's table: each row as measured in this run, with its goal. */
function issueRows (m: { ratio: number, cpuRatio: number | null, startupMs: number, startsMs: number[], idleRss: number | null, verifyResult: Measurement, creates: Awaited<ReturnType<typeof measureCreates>>, postgres: PostgresPart, bareResult: Measurement, gatehouseResult: Measurement }): { text: string, values: Record<string, number | null | string | boolean> } {
  const pgPart = m.postgres
  // PostgreSQL's own processes count as "other CPU" during the PostgreSQL targets (about a core), so only the others tell whether the machine was quiet.
  const measured: Array<[string, Measurement]> = [['bare', m.bareResult], ['gatehouse', m.gatehouseResult], ['verify', m.verifyResult], ['create', m.creates.run]]
  const busy = busyDuring(measured)
  const createRatio = m.creates.run.reqPerSec.average / m.creates.limit.hashesPerSec
  const values: Record<string, number | null | string | boolean> = {
    quiet: busy.length === 0,
    listSqliteToBare: m.ratio,
    listSqliteToBareCpuTime: m.cpuRatio,
    listPostgresToBare: pgPart.ran && pgPart.list !== undefined ? pgPart.list.reqPerSec.average / m.bareResult.reqPerSec.average : null,
    verifyPostgresToSqlite: pgPart.ran && pgPart.verify !== undefined ? pgPart.verify.reqPerSec.average / m.verifyResult.reqPerSec.average : null,
    startupSqliteMs: m.startupMs,
    startupPostgresMs: pgPart.ran ? pgPart.startupMs : null,
    idleRssSqliteMiB: m.idleRss,
    idleRssPostgresMiB: pgPart.ran ? pgPart.idleRss : null,
    createToArgon2Limit: createRatio,
    createEventLoopP99Ms: m.creates.eventLoopP99Ms,
    ...(pgPart.ran ? {} : { postgresSkipped: pgPart.why })
  }
  const show = (v: number | null | string | boolean | undefined, digits: number, unit = ''): string => typeof v === 'number' ? `${v.toFixed(digits)}${unit}` : 'n/a'
  const rows = [
    ['list 50 on SQLite ÷ bare Fastify (CPU-time ratio)', `${show(values.listSqliteToBare, 3)} (${show(values.listSqliteToBareCpuTime, 3)})`, '≥ 0.5', m.ratio >= 0.5],
    ['list 50 on PostgreSQL ÷ bare Fastify', show(values.listPostgresToBare, 3), '≥ 0.3', typeof values.listPostgresToBare === 'number' && values.listPostgresToBare >= 0.3],
    ['verify (session cookie) PostgreSQL ÷ SQLite', show(values.verifyPostgresToSqlite, 3), '≥ 0.7', typeof values.verifyPostgresToSqlite === 'number' && values.verifyPostgresToSqlite >= 0.7],
    [`startup to first 2xx, median of ${STARTS} starts, SQLite / PostgreSQL`, `${show(values.startupSqliteMs, 0, ' ms')} / ${show(values.startupPostgresMs, 0, ' ms')}`, '< 500 ms',
      m.startupMs < 500 && (!pgPart.ran || pgPart.startupMs < 500)],
    ['idle RSS, SQLite / PostgreSQL', `${show(values.idleRssSqliteMiB, 0, ' MiB')} / ${show(values.idleRssPostgresMiB, 0, ' MiB')}`, '< 100 MiB',
      m.idleRss !== null && m.idleRss < 100 && (!pgPart.ran || (pgPart.idleRss !== null && pgPart.idleRss < 100))],
    [`create ÷ argon2id limit (${fmt(m.creates.limit.hashesPerSec, 1)} hashes/s at ${m.creates.limit.concurrency}: ${fmt(m.creates.limit.before, 1)} before, ${fmt(m.creates.limit.after, 1)} after), event-loop p99`,
      `${createRatio.toFixed(3)}, ${show(values.createEventLoopP99Ms, 1, ' ms')}`, '≥ 0.9, < 20 ms',
      createRatio >= 0.9 && m.creates.eventLoopP99Ms !== null && m.creates.eventLoopP99Ms < 20]
  ] as const
  const table = formatTable(['issue 8 row', 'this run', 'goal', 'met'], rows.map(([a, b, c, d]) => [a, b, c, d ? 'yes' : 'NO']))
  const text = ['', 'Issue 8, every row from this run (ratios of targets measured one after another in this run):', '', ...table.lines,
    `Starts, in ms, the first one issuing the admin key: SQLite ${m.startsMs.map(v => v.toFixed(0)).join(', ')}; PostgreSQL ${pgPart.ran ? pgPart.startsMs.map(v => v.toFixed(0)).join(', ') : 'n/a'}.`,
    ...(pgPart.ran ? [] : [`PostgreSQL part skipped: ${pgPart.why}`]),
    ...(busy.length > 0 ? [`WARNING: other processes used ${busy.join(', ')} of the CPU while measuring: these ratios are disturbed; run again on a quiet machine.`] : []),
    ''].join('\n') + '\n'
  return { text, values }
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
    ...(settings.gatehouseLogLevel !== undefined ? { LOG_LEVEL: settings.gatehouseLogLevel } : {})
  })
  const gatehouseBase = `http://${HOST}:${gatehousePort}`
  const { child: gatehouse, startupMs: firstStartMs } = await startTimed('gatehouse', env, gatehouseBase, profArgs('gatehouse'))
  const key = await readAdminKey(gatehouse)
  const auth = { 'x-api-key': key }
  log(`gatehouse ready on ${gatehouseBase} (pid ${gatehouse.proc.pid}), admin key ${key.slice(0, 16)}…`)

  const one = await checkList(`${gatehouseBase}${USERS_PATH}?limit=1`, auth, 1)
  if (one.users[0]?.username !== seedRow(0).username) throw new Error(`the first user is ${String(one.users[0]?.username)}, not the first seeded one`)
  const gatehouseUrl = `${gatehouseBase}${USERS_PATH}?limit=${PAGE_SIZE}`
  const page = await checkList(gatehouseUrl, auth, PAGE_SIZE)
  if (!/rel="next"/.test(page.headers.get('link') ?? '')) throw new Error('the page has no Link: rel="next" although more users exist')
  await sleep(2000)
  const idleRss = rssMiB(gatehouse)

  // 3. The baseline.
  const barePort = await freePort()
  const bare = startChild('bare', 'bench/bare-server.ts', childEnv({ PORT: String(barePort) }), profArgs('bare'))
  const bareUrl = `http://${HOST}:${barePort}${USERS_PATH}`
  await waitReady(bare, bareUrl)
  const barePage = await checkList(bareUrl, {}, PAGE_SIZE)
  log(`bare server ready on ${bareUrl} (pid ${bare.proc.pid})`)

  if (settings.only === 'uncached') {
    await uncachedOnly({ stamp, dbPath, bare, bareUrl, bareBodyBytes: barePage.bodyBytes, gatehouse, gatehouseBase, key, pgProfArgs: profArgs('gatehouse-pg') })
    return
  }

  // The issue's second reference point: a bare route doing the same read with better-sqlite3, the plain way.
  const readPort = await freePort()
  const bareRead = startChild('bare+read', 'bench/bare-server.ts', childEnv({ PORT: String(readPort), BARE_DB: dbPath }), profArgs('bare-read'))
  const bareReadUrl = `http://${HOST}:${readPort}${USERS_PATH}`
  await waitReady(bareRead, bareReadUrl)
  const bareReadPage = await checkList(bareReadUrl, {}, PAGE_SIZE)

  // 4. Load, one target at a time.
  const bareResult = await measure('bare', bare, bareUrl, {}, barePage.bodyBytes)
  const bareReadResult = await measure('bare+read', bareRead, bareReadUrl, {}, bareReadPage.bodyBytes)
  const logBytesBefore = statSync(gatehouse.stdoutPath).size
  const gatehouseResult = await measure('gatehouse', gatehouse, gatehouseUrl, auth, page.bodyBytes)
  const logBytes = statSync(gatehouse.stdoutPath).size - logBytesBefore
  const cookie = await sessionCookie(gatehouseBase, key, 'bench.verify')
  const verifyResult = await measure('verify', gatehouse, `${gatehouseBase}/auth/api/verify`, { cookie }, 0)
  const creates = await measureCreates(gatehouse, gatehouseBase, key)
  const rounds = await withPageRounds({ dbPath, bare, bareUrl, bareBodyBytes: barePage.bodyBytes, gatehouse, gatehouseBase, key }, async run => await measurePostgres(profArgs('gatehouse-pg'), run))
  const postgres = rounds.postgres
  // More starts on the same file, beside the idle server.
  const startsMs = [firstStartMs, ...await restarts('gatehouse-restart', env, STARTS - 1)]
  const startupMs = median(startsMs)

  // 5. Report.
  const ratio = gatehouseResult.reqPerSec.average / bareResult.reqPerSec.average
  const meets = ratio >= TARGET_RATIO
  const valid = [bareResult, gatehouseResult, verifyResult, creates.run, ...(postgres.ran ? [postgres.list!, postgres.verify!] : []), ...pageRoundMeasurements(rounds.rounds)]
    .every(m => m.non2xx === 0 && m.errors === 0 && m.timeouts === 0)
  const cpuRatio = bareResult.serverCpu !== null && gatehouseResult.serverCpu !== null
    ? bareResult.serverCpu.usPerRequest / gatehouseResult.serverCpu.usPerRequest
    : null
  printTable([['bare', bareResult], ['bare+read', bareReadResult], ['gatehouse', gatehouseResult]], ratio, meets, cpuRatio)
  const readRatio = gatehouseResult.reqPerSec.average / bareReadResult.reqPerSec.average
  process.stdout.write(`bare+read/bare: ${(bareReadResult.reqPerSec.average / bareResult.reqPerSec.average).toFixed(3)} ` +
    `(the issue's reference read); gatehouse/bare+read: ${readRatio.toFixed(3)}\n\n`)

  const rows = issueRows({ ratio, cpuRatio, startupMs, startsMs, idleRss, verifyResult, creates, postgres, bareResult, gatehouseResult })
  process.stdout.write(rows.text)
  const issue20 = issue20PageRows(rounds.rounds)
  process.stdout.write(formatPageRounds(rounds.rounds))
  process.stdout.write(formatIssue20(issue20))

  const report = {
    benchmark: 'list-users',
    issue8: rows.values,
    issue20,
    pageRounds: rounds.rounds,
    verify: verifyResult,
    creates,
    postgres,
    startup: { ms: startupMs, startsMs, idleRssMiB: idleRss },
    startedAt: stamp,
    valid,
    /** False when other processes competed for the CPU (see otherCpu): compare such runs with care. */
    quiet: isQuiet([bareResult, gatehouseResult]),
    ratio,
    /** bare's server CPU time per response over gatehouse's: the ratio of costs, which other load disturbs far less than req/s. */
    cpuRatio,
    targetRatio: TARGET_RATIO,
    meetsTarget: meets,
    settings: { ...settings, gatehouseLogLevel: settings.gatehouseLogLevel ?? 'default (info)' },
    machine: machineInfo(),
    git: gitInfo(),
    seed: { users: settings.users, ms: Math.round(seedMs) },
    bare: bareResult,
    bareRead: bareReadResult,
    gatehouseToBareRead: readRatio,
    gatehouse: {
      ...gatehouseResult,
      log: {
        bytesDuringWarmupAndMeasurement: logBytes,
        bytesPerRequest: logBytes / Math.max(1, gatehouseResult.warmupRequests + gatehouseResult.requests)
      }
    },
    ...(settings.cpuProfile ? { cpuProfiles: cpuProfDir } : {})
  }
  writeResults('list-users', stamp, report)

  // Issue 20's other rows, each on servers and databases of its own: the list's servers stop first.
  if (process.env.BENCH_ISSUE20 !== 'off') {
    await Promise.all([bare, bareRead, gatehouse].map(stopChild))
    const parts = await measureIssue20Parts(settings.postgresUrl === 'off' ? undefined : settings.postgresUrl)
    process.stdout.write(formatIssue20Table(issue20, parts))
    writeResults('issue20', stamp, { benchmark: 'issue20', startedAt: stamp, page: issue20, parts, machine: machineInfo(), git: gitInfo() })
  }

  await cleanUp()
  if (settings.cpuProfile) log(`CPU profiles in ${cpuProfDir} (open in Chrome DevTools > Performance, or speedscope)`)
  if (!valid) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see the JSON)')
    process.exitCode = 1
  }
}

/** The servers the page rounds measure on SQLite: the bare route and gatehouse, both already up. */
interface SqlitePage { dbPath: string, bare: Child, bareUrl: string, bareBodyBytes: number, gatehouse: Child, gatehouseBase: string, key: string }

/**
 * Issue 20's page rounds, run inside the PostgreSQL part while its server is up (so that both databases' pages
 * are in every round), or on SQLite alone when that part does not run.
 */
async function withPageRounds (m: SqlitePage, postgresPart: (run: (postgres: PageEngine) => Promise<void>) => Promise<PostgresPart>): Promise<{ rounds: PageRound[], postgres: PostgresPart }> {
  const sqlite: PageEngine = {
    engine: 'sqlite',
    gatehouse: async () => await measureUncached('gatehouse-uncached', 'sqlite', m.gatehouse, m.gatehouseBase, m.key, settings.users, settings.pageTiming),
    floor: async () => await measureFloor('sqlite', `sqlite:${m.dbPath}`, undefined, settings.users, settings.pageTiming)
  }
  const bare = async (): Promise<Measurement> => await measure('bare', m.bare, m.bareUrl, {}, m.bareBodyBytes, settings.pageTiming)
  let rounds: PageRound[] | undefined
  const postgres = await postgresPart(async pg => { rounds = await measurePageRounds(bare, [sqlite, pg], settings.pageRounds) })
  if (!postgres.ran) log(`PostgreSQL part skipped: ${postgres.why}`)
  rounds ??= await measurePageRounds(bare, [sqlite], settings.pageRounds)
  return { rounds, postgres }
}

/** BENCH_ONLY=uncached: the repeated page beside bare, then issue 20's page rounds on SQLite and PostgreSQL, and their rows. */
async function uncachedOnly (m: SqlitePage & { stamp: string, pgProfArgs: string[] }): Promise<void> {
  const bareResult = await measure('bare', m.bare, m.bareUrl, {}, m.bareBodyBytes)
  // The repeated first page (a cache hit) beside it: what the uncached page costs beyond the rest of the request.
  const cachedResult = await measure('gatehouse', m.gatehouse, `${m.gatehouseBase}${USERS_PATH}?limit=${PAGE_SIZE}`, { 'x-api-key': m.key }, m.bareBodyBytes)
  const { rounds } = await withPageRounds(m, async run => await measurePostgres(m.pgProfArgs, run))
  const issue20 = issue20PageRows(rounds)
  const header = ['target', 'req/s (avg)', 'p99 ms', 'non-2xx', 'server CPU µs/req', 'other CPU']
  const body = ([['bare', bareResult], ['gatehouse, repeated page (cache hit, sqlite)', cachedResult]] as const).map(([name, r]) => [
    name, fmt(r.reqPerSec.average, 1), fmt(r.latencyMs.p99, 2), String(r.non2xx),
    r.serverCpu === null ? 'n/a' : fmt(r.serverCpu.usPerRequest, 1),
    r.otherCpu === null ? 'n/a' : `${fmt(r.otherCpu.cores * 100)}%`
  ])
  process.stdout.write(['', ...formatTable(header, body).lines, ''].join('\n') + '\n')
  process.stdout.write(formatPageRounds(rounds))
  process.stdout.write(formatIssue20(issue20))
  writeResults('list-users-uncached', m.stamp, { benchmark: 'list-users (BENCH_ONLY=uncached)', issue20, bare: bareResult, cached: cachedResult, pageRounds: rounds, settings, machine: machineInfo(), git: gitInfo() })
  await cleanUp()
  if (![bareResult, cachedResult, ...pageRoundMeasurements(rounds)].every(r => r.non2xx === 0 && r.errors === 0 && r.timeouts === 0)) {
    log('INVALID RUN: non-2xx responses, errors or timeouts under load (see the JSON)')
    process.exitCode = 1
  }
}

await runBench(main)
