/**
 * Two builds of gatehouse side by side, in interleaved rounds: the uncached
 * page of 50 (a different cursor on every request, bench/uncached-page.ts)
 * and the repeated page (a cache hit), on one seeded SQLite file, by server
 * CPU time per response. On a shared machine single runs minutes apart
 * differ by more than most changes; rounds that alternate the two builds
 * (and which goes first) compare them under the same load.
 *
 *   cp -r dist /tmp/before && ln -s "$PWD/node_modules" /tmp/before/node_modules   # before changing src/
 *   npm run build && AB_A=/tmp/before/server.js npx tsx bench/ab-builds.ts
 *
 * AB_A, AB_B: the servers (B defaults to dist/server.js). AB_USERS (20000),
 * AB_ROUNDS (3), AB_WARMUP (2), AB_DURATION (6) seconds, AB_CONNECTIONS (50),
 * AB_ONLY=uncached|hit, AB_PROF=A|B: a CPU profile of that server in
 * bench/results/cpu-ab-<name>/.
 *
 * AB_PG_URL (e.g. postgres://postgres@127.0.0.1:5432/test): the same on
 * PostgreSQL instead, both builds on one seeded schema of their own (dropped
 * at the end), each server's backends found by its own application_name and
 * their CPU added to the server's (as uncached-page.ts counts them).
 * AB_PG_URL_A, AB_PG_URL_B: the URL that build's server connects with, when
 * it is not AB_PG_URL (the same database another way, e.g. its Unix socket:
 * postgres://postgres@%2Fvar%2Frun%2Fpostgresql/test).
 * AB_ENV_A, AB_ENV_B: settings for that build's server only, as NAME=value
 * pairs separated by spaces (the same build twice, one setting apart:
 * AB_A=dist/server.js AB_ENV_A=DATABASE_READ_PIPELINES=0). AB_NODE_ARGS_A,
 * AB_NODE_ARGS_B: node options for that server, separated by spaces
 * (`--max-semi-space-size=64`). AB_KEEP_TMP=1 keeps the temporary directory,
 * with each server's stdout and stderr (`AB_NODE_ARGS_B=--trace-gc`).
 * Each round also prints the server's minor page faults per response and its
 * resident memory after the round (and the most it has held since it
 * started): a node option that trades memory for CPU shows both, and its
 * latency (p50 / p99). On PostgreSQL, the same build against itself read
 * 0.906 to 0.975 on 29 November (two sittings of two rounds), and in seven
 * of that day's eight sittings on PostgreSQL the server started second (B)
 * had the cheaper backends. Run a change with the builds' places swapped
 * too (AB_A=dist/server.js AB_B=<the other>) before reading a difference of
 * that size.
 * AB_PAIRED=1: in each round both builds at once, each at AB_RATE requests a
 * second (1000) on its own connections, so that the machine's swings between
 * one measurement and the next fall on both alike. On 28 November, in a noisy
 * state of this VM, interleaved rounds of two builds read B/A 0.75 to 1.15;
 * paired, 1.00 to 1.07. But paired rounds lean: the same build against itself
 * (AB_A=dist/server.js) read 0.96 to 1.08, median 1.05. Run that control in
 * the same sitting and read a change against it; a few percent is not
 * resolved either way. The rate must leave both servers short of saturation,
 * where their CPU per response is a little higher than at saturation (fewer
 * requests share each turn of the event loop).
 * AB_SEPARATE_FILES=1 (SQLite): each build on a file of its own, migrated by
 * that build's server as it starts and seeded alike after, for builds whose
 * migrations differ (one file would carry a migration the other build does
 * not know, and it would refuse to start).
 */
import type autocannon from 'autocannon'
import { loadavg } from 'node:os'
import { join } from 'node:path'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { seedSqliteUsers, USERS_PATH } from './fixtures.ts'
import { dropSchema, peakRssMiB, rssMiB, seedPostgres } from './issue-rows.ts'
import { backendPids, uncachedPaths } from './uncached-page.ts'
import {
  childEnv, cleanUp, envFlag, envInt, envPairs, envWords, freePort, HOST, installCleanUp, log, makeTmpDir, measureLoad, migrateSqliteFile, RESULTS_DIR, ROOT, runBench, startChild, waitReady, type Child, type LoadRun
} from './harness.ts'

const settings = {
  users: envInt('AB_USERS', 20_000),
  rounds: envInt('AB_ROUNDS', 3),
  timing: { warmupS: envInt('AB_WARMUP', 2), durationS: envInt('AB_DURATION', 6) },
  connections: envInt('AB_CONNECTIONS', 50),
  only: process.env.AB_ONLY,
  profile: process.env.AB_PROF,
  postgresUrl: process.env.AB_PG_URL,
  separateFiles: process.env.AB_SEPARATE_FILES === '1',
  paired: process.env.AB_PAIRED === '1',
  rate: envInt('AB_RATE', 1000)
}
const BUILDS = { A: process.env.AB_A, B: process.env.AB_B ?? join(ROOT, 'dist', 'server.js') }
const KEY = `gatehouse_${'abbuildskey'.repeat(4)}`
const KINDS = ['uncached', 'hit'] as const

installCleanUp({ keepTmp: envFlag('AB_KEEP_TMP') })

async function main (): Promise<void> {
  if (BUILDS.A === undefined) throw new Error('AB_A must name the other build\'s server.js (see the header of bench/ab-builds.ts)')
  const tmp = makeTmpDir('gatehouse-ab-')
  const pgUrl = settings.postgresUrl
  const schema = `gatehouse_ab_${process.pid}`
  // Per build: its database settings, and the SQLite file to seed once its own server has migrated it (AB_SEPARATE_FILES).
  let database: Record<'A' | 'B', { env: Record<string, string>, seedAfterStart?: string }>
  if (pgUrl !== undefined) {
    await dropSchema(pgUrl, schema)
    const db = createDb({ databaseUrl: pgUrl, databaseSchema: schema, databasePoolSize: 1, databaseStatementTimeoutMs: 60_000, databaseQueryTimeoutMs: 61_000, databaseAcquireTimeoutMs: 5000 })
    await migrateToLatest(db, schema)
    await db.destroy()
    await seedPostgres(pgUrl, schema, settings.users)
    const env = { DATABASE_URL: pgUrl, DATABASE_SCHEMA: schema }
    database = { A: { env }, B: { env } }
  } else if (settings.separateFiles) {
    const fileOf = (name: 'A' | 'B'): string => join(tmp, `bench-${name}.db`)
    database = {
      A: { env: { DATABASE_URL: `sqlite:${fileOf('A')}` }, seedAfterStart: fileOf('A') },
      B: { env: { DATABASE_URL: `sqlite:${fileOf('B')}` }, seedAfterStart: fileOf('B') }
    }
  } else {
    const dbPath = join(tmp, 'bench.db')
    await migrateSqliteFile(dbPath)
    seedSqliteUsers(dbPath, settings.users)
    const env = { DATABASE_URL: `sqlite:${dbPath}` }
    database = { A: { env }, B: { env } }
  }
  if (!settings.separateFiles || pgUrl !== undefined) log(`seeded ${settings.users} users${pgUrl !== undefined ? ` into PostgreSQL schema ${schema}` : ''}; A = ${BUILDS.A}, B = ${BUILDS.B}`)
  try {
    await compare(database, pgUrl)
  } finally {
    if (pgUrl !== undefined) await dropSchema(pgUrl, schema)
  }
}

async function compare (database: Record<'A' | 'B', { env: Record<string, string>, seedAfterStart?: string }>, pgUrl: string | undefined): Promise<void> {
  const servers = new Map<'A' | 'B', { child: Child, base: string, backends: (() => Promise<number[]>) | undefined }>()
  for (const name of ['A', 'B'] as const) {
    const port = await freePort()
    const appName = `gatehouse-ab-${process.pid}-${name}`
    // The rate limits are raised, not switched off, so that the limiters' own cost stays in (as in list-users.ts).
    const url: Record<string, string> = pgUrl !== undefined ? { DATABASE_URL: process.env[`AB_PG_URL_${name}`] ?? pgUrl } : {}
    const env = childEnv({ HOST, PORT: String(port), ...database[name].env, ...url, PGAPPNAME: appName, RATE_LIMIT_PER_CREDENTIAL: '1000000000', RATE_LIMIT_PER_ADDRESS: '1000000000', GATEHOUSE_ADMIN_API_KEY: KEY })
    Object.assign(env, envPairs(`AB_ENV_${name}`))
    const profile = settings.profile === name ? ['--cpu-prof', `--cpu-prof-dir=${join(RESULTS_DIR, `cpu-ab-${name}`)}`] : []
    const child = startChild(`ab-${name}`, BUILDS[name]!, env, [...envWords(`AB_NODE_ARGS_${name}`), ...profile])
    const base = `http://${HOST}:${port}`
    await waitReady(child, `${base}/auth/healthz`)
    const seedFile = database[name].seedAfterStart
    if (seedFile !== undefined) {
      seedSqliteUsers(seedFile, settings.users)
      log(`seeded ${settings.users} users for ${name} = ${BUILDS[name]!}`)
    }
    servers.set(name, { child, base, backends: pgUrl !== undefined ? backendPids(pgUrl, appName) : undefined })
  }

  const paths = uncachedPaths(settings.users)
  const loadOf = (base: string, kind: typeof KINDS[number]): autocannon.Options & { connections: number } => {
    let next = 0
    return kind === 'uncached'
      ? { url: base, connections: settings.connections, headers: { 'x-api-key': KEY }, requests: [{ method: 'GET', setupRequest: (request: autocannon.Request) => ({ ...request, path: paths[next++ % paths.length]! }) }] }
      : { url: `${base}${USERS_PATH}?limit=50`, connections: settings.connections, headers: { 'x-api-key': KEY } }
  }
  // Untimed: the first server to read the file pays its pages into the OS cache.
  for (const { child, base } of servers.values()) await measureLoad(`${child.name} preheat`, child, loadOf(base, 'uncached'), { warmupS: 1, durationS: 3 })
  const backendsToo = pgUrl !== undefined ? ' (server + its PostgreSQL backends)' : ''

  const usPerRequest = new Map<string, number[]>()
  for (let round = 0; round < settings.rounds; round++) {
    for (const kind of KINDS) {
      if (settings.only !== undefined && settings.only !== kind) continue
      const names = round % 2 === 0 ? ['A', 'B'] as const : ['B', 'A'] as const
      const measure = async (name: 'A' | 'B'): Promise<LoadRun> => {
        const { child, base, backends } = servers.get(name)!
        const load = settings.paired ? { ...loadOf(base, kind), overallRate: settings.rate } : loadOf(base, kind)
        return await measureLoad(`${name} ${kind}`, child, load, settings.timing, backends)
      }
      const paired = settings.paired ? await Promise.all(names.map(measure)) : undefined
      for (const [i, name] of names.entries()) {
        const m = paired?.[i] ?? await measure(name)
        const { child } = servers.get(name)!
        if (m.result.non2xx > 0 || m.result.errors > 0 || m.serverCpu === null) throw new Error(`${name} ${kind}: ${m.result.non2xx} non-2xx, ${m.result.errors} errors`)
        const backendUs = m.companionCpu?.usPerRequest ?? 0
        const list = usPerRequest.get(`${name} ${kind}`) ?? []
        list.push(m.serverCpu.usPerRequest + backendUs)
        usPerRequest.set(`${name} ${kind}`, list)
        const split = m.companionCpu != null ? ` (${m.serverCpu.usPerRequest.toFixed(1)} server + ${backendUs.toFixed(1)} in ${m.companionCpu.pids} backends)` : ''
        const faults = m.serverCpu.minorFaultsPerRequest !== undefined ? `, ${m.serverCpu.minorFaultsPerRequest.toFixed(2)} faults/req` : ''
        log(`round ${round + 1}, ${name} ${kind}: ${(m.serverCpu.usPerRequest + backendUs).toFixed(1)} µs/req${split}${faults}, ${m.summary.reqPerSec.average.toFixed(0)} req/s, p50 / p99 ${m.summary.latencyMs.p50} / ${m.summary.latencyMs.p99} ms, ` +
          `RSS ${mib(rssMiB(child))} MiB (peak ${mib(peakRssMiB(child))}), other CPU ${(m.otherCpu?.cores ?? 0).toFixed(2)} cores, load ${loadavg().map(v => v.toFixed(2)).join(' ')}`)
      }
    }
  }
  const peaks = [...servers].map(([name, { child }]) => `${name} ${mib(peakRssMiB(child))} MiB`)
  await cleanUp()
  process.stdout.write(`most resident memory held: ${peaks.join(', ')}\n`)
  for (const kind of KINDS) {
    const a = usPerRequest.get(`A ${kind}`)
    const b = usPerRequest.get(`B ${kind}`)
    if (a === undefined || b === undefined) continue
    process.stdout.write(`${kind}${backendsToo}: A ${a.map(v => v.toFixed(1)).join(', ')} µs/req; B ${b.map(v => v.toFixed(1)).join(', ')}; B/A per round ${a.map((v, i) => (b[i]! / v).toFixed(3)).join(', ')}\n`)
  }
}

function mib (value: number | null): string {
  return value === null ? '?' : value.toFixed(1)
}

await runBench(main)
