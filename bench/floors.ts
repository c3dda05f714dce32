/**
 * Issue 39's floors, the table `npm run bench` ends with: each row as this
 * run measured it, its floor, whether it was met, and the load average when
 * it was measured. A missed floor is a row like any other (the run stays
 * valid); the ratios "no worse than today by more than 10%" are compared with
 * bench/floors-baseline.json, ratios only, never req/s.
 *
 * Also runs the parts of `npm run bench` that bring servers and databases of
 * their own, after the list's servers have stopped: `/verify` and sign-ins in
 * a storm (verify-storm.ts) and `q=` among 1,000,000 users (search.ts).
 */
import { readFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { join } from 'node:path'
import { envInt, fmt, log, ROOT } from './harness.ts'
import { runSearchBench, searchSettings, worstSearch, type Row as SearchRow } from './search.ts'
import type { PageRatio } from './uncached-page.ts'
import { stormSettings, verifyStormRows, type EngineResult as StormResult } from './verify-storm.ts'

export type Engine = 'sqlite' | 'postgres'

export interface FloorRow {
  row: string
  /** This run's figure as printed; `value` is the number compared with the floor (null: not measured). */
  measured: string
  value: number | null
  floor: string
  met: boolean | null
  load: string
}

interface BaselineRatio { what: string, value: number, commit: string, date: string }
type BaselineKey = 'cachedPageSqlite' | 'cachedPagePostgres' | 'verifyStormSqlite' | 'verifyStormPostgres' | 'createSqlite' | 'signInSqlite' | 'signInPostgres'

export const BASELINE_PATH = join(ROOT, 'bench', 'floors-baseline.json')

function baseline (): Record<BaselineKey, BaselineRatio> {
  return (JSON.parse(readFileSync(BASELINE_PATH, 'utf8')) as { ratios: Record<BaselineKey, BaselineRatio> }).ratios
}

/** The 1-, 5- and 15-minute load averages, now. */
export const loadNow = (): string => loadavg().map(v => v.toFixed(2)).join(' ')

/** What the storm and search parts measured, each with the load average around it. */
export interface Parts {
  storm: { results: StormResult[], load: string } | { skipped: string }
  search: { rows: SearchRow[], load: string } | { skipped: string }
}

/** `postgresUrl` undefined: SQLite only. BENCH_SKIP=storm,search leaves parts out. */
export async function measureParts (postgresUrl: string | undefined): Promise<Parts> {
  const skip = (process.env.BENCH_SKIP ?? '').split(/[\s,]+/)
  const around = async <T>(name: string, work: () => Promise<T>): Promise<{ value: T, load: string }> => {
    const before = loadNow()
    log(`${name}, load ${before}`)
    const value = await work()
    return { value, load: `${before} → ${loadNow()}` }
  }
  let storm: Parts['storm'] = { skipped: 'BENCH_SKIP' }
  if (!skip.includes('storm')) {
    const { value, load } = await around('/verify and sign-ins in a storm', async () => await verifyStormRows({ ...stormSettings(), postgresUrl }))
    storm = { results: value.results, load }
  }
  let search: Parts['search'] = { skipped: 'BENCH_SKIP' }
  if (!skip.includes('search')) {
    const { value, load } = await around('q= among millions of users', async () => await runSearchBench({
      ...searchSettings(),
      users: envInt('BENCH_SEARCH_USERS', 1_000_000),
      // The events list is no floor: `npm run bench:search` measures it.
      eventSizes: [],
      postgresUrl,
      engines: postgresUrl === undefined ? ['sqlite'] : ['sqlite', 'postgres']
    }))
    search = { rows: value, load }
  }
  return { storm, search }
}

/** What list-users.ts measured with its own servers, per database (postgres absent: not run). */
export interface ListFigures {
  /** Users seeded for the pages. */
  users: number
  pages: PageRatio[]
  cached: Partial<Record<Engine, { ratio: number, load: string }>>
  create?: { ratio: number, load: string }
  startup: Partial<Record<Engine, { medianMs: number, startsMs: number[], idleRssMiB: number | null, load: string }>>
  postgresSkipped?: string
}

const ENGINES: Engine[] = ['sqlite', 'postgres']
const NAMES: Record<Engine, string> = { sqlite: 'SQLite', postgres: 'PostgreSQL' }
const PAGE_FLOORS: Record<Engine, number> = { sqlite: 0.4, postgres: 0.25 }
const SEARCH_P99_MS = 20
const STARTUP_MS = 500
const IDLE_RSS_MIB = 100
/** "No worse than today by more than 10%". */
const BASELINE_SHARE = 0.9

function notRun (row: string, floor: string, why: string): FloorRow {
  return { row, measured: `not run (${why})`, value: null, floor, met: null, load: '' }
}

function atLeastBaseline (row: string, key: BaselineKey, value: number | undefined, detail: string, load: string, why: string): FloorRow {
  const base = baseline()[key]
  const floor = `≥ ${(base.value * BASELINE_SHARE).toFixed(3)} (0.9 × ${base.value}, ${base.commit} ${base.date})`
  if (value === undefined) return notRun(row, floor, why)
  return { row, measured: `${value.toFixed(3)}${detail}`, value, floor, met: value >= base.value * BASELINE_SHARE, load }
}

/** Every floor of issue 39, from this run's measurements. */
export function floorRows (list: ListFigures, parts: Parts): FloorRow[] {
  const rows: FloorRow[] = []
  const pgWhy = list.postgresSkipped ?? 'no PostgreSQL'
  for (const engine of ENGINES) {
    const row = `uncached page of 50, ${fmt(list.users)} users, ${NAMES[engine]}: bare Fastify CPU ÷ gatehouse's${engine === 'postgres' ? ' (server + backends)' : ''}`
    const page = list.pages.find(p => p.engine === engine)
    rows.push(page === undefined || page.ratio === null
      ? notRun(row, `≥ ${PAGE_FLOORS[engine]}`, engine === 'postgres' ? pgWhy : 'no CPU figures')
      : { row, measured: page.text, value: page.ratio, floor: `≥ ${PAGE_FLOORS[engine]}`, met: page.ratio >= PAGE_FLOORS[engine], load: page.load })
  }
  for (const engine of ENGINES) {
    const row = `q= p99 of single requests, a syllable + 2 digits among the shapes, ${NAMES[engine]}`
    const floor = `< ${SEARCH_P99_MS} ms`
    if ('skipped' in parts.search) { rows.push(notRun(row, floor, parts.search.skipped)); continue }
    const found = worstSearch(parts.search.rows, engine)
    if (found === undefined) { rows.push(notRun(row, floor, engine === 'postgres' ? pgWhy : 'no rows')); continue }
    const { worst, scan, shapes } = found
    rows.push({
      row,
      measured: `${worst.p99.toFixed(1)} ms (${worst.shape}, p50 ${worst.p50.toFixed(1)} ms; worst of ${shapes} shapes at ${worst.size})` +
        (scan !== undefined ? `; 2-character scan ${scan.p99.toFixed(1)} ms, not counted` : ''),
      value: worst.p99,
      floor,
      met: worst.p99 < SEARCH_P99_MS,
      load: worst.load
    })
  }
  for (const engine of ENGINES) {
    const cached = list.cached[engine]
    rows.push(atLeastBaseline(`cached page of 50, ${NAMES[engine]}: req/s ÷ bare Fastify`, engine === 'sqlite' ? 'cachedPageSqlite' : 'cachedPagePostgres',
      cached?.ratio, '', cached?.load ?? '', pgWhy))
  }
  const storm = 'skipped' in parts.storm ? undefined : parts.storm
  for (const engine of ENGINES) {
    const r = storm?.results.find(s => s.engine === engine)
    const why = storm === undefined ? 'BENCH_SKIP' : pgWhy
    rows.push(atLeastBaseline(`/verify while sign-ins run at the argon2id limit ÷ beside a bare argon2id loop, ${NAMES[engine]}`,
      engine === 'sqlite' ? 'verifyStormSqlite' : 'verifyStormPostgres', r?.ratio, r === undefined ? '' : `, storm p99 ${r.stormP99Ms.toFixed(1)} ms`, storm?.load ?? '', why))
  }
  rows.push(atLeastBaseline('create with a password ÷ the argon2id limit, SQLite', 'createSqlite', list.create?.ratio, '', list.create?.load ?? '', 'not measured'))
  for (const engine of ENGINES) {
    const r = storm?.results.find(s => s.engine === engine)
    const ratio = r === undefined || r.hashesPerSec <= 0 ? undefined : r.signIns.signInsPerSec / r.hashesPerSec
    rows.push(atLeastBaseline(`sign-ins alone ÷ a bare argon2id loop, ${NAMES[engine]}`, engine === 'sqlite' ? 'signInSqlite' : 'signInPostgres',
      ratio, r === undefined ? '' : ` (${r.signIns.signInsPerSec.toFixed(1)}/s vs ${r.hashesPerSec.toFixed(1)} hashes/s)`, storm?.load ?? '', storm === undefined ? 'BENCH_SKIP' : pgWhy))
  }
  for (const engine of ENGINES) {
    const s = list.startup[engine]
    const startRow = `start-up to the first answer, median of 5, GATEHOUSE_ADMIN_* set, ${NAMES[engine]}`
    const rssRow = `idle RSS 5 s after start, GATEHOUSE_ADMIN_* set, ${NAMES[engine]}`
    if (s === undefined) {
      rows.push(notRun(startRow, `< ${STARTUP_MS} ms`, pgWhy), notRun(rssRow, `< ${IDLE_RSS_MIB} MiB`, pgWhy))
      continue
    }
    rows.push({ row: startRow, measured: `${s.medianMs.toFixed(0)} ms (${s.startsMs.map(v => v.toFixed(0)).join(', ')})`, value: s.medianMs, floor: `< ${STARTUP_MS} ms`, met: s.medianMs < STARTUP_MS, load: s.load })
    rows.push(s.idleRssMiB === null
      ? notRun(rssRow, `< ${IDLE_RSS_MIB} MiB`, 'no /proc')
      : { row: rssRow, measured: `${s.idleRssMiB.toFixed(1)} MiB`, value: s.idleRssMiB, floor: `< ${IDLE_RSS_MIB} MiB`, met: s.idleRssMiB < IDLE_RSS_MIB, load: s.load })
  }
  return rows
}

/** Every column left-aligned: the cells are sentences, not numbers. */
export function formatFloors (rows: FloorRow[]): string {
  const header = ['row', 'this run', 'floor', 'met', 'load average']
  const body = rows.map(r => [r.row, r.measured, r.floor, r.met === null ? 'n/a' : r.met ? 'yes' : 'MISSED', r.load])
  const widths = header.map((h, i) => Math.max(h.length, ...body.map(cells => cells[i]!.length)))
  const line = (cells: string[]): string => cells.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd()
  const missed = rows.filter(r => r.met === false).length
  return ['', 'Issue 39\'s floors, as measured in this run:', '', line(header), line(widths.map(w => '-'.repeat(w))), ...body.map(line), '',
    `${rows.filter(r => r.met === true).length} met, ${missed} missed, ${rows.filter(r => r.met === null).length} not measured.`, ''].join('\n') + '\n'
}
