/**
 * Issue 20's rows that `npm run bench` measures after issue 8's (the uncached
 * page is measured with the list, in list-users.ts): `/verify` during a
 * sign-in storm (verify-storm.ts), the PostgreSQL page cache's change stamp
 * beside commits elsewhere (change-stamp.ts), and search, filters and the
 * events list among 1,000,000 users and 10,000,000 events (search.ts). Each
 * part runs as its own `npm run bench:…` does, with the settings below; this
 * file only runs them in turn and prints one table with the load average
 * beside each part.
 *
 * Settings of its own, so that issue 8's (BENCH_USERS is the list's 100,000
 * users) do not leak into the parts:
 * - BENCH_ISSUE20=off: skip these parts (the list's rows still print);
 * - BENCH_SEARCH_USERS (1,000,000), BENCH_SEARCH_EVENTS (1000000,10000000):
 *   the sizes of the search part; seeding them is most of this part's time;
 * - BENCH_SAMPLES, BENCH_BUDGET_MS: as for `npm run bench:search`;
 * - BENCH_DURATION, BENCH_WARMUP: seconds per measured load, as for the list.
 */
import { loadavg } from 'node:os'
import { changeStampRows, changeStampSettings } from './change-stamp.ts'
import { envInt, formatTable, log, type IssueRow } from './harness.ts'
import { measureIssue20Search, searchSettings } from './search.ts'
import { stormSettings, verifyStormRows } from './verify-storm.ts'

export interface Issue20Part { name: string, rows: IssueRow[], loadBefore: number[], loadAfter: number[], seconds: number }

const loads = (values: number[]): string => values.map(v => v.toFixed(2)).join(' ')

async function part (name: string, measure: () => Promise<IssueRow[]>): Promise<Issue20Part> {
  const loadBefore = loadavg()
  const started = performance.now()
  log(`issue 20: ${name}, load ${loads(loadBefore)}`)
  const rows = await measure()
  return { name, rows, loadBefore, loadAfter: loadavg(), seconds: (performance.now() - started) / 1000 }
}

/**
 * Runs the parts in turn. `postgresUrl` undefined: SQLite only (the stamp
 * part, PostgreSQL's alone, is then reported as not run). Needs the compiled
 * server (dist/server.js) and harness.ts's run directory, as list-users.ts
 * has them.
 */
export async function measureIssue20Parts (postgresUrl: string | undefined): Promise<Issue20Part[]> {
  const parts: Issue20Part[] = []
  parts.push(await part('/verify during a sign-in storm', async () => (await verifyStormRows({ ...stormSettings(), postgresUrl })).rows))
  parts.push(await part('page cache stamp beside other commits (PostgreSQL)', async () => postgresUrl === undefined
    ? [{ work: 'page cache stamp on PostgreSQL', measured: 'not run: no PostgreSQL (BENCH_PG_URL=off)', goal: '(b) ≈ (a)', met: null }]
    : (await changeStampRows({ ...changeStampSettings(), postgresUrl, users: 1000 })).rows))
  const search = searchSettings()
  parts.push(await part('search, filters and events among millions', async () => await measureIssue20Search({
    ...search,
    users: envInt('BENCH_SEARCH_USERS', 1_000_000),
    eventSizes: (process.env.BENCH_SEARCH_EVENTS ?? '1000000,10000000').split(',').map(Number).filter(n => n > 0),
    postgresUrl,
    engines: postgresUrl === undefined ? ['sqlite'] : ['sqlite', 'postgres']
  })))
  return parts
}

/** Issue 20's table: the list's rows first, then each part's, with the load average around each part. */
export function formatIssue20Table (pageRows: IssueRow[], parts: Issue20Part[]): string {
  const rows = [...pageRows, ...parts.flatMap(p => p.rows)]
  const table = formatTable(['issue 20 row', 'this run', 'goal', 'met'], rows.map(r => [r.work, r.measured, r.goal, r.met === null ? 'n/a' : r.met ? 'yes' : 'NO']))
  const timing = parts.map(p => `  ${p.name}: ${Math.round(p.seconds)} s, load average ${loads(p.loadBefore)} before, ${loads(p.loadAfter)} after`)
  return ['', 'Issue 20, every row as measured in this run:', '', ...table.lines, '', ...timing, ''].join('\n') + '\n'
}
