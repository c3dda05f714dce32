/**
 * Issue 20, "also measured": does the users page cache on PostgreSQL keep
 * hitting while other work commits beside it, and what does its change
 * stamp (migration 0019) cost writers? See bench/README.md.
 *
 *   npm run bench:stamp
 *   BENCH_DURATION=5 BENCH_WARMUP=2 npm run bench:stamp
 *
 * One PostgreSQL schema (`gatehouse_stamp_<pid>`) with BENCH_USERS users
 * (default 1,000) and the compiled server on it; the repeated page of 50
 * (autocannon, BENCH_CONNECTIONS connections, default 20) with:
 *   (a) nothing else committing,
 *   (b) ~BENCH_COMMITS_PER_S commits/s (default 20) in ANOTHER database of
 *       the same server (`gatehouse_stamp_other_<pid>`, created and dropped),
 *   (c) the same rate to a table of its own in the SAME schema,
 *   (d) the same rate of updates to users' first names (the stamp must move:
 *       the reference for what a write that matters costs the cache),
 *   (a) again, as the machine drifts over a run; (b) and (c) are compared
 *       with the mean of the two.
 * Each row gives req/s, the server's CPU µs per request, and the cache's hit
 * share (its Prometheus counter, over the warm-up and the measured window).
 * Then the writers' side, with the stamp's triggers enabled and disabled, in
 * the same run (with, without, twice over): PATCH of a user's first name
 * (different users, concurrent), POST of a user without a password, the
 * same number of connections running single-row UPDATEs of users in SQL
 * (the database's side alone, no gatehouse in between), and one transaction
 * inserting BENCH_BULK_ROWS users (default 10,000; an import).
 *
 * `changeStampRows` gives this bench's rows as `{ work, measured, goal, met }`: it
 * needs the compiled server (dist/server.js) and a run directory made by
 * harness.ts `makeTmpDir`.
 */
import { loadavg } from 'node:os'
import { pathToFileURL } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import type autocannon from 'autocannon'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { seedRow, USERS_PATH } from './fixtures.ts'
import { dropSchema, postgresReachable, seedPostgres, startTimed } from './issue-rows.ts'
import {
  childEnv, cleanUp, envInt, fmt, formatTable, freePort, HOST, installCleanUp, log, makeTmpDir, measureLoad, runBench, readAdminKey, stopChild, type Child, type IssueRow
} from './harness.ts'

export interface ChangeStampSettings {
  postgresUrl: string
  users: number
  connections: number
  warmupS: number
  durationS: number
  commitsPerS: number
  bulkRows: number
}

export function changeStampSettings (): ChangeStampSettings {
  return {
    postgresUrl: process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    users: envInt('BENCH_USERS', 1000),
    connections: envInt('BENCH_CONNECTIONS', 20),
    warmupS: envInt('BENCH_WARMUP', 3),
    durationS: envInt('BENCH_DURATION', 10),
    commitsPerS: envInt('BENCH_COMMITS_PER_S', 20),
    bulkRows: envInt('BENCH_BULK_ROWS', 10_000)
  }
}

/** Within this share of (a)'s CPU per request, (b) counts as "the same within noise" (the two quiet runs of one bench differed by 19%: 231 and 194 µs). */
const NOISE = 0.2

const load = (): string => loadavg().map(v => v.toFixed(2)).join(' ')

interface ReadRow { name: string, reqPerSec: number, usPerRequest: number | null, hitShare: number | null, commitsPerS: number | null, load: string, non2xx: number }
interface WriteRow { name: string, triggers: boolean, value: number, unit: string, usPerRequest: number | null, load: string, non2xx: number }

/** Runs the whole measurement; the issue's rows, and the details for the JSON and the README. */
export async function changeStampRows (settings = changeStampSettings()): Promise<{ rows: IssueRow[], reads: ReadRow[], writes: WriteRow[] }> {
  const unreachable = await postgresReachable(settings.postgresUrl)
  if (unreachable !== undefined) {
    return { rows: [{ work: 'page cache stamp on PostgreSQL', measured: `not run: ${unreachable}`, goal: '(b) ≈ (a)', met: false }], reads: [], writes: [] }
  }
  const schema = `gatehouse_stamp_${process.pid}`
  const otherDatabase = `gatehouse_stamp_other_${process.pid}`
  const admin = new pg.Client({ connectionString: settings.postgresUrl })
  await admin.connect()
  let child: Child | undefined
  try {
    await dropSchema(settings.postgresUrl, schema)
    await admin.query(`drop database if exists "${otherDatabase}"`)
    await admin.query(`create database "${otherDatabase}"`)
    const db = createDb({ databaseUrl: settings.postgresUrl, databaseSchema: schema, databasePoolSize: 1, databaseStatementTimeoutMs: 60_000, databaseQueryTimeoutMs: 61_000, databaseAcquireTimeoutMs: 5000 })
    await migrateToLatest(db, schema)
    await db.destroy()
    await seedPostgres(settings.postgresUrl, schema, settings.users)
    // seedRow's ids have random bits: the seeded users' ids are read back.
    const ids = (await admin.query<{ id: string }>(`select id from "${schema}".users order by created_at, id`)).rows.map(row => row.id)
    await admin.query(`create table "${schema}".stamp_bench_noise (id bigserial primary key, at timestamptz not null default now())`)

    const port = await freePort()
    const base = `http://${HOST}:${port}`
    const started = await startTimed('gatehouse-stamp', childEnv({
      HOST, PORT: String(port), DATABASE_URL: settings.postgresUrl, DATABASE_SCHEMA: schema, RATE_LIMIT_PER_CREDENTIAL: '1000000000', RATE_LIMIT_PER_ADDRESS: '1000000000'
    }), base)
    child = started.child
    const key = await readAdminKey(child)
    const headers = { 'x-api-key': key }
    const pageUrl = `${base}${USERS_PATH}?limit=50`
    const first = await fetch(pageUrl, { headers })
    if (first.status !== 200 || (JSON.parse(await first.text()) as unknown[]).length !== 50) throw new Error(`GET ${pageUrl} did not answer 50 users`)

    const server = child
    const readRun = async (name: string, noise: { url: string, statement: string, values?: () => unknown[] } | undefined): Promise<ReadRow> => {
      const writer = noise === undefined ? undefined : startCommits(noise.url, noise.statement, noise.values ?? (() => []), settings.commitsPerS)
      try {
        // The writer runs during the warm-up too; the hit share counts the warm-up's lookups as well (harness.ts reads nothing between the two).
        const before = { counts: await cacheCounts(base), commits: writer?.commits() ?? 0, at: performance.now() }
        const run = await measureLoad(name, server, { url: pageUrl, connections: settings.connections, headers }, settings)
        const after = await cacheCounts(base)
        const commits = (writer?.commits() ?? 0) - before.commits
        const hits = after.hit - before.counts.hit
        const lookups = hits + (after.miss - before.counts.miss) + (after.resting - before.counts.resting)
        return {
          name,
          reqPerSec: run.summary.reqPerSec.average,
          usPerRequest: run.serverCpu?.usPerRequest ?? null,
          hitShare: lookups === 0 ? null : hits / lookups,
          commitsPerS: writer === undefined ? null : commits * 1000 / (performance.now() - before.at),
          load: load(),
          non2xx: run.result.non2xx + run.result.errors
        }
      } finally {
        await writer?.stop()
      }
    }
    const otherUrl = new URL(settings.postgresUrl)
    otherUrl.pathname = `/${otherDatabase}`
    const other = new pg.Client({ connectionString: otherUrl.toString() })
    await other.connect()
    await other.query('create table stamp_bench_noise (id bigserial primary key, at timestamptz not null default now())')
    await other.end()
    const sameUrl = withSchema(settings.postgresUrl, schema)
    let counter = 0
    const reads: ReadRow[] = []
    reads.push(await readRun('(a) quiet', undefined))
    reads.push(await readRun(`(b) ~${settings.commitsPerS} commits/s in another database`, { url: otherUrl.toString(), statement: 'insert into stamp_bench_noise default values' }))
    reads.push(await readRun(`(c) ~${settings.commitsPerS} commits/s to another table, same schema`, { url: sameUrl, statement: 'insert into stamp_bench_noise default values' }))
    reads.push(await readRun(`(d) ~${settings.commitsPerS} commits/s to users (first_name)`, {
      url: sameUrl, statement: 'update users set first_name = $1 where id = $2', values: () => [`n${counter}`, ids[counter++ % ids.length]]
    }))
    // Quiet again: the machine drifts over a run, and (a) first also pays the server's warming up.
    reads.push(await readRun('(a) quiet, again', undefined))

    // The writers' side: the same work with the triggers and without them, alternating, twice.
    const writes: WriteRow[] = []
    // A round not reported first: the first write load of a run was the slowest in every trial run (the server's write paths warming up).
    for (const triggers of [undefined, true, false, true, false]) {
      await setTriggers(admin, schema, triggers ?? true)
      let next = 0
      const patch = await measureLoad(`patch (triggers ${triggers === undefined ? 'on, not reported' : triggers ? 'on' : 'off'})`, server, {
        url: base,
        connections: settings.connections,
        requests: [{
          method: 'PATCH',
          setupRequest: (request: autocannon.Request) => ({
            ...request,
            path: `${USERS_PATH}/${ids[next++ % ids.length]!}`,
            headers: { ...headers, 'content-type': 'application/merge-patch+json' },
            body: JSON.stringify({ first_name: `p${next}` })
          })
        }]
      }, settings)
      if (triggers === undefined) continue
      writes.push({ name: 'PATCH first_name, different users', triggers, value: patch.summary.reqPerSec.average, unit: 'req/s', usPerRequest: patch.serverCpu?.usPerRequest ?? null, load: load(), non2xx: patch.result.non2xx + patch.result.errors })
      let made = 0
      const create = await measureLoad(`create (triggers ${triggers ? 'on' : 'off'})`, server, {
        url: `${base}${USERS_PATH}`,
        connections: settings.connections,
        requests: [{
          method: 'POST',
          setupRequest: (request: autocannon.Request) => ({
            ...request, headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify({ username: `stamp.${triggers ? 'on' : 'off'}${writes.length}.${made++}` })
          })
        }]
      }, settings)
      writes.push({ name: 'POST user, no password', triggers, value: create.summary.reqPerSec.average, unit: 'req/s', usPerRequest: create.serverCpu?.usPerRequest ?? null, load: load(), non2xx: create.result.non2xx + create.result.errors })
      const updates = await sqlUpdates(sameUrl, ids, settings.connections, settings.durationS)
      writes.push({ name: `SQL UPDATE of first_name, ${settings.connections} connections, autocommit`, triggers, value: updates, unit: 'commits/s', usPerRequest: null, load: load(), non2xx: 0 })
      const bulkMs = await bulkInsert(sameUrl, settings.bulkRows, settings.users + writes.length * settings.bulkRows)
      writes.push({ name: `one transaction inserting ${fmt(settings.bulkRows)} users`, triggers, value: bulkMs, unit: 'ms', usPerRequest: null, load: load(), non2xx: 0 })
    }
    await setTriggers(admin, schema, true)

    const [quietFirst, otherDb, sameDb, , quietAgain] = reads
    const quietReqPerSec = (quietFirst!.reqPerSec + quietAgain!.reqPerSec) / 2
    const ratio = (row: ReadRow | undefined): number => (row?.reqPerSec ?? 0) / Math.max(1, quietReqPerSec)
    const share = (row: ReadRow | undefined): string => row?.hitShare == null ? 'n/a' : `${(row.hitShare * 100).toFixed(1)}% hits`
    const onOff = (name: string): string => {
      const values = (triggers: boolean): string => writes.filter(w => w.name === name && w.triggers === triggers).map(w => fmt(w.value, 0)).join(', ')
      return `${values(true)} with / ${values(false)} without`
    }
    const updatesName = `SQL UPDATE of first_name, ${settings.connections} connections, autocommit`
    // Judged on the server's CPU per request and the hit share: on a shared 2-core machine req/s of the same
    // target swung by 1.6× within one run (quiet, first and last), while CPU µs/request moved by a fifth.
    const quietUs = ((quietFirst!.usPerRequest ?? 0) + (quietAgain!.usPerRequest ?? 0)) / 2
    const cpuRatio = (row: ReadRow | undefined): number => (row?.usPerRequest ?? Infinity) / Math.max(1, quietUs)
    const same = (row: ReadRow | undefined): boolean => cpuRatio(row) <= 1 + NOISE && (row?.hitShare ?? 0) >= 0.99
    const measured = (row: ReadRow | undefined): string => `CPU ${fmt(row?.usPerRequest ?? 0)} ÷ ${fmt(quietUs)} µs/req: ${cpuRatio(row).toFixed(2)}; ` +
      `${fmt(row?.reqPerSec ?? 0)} ÷ ${fmt(quietReqPerSec)} req/s: ${ratio(row).toFixed(2)}; ${share(row)}`
    const rows: IssueRow[] = [
      {
        work: `repeated page of 50 on PostgreSQL, ~${settings.commitsPerS} commits/s in another database ÷ quiet (mean of first and last)`,
        measured: measured(otherDb),
        goal: `≈ quiet: CPU ≤ ${(1 + NOISE).toFixed(2)}×, ≥ 99% hits`,
        met: same(otherDb)
      },
      {
        work: `the same, ~${settings.commitsPerS} commits/s to another table of the same database`,
        measured: measured(sameDb),
        goal: `≈ quiet: CPU ≤ ${(1 + NOISE).toFixed(2)}×, ≥ 99% hits`,
        met: same(sameDb)
      },
      {
        work: 'writers with the stamp\'s triggers, with / without: PATCH req/s; POST req/s; SQL updates/s; ms for one transaction of ' + fmt(settings.bulkRows) + ' users',
        measured: `${onOff('PATCH first_name, different users')}; ${onOff('POST user, no password')}; ${onOff(updatesName)}; ${onOff(`one transaction inserting ${fmt(settings.bulkRows)} users`)}`,
        goal: 'report (no goal)',
        met: null
      }
    ]
    return { rows, reads, writes }
  } finally {
    if (child !== undefined) await stopChild(child)
    await admin.query(`drop database if exists "${otherDatabase}" with (force)`).catch((error: Error) => { log(`could not drop ${otherDatabase}: ${error.message}`) })
    await admin.end()
    await dropSchema(settings.postgresUrl, schema)
  }
}

interface CacheCounts { hit: number, miss: number, resting: number }

async function cacheCounts (base: string): Promise<CacheCounts> {
  const text = await (await fetch(`${base}/auth/metrics`)).text()
  const count = (result: string): number => Number(new RegExp(`^gatehouse_users_page_cache_lookups_total\\{result="${result}"\\} (\\d+)`, 'm').exec(text)?.[1] ?? 0)
  return { hit: count('hit'), miss: count('miss'), resting: count('resting') }
}

function withSchema (url: string, schema: string): string {
  const target = new URL(url)
  target.searchParams.set('options', `-c search_path=${schema}`)
  return target.toString()
}

/** A connection committing `statement` about `perSecond` times a second, paced by the clock, until stopped. */
function startCommits (url: string, statement: string, values: () => unknown[], perSecond: number): { commits: () => number, stop: () => Promise<void> } {
  let done = 0
  const state = { stopping: false }
  const running = (async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      const start = performance.now()
      for (let i = 1; !state.stopping; i++) {
        await client.query(statement, values())
        done++
        const wait = start + i * 1000 / perSecond - performance.now()
        if (wait > 0) await sleep(wait)
      }
    } finally {
      await client.end()
    }
  })()
  return { commits: () => done, stop: async () => { state.stopping = true; await running } }
}

/** Switches the stamp's triggers (migration 0019) off and on, for the writers' "without" figures. */
async function setTriggers (admin: pg.Client, schema: string, on: boolean): Promise<void> {
  for (const table of ['users', 'group_members', 'groups']) {
    for (const suffix of ['', '_update', '_truncate']) {
      await admin.query(`alter table "${schema}"."${table}" ${on ? 'enable' : 'disable'} trigger "${table}_page_changed${suffix}"`)
    }
  }
}

/** Commits/s of single-row updates of users' first names from `connections` connections at once, for `seconds`: the database's side alone. */
async function sqlUpdates (url: string, ids: string[], connections: number, seconds: number): Promise<number> {
  const clients = await Promise.all(Array.from({ length: connections }, async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    return client
  }))
  try {
    let done = 0
    const end = performance.now() + seconds * 1000
    await Promise.all(clients.map(async (client, c) => {
      for (let i = c; performance.now() < end; i += connections) {
        await client.query({ name: 'stamp_bench_update', text: 'update users set first_name = $1 where id = $2', values: [`u${i}`, ids[i % ids.length]] })
        done++
      }
    }))
    return done / seconds
  } finally {
    await Promise.all(clients.map(async client => await client.end()))
  }
}

/** Milliseconds to insert `count` users in one transaction, 1,000 rows a statement, as an import does. */
async function bulkInsert (url: string, count: number, offset: number): Promise<number> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const started = performance.now()
    await client.query('begin')
    for (let start = 0; start < count; start += 1000) {
      const rows = Array.from({ length: Math.min(1000, count - start) }, (_, j) => seedRow(offset + start + j))
      const values: unknown[] = []
      const tuples = rows.map(r => {
        const row = [r.id, r.username, r.username_key, r.email, r.email_key, r.role, r.groups, false, r.version, r.created_at, r.updated_at]
        const at = values.length
        values.push(...row)
        return `(${row.map((_, k) => `$${at + k + 1}`).join(', ')})`
      })
      await client.query(`insert into users (id, username, username_key, email, email_key, role, groups, disabled, version, created_at, updated_at) values ${tuples.join(', ')}`, values)
    }
    await client.query('commit')
    return performance.now() - started
  } finally {
    await client.end()
  }
}

async function main (): Promise<void> {
  installCleanUp({ keepTmp: false })
  makeTmpDir('gatehouse-stamp-')
  const settings = changeStampSettings()
  log(`load average before: ${load()}`)
  const { rows, reads, writes } = await changeStampRows(settings)
  const readTable = formatTable(['page of 50, PostgreSQL', 'req/s', 'server CPU µs/req', 'cache hits', 'commits/s beside', 'non-2xx', 'load (1 5 15 min)'], reads.map(r => [
    r.name, fmt(r.reqPerSec, 0), r.usPerRequest === null ? 'n/a' : fmt(r.usPerRequest, 0), r.hitShare === null ? 'n/a' : `${(r.hitShare * 100).toFixed(1)}%`,
    r.commitsPerS === null ? '-' : fmt(r.commitsPerS, 1), String(r.non2xx), r.load
  ]))
  const writeTable = formatTable(['writer', 'triggers', 'measured', 'server CPU µs/req', 'load (1 5 15 min)'], writes.map(w => [
    w.name, w.triggers ? 'on' : 'off', `${fmt(w.value, w.unit === 'ms' ? 0 : 1)} ${w.unit}`, w.usPerRequest === null ? '-' : fmt(w.usPerRequest, 0), w.load
  ]))
  const issueTable = formatTable(['issue 20, also measured', 'this run', 'goal', 'met'], rows.map(r => [r.work, r.measured, r.goal, r.met === null ? 'n/a' : r.met ? 'yes' : 'NO']))
  process.stdout.write(['', `${fmt(settings.users)} users, ${settings.connections} connections, ${settings.warmupS} s warm-up + ${settings.durationS} s per row`, '',
    ...readTable.lines, '', ...writeTable.lines, '', ...issueTable.lines, ''].join('\n') + '\n')
  await cleanUp()
  if ([...reads, ...writes].some(r => r.non2xx > 0)) {
    log('INVALID RUN: non-2xx responses or errors under load')
    process.exitCode = 1
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) await runBench(main)
