/**
 * The uncached page (issue 39's first floor): a page of 50 that no cache can answer. Every request
 * carries a different cursor (the keyset position after a different seeded
 * user), so the page cache (src/users/page-cache.ts) never holds the page asked
 * for, and each request reads and renders 50 users from the database. Compared
 * with the bare Fastify route serving a fixed page (bench/bare-server.ts) by
 * server CPU time per response, in interleaved rounds of one run
 * (measurePageRounds); on PostgreSQL the CPU of the server's PostgreSQL
 * backends (found by application_name in pg_stat_activity, read from /proc)
 * is added to the server's.
 *
 * Beside each, its floor: the bare route answering the same uncached pages
 * with gatehouse's own read and nothing else (bench/bare-server.ts,
 * BARE_PAGE_DB). What gatehouse costs above its floor is its request pipeline
 * (hooks, credential, rate limits, log line, cursor and `Link`); what the floor
 * costs above bare is reading the page through the same drivers, which no
 * work on the pipeline can remove.
 *
 * Part of `npm run bench` (bench/list-users.ts); `BENCH_ONLY=uncached npm run bench`
 * runs only these targets and the bare route.
 */
import type autocannon from 'autocannon'
import { loadavg } from 'node:os'
import pg from 'pg'
import { encodeCursor } from '../src/lib/paging.ts'
import { seedRow, USERS_PATH } from './fixtures.ts'
import { childEnv, fmt, formatTable, freePort, HOST, log, measureLoad, startChild, stopChild, waitReady, type Child, type LoadCpu, type LoadSummary } from './harness.ts'

export const UNCACHED_PAGE_SIZE = 50

/**
 * Cursors after seeded users 0 … users − page size − 1, in a scrambled order:
 * every one is a full page, and no two requests of a run ask for the same page
 * unless a run sends more requests than there are users (100,000 by default;
 * the cache holds about 250 pages of 50).
 */
export function uncachedPaths (users: number, pageSize = UNCACHED_PAGE_SIZE): string[] {
  const positions = Math.max(1, users - pageSize - 1)
  const paths: string[] = []
  // A stride prime to the count visits every position once, and neighbouring requests land far apart in the table.
  let stride = 7919
  while (gcd(stride, positions) !== 1) stride++
  for (let k = 0, i = 0; k < positions; k++, i = (i + stride) % positions) {
    const row = seedRow(i)
    // seedRow's id is a fresh uuid v7 of the same instant: created_at alone fixes the position (one user per second).
    paths.push(`${USERS_PATH}?limit=${pageSize}&cursor=${encodeCursor('created_at', [row.created_at, row.id])}`)
  }
  return paths
}

function gcd (a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b)
}

/** The application_name the bench gives the server's PostgreSQL connections (PGAPPNAME), to find their backends. */
export function benchAppName (): string {
  return `gatehouse-bench-${process.pid}`
}

/** Pids of the PostgreSQL backends serving connections named `appName`. */
export function backendPids (url: string, appName: string): () => Promise<number[]> {
  return async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      const { rows } = await client.query<{ pid: number }>('select pid from pg_stat_activity where application_name = $1', [appName])
      return rows.map(row => row.pid)
    } finally {
      await client.end()
    }
  }
}

export interface UncachedMeasurement extends LoadSummary, LoadCpu {
  engine: 'sqlite' | 'postgres'
  distinctPages: number
  non2xx: number
  errors: number
  timeouts: number
  /** Server CPU µs per response, plus its PostgreSQL backends' on PostgreSQL. */
  totalUsPerRequest: number | null
  loadAverage: number[]
}

/**
 * The floor of the uncached page on one database: the bare route answering
 * the same cursors with gatehouse's repository read (`listUsersJson`), through
 * a pool of gatehouse's default size; on PostgreSQL its backends, named
 * `<appName>-floor`, are counted with it.
 */
export async function measureFloor (
  engine: 'sqlite' | 'postgres', databaseUrl: string, schema: string | undefined, users: number,
  timing: { warmupS: number, durationS: number, connections: number }
): Promise<UncachedMeasurement> {
  const port = await freePort()
  const appName = `${benchAppName()}-floor`
  const child: Child = startChild(`bare+page-${engine}`, 'bench/bare-server.ts', childEnv({
    PORT: String(port),
    BARE_PAGE_DB: databaseUrl,
    ...(schema !== undefined ? { BARE_PAGE_SCHEMA: schema } : {}),
    PGAPPNAME: appName,
    // The floor is to show what the read costs. Its small heap let glibc give the top of it back after most
    // requests (the page's 30 to 60 KiB buffers sit there) and fault it in again on the next: 2.5 to 5 minor
    // faults a response in some runs and none in others, which took the floor from 0.80 to 0.31-0.53 of bare.
    // gatehouse's own server had 0.02 a response either way, and keeps glibc's defaults.
    GLIBC_TUNABLES: FLOOR_GLIBC_TUNABLES
  }))
  const base = `http://${HOST}:${port}`
  try {
    await waitReady(child, `${base}${USERS_PATH}?limit=1`)
    return await measureUncached(`bare+page (${engine})`, engine, child, base, '', users, timing,
      engine === 'postgres' ? backendPids(databaseUrl, appName) : undefined)
  } finally {
    await stopChild(child)
  }
}

/** A threshold above anything the floor's heap frees at once, so glibc keeps it (see measureFloor). */
export const FLOOR_GLIBC_TUNABLES = 'glibc.malloc.trim_threshold=268435456'

/** One uncached target: autocannon with a different cursor on every request, the first checked by hand. */
export async function measureUncached (
  name: string, engine: 'sqlite' | 'postgres', child: Child, base: string, key: string, users: number,
  timing: { warmupS: number, durationS: number, connections: number },
  companions?: () => Promise<number[]>
): Promise<UncachedMeasurement> {
  const paths = uncachedPaths(users)
  const check = await fetch(`${base}${paths[1]!}`, { headers: { 'x-api-key': key } })
  const body = await check.json() as Array<{ username: string }>
  if (check.status !== 200 || !Array.isArray(body) || body.length !== UNCACHED_PAGE_SIZE) throw new Error(`${name}: a cursor page answered ${check.status} with ${Array.isArray(body) ? body.length : typeof body} items`)
  let next = 0
  const { result: r, summary, serverCpu, loadGeneratorCpu, otherCpu, companionCpu } = await measureLoad(name, child, {
    url: base,
    connections: timing.connections,
    headers: { 'x-api-key': key },
    requests: [{ method: 'GET', setupRequest: (request: autocannon.Request) => ({ ...request, path: paths[next++ % paths.length]! }) }]
  }, timing, companions)
  const totalUsPerRequest = serverCpu === null ? null : serverCpu.usPerRequest + (companionCpu?.usPerRequest ?? 0)
  return {
    engine,
    distinctPages: Math.min(next, paths.length),
    ...summary,
    serverCpu,
    loadGeneratorCpu,
    otherCpu,
    companionCpu,
    non2xx: r.non2xx,
    errors: r.errors,
    timeouts: r.timeouts,
    totalUsPerRequest,
    loadAverage: loadavg()
  }
}

/** The bare route's measurement as list-users.ts takes it: what the rows divide by. */
export type BareMeasurement = LoadSummary & LoadCpu & { non2xx: number, errors: number, timeouts: number }

/** One database's pair in the page rounds: gatehouse's uncached page and its floor, each measured afresh when called. */
export interface PageEngine {
  engine: 'sqlite' | 'postgres'
  gatehouse: () => Promise<UncachedMeasurement>
  floor: () => Promise<UncachedMeasurement>
}

export interface PageRound {
  /** The targets in the order this round measured them. */
  order: string[]
  bare: BareMeasurement
  engines: Array<{ engine: 'sqlite' | 'postgres', gatehouse: UncachedMeasurement, floor: UncachedMeasurement }>
}

/**
 * Rows 1 and 2 in interleaved rounds: bare, then each database's uncached
 * page and its floor, every round starting one target later than the last,
 * so that each target takes each place in the order once in as many rounds as
 * there are targets. Each ratio is taken within a round, from measurements
 * under a minute apart; the rows are the median of the rounds'. Measured once
 * each, one after another, the floor alone read 0.79 to 0.92 in three runs
 * of one afternoon: more than the changes being
 * judged.
 */
export async function measurePageRounds (bare: () => Promise<BareMeasurement>, engines: PageEngine[], rounds: number): Promise<PageRound[]> {
  const done: PageRound[] = []
  for (let r = 0; r < rounds; r++) {
    let bareResult: BareMeasurement | undefined
    const results = engines.map(e => ({ engine: e.engine, gatehouse: undefined as UncachedMeasurement | undefined, floor: undefined as UncachedMeasurement | undefined }))
    const jobs: Array<{ name: string, run: () => Promise<void> }> = [
      { name: 'bare', run: async () => { bareResult = await bare() } },
      ...engines.flatMap((e, i) => [
        { name: `gatehouse-uncached (${e.engine})`, run: async () => { results[i]!.gatehouse = await e.gatehouse() } },
        { name: `floor (${e.engine})`, run: async () => { results[i]!.floor = await e.floor() } }
      ])
    ]
    const start = r % jobs.length
    const order = [...jobs.slice(start), ...jobs.slice(0, start)]
    for (const job of order) {
      log(`page round ${r + 1} of ${rounds}: ${job.name}`)
      await job.run()
    }
    done.push({
      order: order.map(job => job.name),
      bare: bareResult!,
      engines: results.map(e => ({ engine: e.engine, gatehouse: e.gatehouse!, floor: e.floor! }))
    })
  }
  return done
}

/** Every load the rounds ran, for the run's validity check. */
export function pageRoundMeasurements (rounds: PageRound[]): BareMeasurement[] {
  return rounds.flatMap(round => [round.bare, ...round.engines.flatMap(e => [e.gatehouse, e.floor])])
}

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Median and range of the values that were measured (a round without CPU figures drops out). */
function spread (values: Array<number | null | undefined>, digits: number): { median: number, text: string } | null {
  const known = values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v))
  if (known.length === 0) return null
  const m = median(known)
  const range = known.length > 1 ? ` (${Math.min(...known).toFixed(digits)}–${Math.max(...known).toFixed(digits)})` : ''
  return { median: m, text: `${m.toFixed(digits)}${range}` }
}

const bareUsOf = (round: PageRound): number | null => round.bare.serverCpu?.usPerRequest ?? null
const ratioOf = (bareUs: number | null, m: UncachedMeasurement): number | null =>
  bareUs !== null && m.totalUsPerRequest !== null ? bareUs / m.totalUsPerRequest : null

/** One database's uncached page across the rounds: bare CPU µs/req ÷ gatehouse's (with its PostgreSQL backends), the median of the rounds' ratios. */
export interface PageRatio { engine: 'sqlite' | 'postgres', ratio: number | null, text: string, load: string }

export function pageRatios (rounds: PageRound[]): PageRatio[] {
  const engines = rounds[0]?.engines.map(e => e.engine) ?? []
  return engines.map((engine, i) => {
    const pairs = rounds.map(round => ({ bareUs: bareUsOf(round), bare: round.bare, ...round.engines[i]! }))
    const ratio = spread(pairs.map(p => ratioOf(p.bareUs, p.gatehouse)), 3)
    const floorRatio = spread(pairs.map(p => ratioOf(p.bareUs, p.floor)), 3)
    const us = (values: Array<number | null | undefined>): string => { const s = spread(values, 0); return s === null ? 'n/a' : fmt(s.median) }
    const backends = engine === 'postgres'
      ? ` (${us(pairs.map(p => p.gatehouse.serverCpu?.usPerRequest))} server + ${us(pairs.map(p => p.gatehouse.companionCpu?.usPerRequest))} backends)`
      : ''
    const loads = pairs.map(p => p.gatehouse.loadAverage[0]!)
    return {
      engine,
      ratio: ratio?.median ?? null,
      text: ratio === null
        ? 'n/a'
        : `${ratio.text}, median of ${rounds.length} round${rounds.length === 1 ? '' : 's'}: ${us(pairs.map(p => p.gatehouse.totalUsPerRequest))} µs${backends} vs ${us(pairs.map(p => p.bareUs))} µs; ` +
          `its read alone (the floor target) ${floorRatio?.text ?? 'n/a'}`,
      load: Math.min(...loads) === Math.max(...loads) ? loads[0]!.toFixed(2) : `${Math.min(...loads).toFixed(2)}–${Math.max(...loads).toFixed(2)}`
    }
  })
}

/** Each round's figures: CPU µs per response (with the backends on PostgreSQL), bare ÷ it, the other load on the machine, and the server's minor page faults per response. */
export function formatPageRounds (rounds: PageRound[]): string {
  const faults = (m: BareMeasurement): string => m.serverCpu?.minorFaultsPerRequest === undefined ? '' : `, ${fmt(m.serverCpu.minorFaultsPerRequest, 2)} faults`
  const other = (m: BareMeasurement): string => `${m.otherCpu === null ? 'other n/a' : `other ${fmt(m.otherCpu.cores * 100)}%`}${faults(m)}`
  const bareCell = (round: PageRound): string => { const us = bareUsOf(round); return us === null ? 'n/a' : `${fmt(us, 1)} (${other(round.bare)})` }
  const targetCell = (round: PageRound, m: UncachedMeasurement): string => {
    const ratio = ratioOf(bareUsOf(round), m)
    return m.totalUsPerRequest === null ? 'n/a' : `${fmt(m.totalUsPerRequest, 1)} (${ratio === null ? 'n/a' : ratio.toFixed(3)}, ${other(m)})`
  }
  const engines = rounds[0]?.engines.map(e => e.engine) ?? []
  const body = [
    ['bare', ...rounds.map(bareCell)],
    ...engines.flatMap((engine, i) => [
      [`gatehouse-uncached (${engine})`, ...rounds.map(round => targetCell(round, round.engines[i]!.gatehouse))],
      [`floor (${engine})`, ...rounds.map(round => targetCell(round, round.engines[i]!.floor))]
    ])
  ]
  const table = formatTable(['target: CPU µs/response (bare ÷ it)', ...rounds.map((round, r) => `round ${r + 1}, from ${round.order[0]}`)], body)
  return ['', 'The uncached page in interleaved rounds:', '', ...table.lines, ''].join('\n') + '\n'
}
