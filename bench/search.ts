/**
 * `npm run bench:search` (issue 39's `q=` floor, and the events list): the latency of
 * single requests, one at a time, among 1,000,000 users and millions of
 * events, on SQLite and PostgreSQL, in one run, with the load average.
 *
 * - `q=` (trigram indexes, migration 0016), `group=` and `role=` on
 *   GET /api/users at BENCH_USERS users (default 1,000,000);
 * - GET /api/events?actor_id= and ?target_id= at each size in BENCH_EVENTS
 *   (default 1,000,000 then 10,000,000: the second size shows whether the cost
 *   grows with the table).
 *
 * Every timed request comes after an untimed write to a table of the bench's
 * own, so the users page cache never answers: these are reads of the database.
 * The app runs in this process (buildApp, as the tests build it) behind a real
 * socket on 127.0.0.1; the client is fetch, one request at a time.
 * Rows are seeded by SQL (a recursive CTE on SQLite, generate_series on
 * PostgreSQL), the same rows on both. PostgreSQL (BENCH_DATABASE_URL) gets a
 * schema of its own, dropped at the end. Prints the query plans of the shapes
 * measured (once the first size of events is in), then a table; writes
 * nothing else. BENCH_ENGINES=sqlite (or postgres) runs one; BENCH_EVENTS=0
 * skips the events.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { loadavg, tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { sql, type RawBuilder } from 'kysely'
import { buildApp } from '../src/app.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig } from '../src/config.ts'
import { isPostgres, type Db } from '../src/db/database.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { envInt, fmt, log } from './harness.ts'
import { dropSchema, postgresReachable } from './issue-rows.ts'

export interface SearchSettings {
  users: number
  /** Sizes the events table is filled to in turn; empty: no events. */
  eventSizes: number[]
  samples: number
  /** A shape that is slow (a scan) stops after this long, with the samples it has. */
  budgetMs: number
  /** PostgreSQL; undefined: SQLite only. */
  postgresUrl: string | undefined
  engines: string[]
}

/** The settings `npm run bench:search` takes from its environment (`npm run bench` passes its own: bench/floors.ts). */
export function searchSettings (): SearchSettings {
  return {
    users: envInt('BENCH_USERS', 1_000_000),
    eventSizes: (process.env.BENCH_EVENTS ?? '1000000,10000000').split(',').map(Number).filter(n => n > 0),
    samples: envInt('BENCH_SAMPLES', 100),
    budgetMs: envInt('BENCH_BUDGET_MS', 15_000),
    postgresUrl: process.env.BENCH_DATABASE_URL,
    engines: (process.env.BENCH_ENGINES ?? 'sqlite,postgres').split(',')
  }
}

const FIRST = ['Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Donald', 'Frances', 'Ken']
const LAST = ['Lovelace', 'Hopper', 'Turing', 'Dijkstra', 'Liskov', 'Knuth', 'Allen', 'Thompson']

const loads = (): string => loadavg().map(n => n.toFixed(2)).join(' ')
const userId = (i: number): string => `00000000-0000-7000-8000-${String(i).padStart(12, '0')}`

interface Shape { name: string, path: (k: number) => string }

/** The requests measured; k varies the needle or the id so that no two requests are alike. */
function shapes (events: boolean, users: number): Shape[] {
  const pick = (k: number, n: number): number => (k * 7919 + 13) % n
  if (events) {
    return [
      // 1,000 actors: each acted in one event of 1,000.
      { name: 'events actor_id= (1 in 1,000 events)', path: k => `/auth/api/events?actor_id=${userId(pick(k, 1000))}` },
      // Targets spread over every user: about (events / users) each.
      { name: 'events target_id= (a few events each)', path: k => `/auth/api/events?target_id=${userId(pick(k, users))}` }
    ]
  }
  return [
    // bench.user0123456: ten usernames (and their e-mails) contain user012345.
    { name: 'q= 10 matches (user012345)', path: k => `/auth/api/users?limit=50&q=user${String(pick(k, users / 10)).padStart(6, '0')}` },
    { name: 'q= 1,000 matches (er0012)', path: k => `/auth/api/users?limit=50&q=er${String(pick(k, users / 1000)).padStart(4, '0')}` },
    // A syllable and two digits: `er00`…`er09`, each in the usernames and e-mails of 100,000 users (bench.user00…).
    { name: 'q= syllable + 2 digits, 100,000 matches (er0N)', path: k => `/auth/api/users?limit=50&q=er0${k % 10}` },
    { name: 'q= no match (zqx…)', path: k => `/auth/api/users?limit=50&q=zqx${k}` },
    { name: 'q= 1 in 8 users (hopper, ...)', path: k => `/auth/api/users?limit=50&q=${LAST[k % 8]!.toLowerCase()}` },
    { name: 'q= 2 chars, no match (scan)', path: k => `/auth/api/users?q=${String.fromCharCode(113 + (k % 3))}${String.fromCharCode(120 + (k % 2))}&limit=${1 + (k % 100)}` },
    { name: 'group= 10,000 members (g0..g99)', path: k => `/auth/api/users?limit=50&group=g${k % 100}` },
    { name: 'group= 10,000 members, -updated_at', path: k => `/auth/api/users?limit=50&group=g${k % 100}&sort=-updated_at` },
    { name: 'group= 10 members (tiny)', path: () => '/auth/api/users?limit=50&group=tiny' },
    { name: 'role=admin (1 in 1,000)', path: () => '/auth/api/users?limit=50&role=admin' },
    { name: 'role=user (-created_at)', path: () => '/auth/api/users?limit=50&role=user&sort=-created_at' },
    { name: 'role=admin sort=username', path: () => '/auth/api/users?limit=50&role=admin&sort=username' }
  ]
}

export async function seedUsers (db: Db, count: number): Promise<void> {
  const pgsql = isPostgres(db)
  const trigramIndexes = ['username', 'email', 'first_name', 'last_name'].map(c => sql.id(`users_search_${c}_trgm`))
  if (pgsql) {
    // The trigram indexes take new rows one at a time (fastupdate off, migration 0016); for the
    // seed they gather them and merge once (the vacuum below), as building them on a full table would.
    for (const index of trigramIndexes) await sql`alter index ${index} set (fastupdate = on)`.execute(db)
    await sql`insert into users (id, username, username_key, email, email_key, first_name, last_name, role, groups, disabled, version, created_at, updated_at)
      select ('00000000-0000-7000-8000-' || lpad(i::text, 12, '0'))::uuid,
        'Bench.User' || lpad(i::text, 7, '0'), 'bench.user' || lpad(i::text, 7, '0'),
        'Bench.User' || lpad(i::text, 7, '0') || '@Example.org', 'bench.user' || lpad(i::text, 7, '0') || '@example.org',
        (${sql.lit(`{${FIRST.join(',')}}`)}::text[])[i % 8 + 1], (${sql.lit(`{${LAST.join(',')}}`)}::text[])[i % 8 + 1],
        case when i % 1000 = 0 then 'admin' else 'user' end,
        case when i % 100000 = 7 then jsonb_build_array('g' || (i % 100), 'tiny') else jsonb_build_array('g' || (i % 100)) end,
        false, 1, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second'
      from generate_series(0, ${count - 1}::int) as i`.execute(db)
  } else {
    await sql`with recursive n(i) as (select 0 union all select i + 1 from n where i + 1 < ${count})
      insert into users (id, username, username_key, email, email_key, first_name, last_name, role, groups, disabled, version, created_at, updated_at)
      select '00000000-0000-7000-8000-' || printf('%012d', i),
        'Bench.User' || printf('%07d', i), 'bench.user' || printf('%07d', i),
        'Bench.User' || printf('%07d', i) || '@Example.org', 'bench.user' || printf('%07d', i) || '@example.org',
        json_extract(${JSON.stringify(FIRST)}, '$[' || (i % 8) || ']'), json_extract(${JSON.stringify(LAST)}, '$[' || (i % 8) || ']'),
        case when i % 1000 = 0 then 'admin' else 'user' end,
        case when i % 100000 = 7 then json_array('g' || (i % 100), 'tiny') else json_array('g' || (i % 100)) end,
        0, 1, strftime('%Y-%m-%dT%H:%M:%fZ', 1704067200 + i, 'unixepoch'), strftime('%Y-%m-%dT%H:%M:%fZ', 1704067200 + i, 'unixepoch')
      from n`.execute(db)
  }
  const groupId = (k: number): string => `00000000-0000-7000-9000-${String(k).padStart(12, '0')}`
  const now = new Date().toISOString()
  await db.insertInto('groups').values([...Array.from({ length: 100 }, (_, k) => ({ id: groupId(k), display_name: `g${k}` })), { id: groupId(100), display_name: 'tiny' }]
    .map(g => ({ ...g, name_key: g.display_name, external_id: null, version: 1, created_at: now, updated_at: now }))).execute()
  // The memberships with their users' sort keys (migration 0018) written directly: the trigger that copies them row by row is off meanwhile.
  if (pgsql) {
    await sql`alter table group_members disable trigger group_members_keys`.execute(db)
    await sql`insert into group_members (group_id, user_id, created_at, updated_at, username_key)
      select g.id, u.id, u.created_at, u.updated_at, u.username_key from users u cross join lateral jsonb_array_elements_text(u.groups) as l(name) join groups g on g.display_name = l.name`.execute(db)
    await sql`alter table group_members enable trigger group_members_keys`.execute(db)
    await sql`vacuum analyze users`.execute(db)
    for (const index of trigramIndexes) await sql`alter index ${index} set (fastupdate = off)`.execute(db)
    // Vacuumed and written out now, so that neither autovacuum nor a checkpoint lands in the measurements.
    await sql`vacuum analyze group_members`.execute(db)
    await sql`analyze`.execute(db)
    await sql`checkpoint`.execute(db)
  } else {
    await withoutSqliteObjects(db, "type = 'trigger' and name = 'group_members_keys'", async () => {
      await sql`insert into group_members (group_id, user_id, created_at, updated_at, username_key)
        select g.id, u.id, u.created_at, u.updated_at, u.username_key from users u, json_each(u.groups) l join groups g on g.display_name = l.value`.execute(db)
    })
    await sql`analyze`.execute(db)
    await sql`pragma wal_checkpoint(truncate)`.execute(db)
  }
}

/** Rows per INSERT of the events seed: each its own transaction, so SQLite's WAL is checkpointed between them and stays small. */
const EVENTS_BATCH = 1_000_000

/**
 * Events from..to-1: actor among 1,000 users, target spread over every user,
 * ids in time order. The secondary indexes are dropped first and made again
 * after (each a sort of the whole table), which is what lets 10,000,000
 * events in: an earlier run that kept them, one INSERT of 9,000,000 rows on
 * SQLite, had not finished after 9 minutes (a 4 GB WAL).
 */
async function seedEvents (db: Db, from: number, to: number, users: number): Promise<void> {
  if (isPostgres(db)) {
    const indexes = (await sql<{ name: string, definition: string }>`select indexname as name, indexdef as definition from pg_indexes
      where schemaname = current_schema() and tablename = 'events' and indexname not in (select conname from pg_constraint where conrelid = 'events'::regclass)`.execute(db)).rows
    for (const index of indexes) await sql`drop index ${sql.id(index.name)}`.execute(db)
    for (let start = from; start < to; start += EVENTS_BATCH) {
      await sql`insert into events (id, type, occurred_at, actor_type, actor_id, target_type, target_id, data)
        select ('00000000-0000-7000-a000-' || lpad(i::text, 12, '0'))::uuid, 'user.updated', timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second',
          'user', '00000000-0000-7000-8000-' || lpad(((i * 7919 + 13) % 1000)::text, 12, '0'),
          'user', '00000000-0000-7000-8000-' || lpad(((i::bigint * 104729 + 7) % ${users})::text, 12, '0'), '{}'::jsonb
        from generate_series(${start}::bigint, ${Math.min(to, start + EVENTS_BATCH) - 1}::bigint) as i`.execute(db)
    }
    await db.connection().execute(async conn => {
      await sql`set maintenance_work_mem = '256MB'`.execute(conn)
      for (const index of indexes) await sql.raw(index.definition).execute(conn)
      await sql`reset maintenance_work_mem`.execute(conn)
    })
    await sql`vacuum analyze events`.execute(db)
    await sql`checkpoint`.execute(db)
    return
  }
  await withoutSqliteObjects(db, "type = 'index' and tbl_name = 'events' and sql is not null", async () => {
    for (let start = from; start < to; start += EVENTS_BATCH) {
      await sql`with recursive n(i) as (select ${start} union all select i + 1 from n where i + 1 < ${Math.min(to, start + EVENTS_BATCH)})
        insert into events (id, type, occurred_at, actor_type, actor_id, target_type, target_id, data)
        select '00000000-0000-7000-a000-' || printf('%012d', i), 'user.updated', strftime('%Y-%m-%dT%H:%M:%fZ', 1704067200 + i, 'unixepoch'),
          'user', '00000000-0000-7000-8000-' || printf('%012d', (i * 7919 + 13) % 1000),
          'user', '00000000-0000-7000-8000-' || printf('%012d', (i * 104729 + 7) % ${users}), '{}'
        from n`.execute(db)
    }
  })
  await sql`analyze events`.execute(db)
  await sql`pragma wal_checkpoint(truncate)`.execute(db)
}

/** Runs `work` with the SQLite schema objects (indexes, triggers) this condition selects dropped, and makes them again after. */
async function withoutSqliteObjects (db: Db, where: string, work: () => Promise<void>): Promise<void> {
  const objects = (await sql<{ name: string, type: string, sql: string }>`select name, type, sql from sqlite_master where ${sql.raw(where)}`.execute(db)).rows
  for (const object of objects) await sql`drop ${sql.raw(object.type)} ${sql.id(object.name)}`.execute(db)
  try {
    await work()
  } finally {
    for (const object of objects) await sql.raw(object.sql).execute(db)
  }
}

export interface Row { engine: string, shape: string, size: string, n: number, p50: number, p99: number, max: number, rows: number, load: string }

async function measure (app: FastifyTypeBox, base: string, key: string, engine: string, size: string, shape: Shape, s: SearchSettings): Promise<Row> {
  const times: number[] = []
  let rows = 0
  const started = performance.now()
  // Two untimed requests first: the statement is prepared, the pages it reads are in memory.
  for (let k = -2; k < s.samples; k++) {
    // A write between requests: the page cache's change stamp moves, so the read goes to the database. On
    // PostgreSQL the stamp is users_page_stamp (migration 0019), which a write to another table leaves alone: until
    // 25 November 2026 the repeated shapes (role=, group=tiny, the 8 surnames) were mostly cache hits there.
    await (isPostgres(app.db) ? sql`update users_page_stamp set n = n + 1 where shard = 0` : sql`update bench_tick set n = n + 1`).execute(app.db)
    const t0 = performance.now()
    const url = base + shape.path(k + 2)
    // An untimed request may find its kept-alive connection closed by the server during a long seed: it is sent again.
    const res = k < 0
      ? await fetch(url, { headers: { 'x-api-key': key } }).catch(async () => await fetch(url, { headers: { 'x-api-key': key } }))
      : await fetch(url, { headers: { 'x-api-key': key } })
    const body = await res.text()
    const ms = performance.now() - t0
    if (res.status !== 200) throw new Error(`${shape.path(k + 2)} answered ${res.status}: ${body.slice(0, 300)}`)
    if (k < 0) continue
    times.push(ms)
    rows += (JSON.parse(body) as unknown[]).length
    if (performance.now() - started > s.budgetMs && times.length >= 10) break
  }
  times.sort((a, b) => a - b)
  const q = (p: number): number => times[Math.min(times.length - 1, Math.ceil(p * times.length) - 1)]!
  return { engine, shape: shape.name, size, n: times.length, p50: q(0.5), p99: q(0.99), max: times[times.length - 1]!, rows: Math.round(rows / times.length), load: loads() }
}

/** The SQL of users.repository.ts's page query for a search, to explain. */
const SEARCH_PG = "(username_key like '%user012345%' escape '\\' or email_key like '%user012345%' escape '\\' or lower(first_name) like '%user012345%' escape '\\' or lower(last_name) like '%user012345%' escape '\\')"
const GROUP_PAGE = 'select users.id from group_members cross join users where users.id = group_members.user_id and group_members.group_id = (select groups.id from groups where groups.display_name = $1) order by group_members.created_at, group_members.user_id'

/**
 * The plans of the shapes measured: on PostgreSQL a search as the server
 * runs it (every statement is sent unnamed, planned with its values), and
 * the rest also as generic plans, as a pooler that prepares would run them.
 */
async function plans (db: Db, engine: string): Promise<void> {
  const explained: Array<[string, string[]]> = []
  if (isPostgres(db)) {
    const rows = async (text: string): Promise<string[]> => (await sql.raw<{ 'QUERY PLAN': string }>(text).execute(db)).rows.map(r => r['QUERY PLAN'])
    // As searchPagePostgres asks: the indexes with the needle's uncommon part (`0012`: `ser`, `er0` are in every user, `r00` in
    // one in ten), the whole needle's LIKE on those candidates, then the page's users by primary key.
    explained.push(['q= page (pg_trgm with the uncommon part, then the needle; `er0012`, 1,000 matches), planned with the needle', await rows(`explain
      with c as materialized (select id, created_at as sort_key, username_key, email_key, first_name, last_name from users where ${SEARCH_PG.replaceAll('user012345', '0012')}),
        m as materialized (select id, sort_key from c where ${SEARCH_PG.replaceAll('user012345', 'er0012')} limit 2000)
      select users.*, (select count(*) from m) as matches
      from (select id, sort_key from m order by sort_key, id limit 51) k join users on users.id = k.id order by k.sort_key, k.id`)])
    await sql.raw('set plan_cache_mode = force_generic_plan').execute(db)
    try {
      for (const [name, prepare, execute] of [
        ['group (generic plan)', `prepare bench_plan (text, int) as ${GROUP_PAGE} limit $2`, "explain execute bench_plan('tiny', 51)"],
        ['events by actor (generic plan)', 'prepare bench_plan (text, int) as select id from events where actor_id = $1 order by id desc limit $2', `explain execute bench_plan('${userId(5)}', 101)`],
        ['role (generic plan)', 'prepare bench_plan (text, int) as select id from users where role = $1 order by created_at, id limit $2', "explain execute bench_plan('admin', 51)"],
      ] as const) {
        await sql.raw(prepare).execute(db)
        explained.push([name, await rows(execute)])
        await sql.raw('deallocate bench_plan').execute(db)
      }
    } finally {
      await sql.raw('reset plan_cache_mode').execute(db)
    }
  } else {
    const detail = async (query: RawBuilder<unknown>): Promise<string[]> => (await query.execute(db)).rows.map(r => (r as { detail: string }).detail)
    const like = (needle: string) => sql`(username_key like ${needle} escape '\' or email_key like ${needle} escape '\' or lower(first_name) like ${needle} escape '\' or lower(last_name) like ${needle} escape '\')`
    explained.push(['q (fts5 candidates, then the like)', await detail(sql`explain query plan select id from users where users.rowid in (select users_search.rowid from users_search where users_search match ${'"user012345"'}) and ${like('%user012345%')} order by created_at, id limit 51`)])
    explained.push(['group', await detail(sql`explain query plan ${sql.raw(GROUP_PAGE.replace('$1', "'tiny'"))} limit 51`)])
    explained.push(['role', await detail(sql`explain query plan select id from users where role = ${'admin'} order by created_at, id limit 51`)])
    explained.push(['events by actor', await detail(sql`explain query plan select id from events where actor_id = ${userId(5)} order by id desc limit 101`)])
  }
  for (const [name, plan] of explained) log(`${engine} plan, ${name}:\n    ${plan.join('\n    ')}`)
}

async function runEngine (engine: 'sqlite' | 'postgres', s: SearchSettings): Promise<Row[]> {
  const out: Row[] = []
  const dir = mkdtempSync(join(tmpdir(), 'gatehouse-search-'))
  const schema = `gatehouse_search_${process.pid}`
  const config = engine === 'sqlite'
    ? defaultConfig({ databaseUrl: `sqlite:${join(dir, 'bench.db')}`, logLevel: 'silent', databaseStatementTimeoutMs: 600_000 })
    : defaultConfig({ databaseUrl: s.postgresUrl!, databaseSchema: schema, logLevel: 'silent', databaseStatementTimeoutMs: 1_800_000, databasePoolSize: 2 })
  if (engine === 'postgres') await dropSchema(s.postgresUrl!, schema)
  const app = await buildApp({ config, logger: false })
  try {
    const key = (await bootstrap(app.db, app.passwords, config, app.log)).generatedKey
    if (key === undefined) throw new Error('bootstrap issued no key')
    await sql`create table bench_tick (n integer not null)`.execute(app.db)
    await sql`insert into bench_tick (n) values (0)`.execute(app.db)
    let t0 = performance.now()
    await seedUsers(app.db, s.users)
    log(`${engine}: seeded ${fmt(s.users)} users (with their trigram index and group memberships) in ${fmt((performance.now() - t0) / 1000, 1)} s, load ${loads()}`)
    await app.listen({ host: '127.0.0.1', port: 0 })
    const address = app.server.address()
    if (address === null || typeof address === 'string') throw new Error('no port')
    const base = `http://127.0.0.1:${address.port}`
    for (const shape of shapes(false, s.users)) {
      const row = await measure(app, base, key, engine, `${fmt(s.users)} users`, shape, s)
      log(`${engine} ${row.shape}: p99 ${row.p99.toFixed(1)} ms (n ${row.n}), load ${row.load}`)
      out.push(row)
    }
    let seeded = 0
    for (const size of s.eventSizes) {
      t0 = performance.now()
      await seedEvents(app.db, seeded, size, s.users)
      seeded = size
      log(`${engine}: events now ${fmt(size)}, seeded in ${fmt((performance.now() - t0) / 1000, 1)} s, load ${loads()}`)
      if (size === s.eventSizes[0]) await plans(app.db, engine)
      for (const shape of shapes(true, s.users)) {
        const row = await measure(app, base, key, engine, `${fmt(size)} events`, shape, s)
        log(`${engine} ${row.shape} at ${fmt(size)}: p99 ${row.p99.toFixed(1)} ms (n ${row.n}), load ${row.load}`)
        out.push(row)
      }
    }
  } finally {
    await app.close()
    rmSync(dir, { recursive: true, force: true })
    if (engine === 'postgres') await dropSchema(s.postgresUrl!, schema)
  }
  return out
}

/** Runs every engine of BENCH_ENGINES and returns the measured rows, one per request shape and size. */
export async function runSearchBench (s = searchSettings()): Promise<Row[]> {
  log(`start, load ${loads()}; ${fmt(s.users)} users, events ${s.eventSizes.map(n => fmt(n)).join(' then ')}, ${s.samples} samples a shape`)
  const rows = s.engines.includes('sqlite') ? await runEngine('sqlite', s) : []
  if (!s.engines.includes('postgres')) {
    log('PostgreSQL skipped: not in BENCH_ENGINES')
  } else if (s.postgresUrl !== undefined && s.postgresUrl !== '') {
    const why = await postgresReachable(s.postgresUrl)
    if (why === undefined) rows.push(...await runEngine('postgres', s))
    else log(`PostgreSQL skipped: ${why}`)
  } else {
    log('PostgreSQL skipped: set BENCH_DATABASE_URL')
  }
  return rows
}

/** A needle shorter than a trigram cannot use the trigram indexes: it scans, and is shown beside the row rather than counted in it. */
const isScan = (row: Row): boolean => row.shape.includes('2 chars')

/**
 * The `q=` floor of one database: the worst p99 among the `q=` shapes (3
 * characters or more), and the 2-character needle beside it; undefined when
 * that database was not measured.
 */
export function worstSearch (rows: Row[], engine: string): { worst: Row, scan: Row | undefined, shapes: number } | undefined {
  const searches = rows.filter(r => r.engine === engine && r.shape.startsWith('q='))
  const counted = searches.filter(r => !isScan(r))
  if (counted.length === 0) return undefined
  return { worst: counted.reduce((a, b) => b.p99 > a.p99 ? b : a), scan: searches.find(isScan), shapes: counted.length }
}

async function main (): Promise<void> {
  const rows = await runSearchBench()
  const header = ['engine', 'request', 'size', 'n', 'p50 ms', 'p99 ms', 'max ms', 'rows', 'load (1 5 15 min)']
  const body = rows.map(r => [r.engine, r.shape, r.size, String(r.n), r.p50.toFixed(1), r.p99.toFixed(1), r.max.toFixed(1), String(r.rows), r.load])
  console.log(`| ${header.join(' | ')} |`)
  console.log(`|${header.map(() => '---').join('|')}|`)
  for (const line of body) console.log(`| ${line.join(' | ')} |`)
  for (const engine of ['sqlite', 'postgres']) {
    const found = worstSearch(rows, engine)
    if (found !== undefined) console.log(`\n${engine}: worst q= p99 ${found.worst.p99.toFixed(1)} ms (${found.worst.shape}; floor < 20 ms: ${found.worst.p99 < 20 ? 'met' : 'MISSED'})`)
  }
}

// Standalone (`npm run bench:search`); imported, it only exports its functions.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) await main()
