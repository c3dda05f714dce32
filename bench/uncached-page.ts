/**
 * Issue 20, rows 1 and 2: a page of 50 that no cache can answer. Every request
 * carries a different cursor (the keyset position after a different seeded
 * user), so the page cache (src/users/page-cache.ts) never holds the page asked
 * for, and each request reads and renders 50 users from the database. Compared
 * with the bare Fastify route serving a fixed page (bench/bare-server.ts) by
 * server CPU time per response, measured in the same run; on PostgreSQL the CPU
 * of the server's PostgreSQL backends (found by application_name in
 * pg_stat_activity, read from /proc) is added to the server's.
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
import { childEnv, fmt, formatTable, freePort, HOST, measureLoad, startChild, stopChild, waitReady, type Child, type IssueRow, type LoadCpu, type LoadSummary } from './harness.ts'

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
  /** The floor measured right after it: the bare route with the same read (measureFloor). */
  floor?: UncachedMeasurement
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
    PORT: String(port), BARE_PAGE_DB: databaseUrl, ...(schema !== undefined ? { BARE_PAGE_SCHEMA: schema } : {}), PGAPPNAME: appName
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

const GOALS = { sqlite: 0.6, postgres: 0.4 }

/** Issue 20's rows 1 and 2 from this run: bare CPU µs/req ÷ gatehouse's (with its PostgreSQL backends). */
export function issue20PageRows (bare: { serverCpu: LoadCpu['serverCpu'], reqPerSec: { average: number } }, measured: UncachedMeasurement[]): IssueRow[] {
  const bareUs = bare.serverCpu?.usPerRequest ?? null
  return measured.map(m => {
    const ratio = bareUs !== null && m.totalUsPerRequest !== null ? bareUs / m.totalUsPerRequest : null
    const goal = GOALS[m.engine]
    const pgPart = m.engine === 'postgres' && m.companionCpu !== null && m.companionCpu !== undefined
      ? ` (${fmt(m.serverCpu?.usPerRequest ?? 0)} µs server + ${fmt(m.companionCpu.usPerRequest)} µs in ${m.companionCpu.pids} PostgreSQL backends)`
      : ''
    return {
      work: m.engine === 'sqlite'
        ? 'page of 50, a different cursor every request (no cache hit), SQLite, ÷ bare Fastify serving a fixed 50-user page (CPU µs/req)'
        : 'the same on PostgreSQL (gatehouse + its PostgreSQL backends)',
      measured: ratio === null
        ? 'n/a'
        : `${ratio.toFixed(3)}: ${fmt(m.totalUsPerRequest!)} µs${pgPart} vs ${fmt(bareUs!)} µs; ${fmt(m.reqPerSec.average)} vs ${fmt(bare.reqPerSec.average)} req/s ` +
          `(${(m.reqPerSec.average / bare.reqPerSec.average).toFixed(3)}); load ${m.loadAverage.map(v => v.toFixed(2)).join(' ')}` + floorPart(m.floor, bareUs!),
      goal: `≥ ${goal}`,
      met: ratio === null ? null : ratio >= goal
    }
  })
}

/** The floor beside a row: its cost, and bare ÷ it (what a route doing nothing but this read reached in this run). */
function floorPart (floor: UncachedMeasurement | undefined, bareUs: number): string {
  if (floor?.totalUsPerRequest == null) return ''
  const backends = floor.engine === 'postgres' && floor.companionCpu != null ? ` (${fmt(floor.serverCpu?.usPerRequest ?? 0)} + ${fmt(floor.companionCpu.usPerRequest)} in the backends)` : ''
  return `; floor, bare route + the same read: ${fmt(floor.totalUsPerRequest)} µs${backends}, ${(bareUs / floor.totalUsPerRequest).toFixed(3)}`
}

export function formatIssue20 (rows: IssueRow[]): string {
  const table = formatTable(['issue 20 row', 'this run', 'goal', 'met'], rows.map(r => [r.work, r.measured, r.goal, r.met === null ? 'n/a' : r.met ? 'yes' : 'NO']))
  return ['', 'Issue 20, the uncached page (ratio of CPU time per response, targets measured one after another in this run):', '', ...table.lines, ''].join('\n') + '\n'
}
