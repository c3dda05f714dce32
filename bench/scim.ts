/**
 * `npm run bench:scim`: SCIM provisioning against the real server (the
 * compiled `dist/server.js`, a child process, loopback only).
 *
 * 1. Initial sync, Entra-style, on SQLite (and on PostgreSQL when
 *    BENCH_DATABASE_URL is set): for each of BENCH_SCIM_USERS users (default
 *    10,000) a `GET /Users?filter=userName eq "…"` then a `POST /Users`, as
 *    Entra's provisioning does on its first cycle; then for each of
 *    BENCH_SCIM_GROUPS groups (default 200) a lookup by displayName, a
 *    `POST /Groups` and PATCHes adding its members (every user is in one
 *    group). BENCH_SCIM_CONCURRENCY requests at once (default 8). The users/s
 *    of the sync is given as a ratio of plain `POST /auth/api/users` creates
 *    (no password, as SCIM sends none) in the same run, same concurrency,
 *    on a server of its own with an empty database.
 * 2. `userName eq` latency at 100,000 users, on each database: the users
 *    table is filled to 100,000 rows straight in the database, then
 *    BENCH_SCIM_LOOKUPS sequential `GET /Users?filter=userName eq "…"` for
 *    random users; p50, p90 and p99 in ms, measured by the client.
 *
 * Prints a table, writes bench/results/scim-<timestamp>.json. Exit code 0
 * when every request succeeded, 1 otherwise.
 */
import { randomBytes, randomUUID } from 'node:crypto'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import pg from 'pg'
import {
  childEnv, cleanUp, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, log, machineInfo,
  makeTmpDir, runBench, startChild, stopChild, waitReady, writeResults, ROOT
} from './harness.ts'

const USERS = envInt('BENCH_SCIM_USERS', 10_000)
const GROUPS = envInt('BENCH_SCIM_GROUPS', 200)
const CONCURRENCY = envInt('BENCH_SCIM_CONCURRENCY', 8)
const REST_CREATES = envInt('BENCH_SCIM_REST_CREATES', 3_000)
const LOOKUP_USERS = 100_000
const LOOKUPS = envInt('BENCH_SCIM_LOOKUPS', 1_000)
const PG_URL = process.env.BENCH_DATABASE_URL ?? ''
const SERVER = join(ROOT, 'dist', 'server.js')

interface Server { base: string, adminKey: string, stop: () => Promise<void> }

async function startServer (name: string, database: Record<string, string>): Promise<Server> {
  const port = await freePort()
  const adminKey = `gatehouse_bench_${randomBytes(24).toString('hex')}`
  const child = startChild(name, SERVER, childEnv({
    HOST,
    PORT: String(port),
    GATEHOUSE_ADMIN_API_KEY: adminKey,
    // One key makes every request of a phase; the per-credential limit is a production guard, raised (not off) so its cost stays in.
    RATE_LIMIT_PER_CREDENTIAL: '1000000000',
    RATE_LIMIT_PER_ADDRESS: '1000000000',
    LOG_LEVEL: 'warn',
    ...database
  }))
  const base = `http://${HOST}:${port}/auth`
  await waitReady(child, `${base}/readyz`)
  return { base, adminKey, stop: async () => { await stopChild(child) } }
}

async function call (url: string, init: { method: string, headers: Record<string, string>, body?: unknown }): Promise<{ status: number, json: any }> {
  const res = await fetch(url, { method: init.method, headers: init.headers, ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}) })
  const text = await res.text()
  if (res.status >= 400) throw new Error(`${init.method} ${url}: ${res.status} ${text.slice(0, 300)}`)
  return { status: res.status, json: text === '' ? undefined : JSON.parse(text) }
}

/** Runs `work(i)` for i in [0, count) with `CONCURRENCY` at once; seconds taken. */
async function inParallel (count: number, work: (i: number) => Promise<void>): Promise<number> {
  const started = performance.now()
  let next = 0
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < count) await work(next++)
  }))
  return (performance.now() - started) / 1000
}

async function scimKeyOf (server: Server): Promise<Record<string, string>> {
  const made = await call(`${server.base}/api/api-keys`, { method: 'POST', headers: { 'x-api-key': server.adminKey, 'content-type': 'application/json' }, body: { name: 'bench', scopes: ['scim'] } })
  return { authorization: `Bearer ${made.json.key as string}`, 'content-type': 'application/scim+json' }
}

async function restCreates (server: Server): Promise<number> {
  const headers = { 'x-api-key': server.adminKey, 'content-type': 'application/json' }
  const seconds = await inParallel(REST_CREATES, async (i) => {
    await call(`${server.base}/api/users`, { method: 'POST', headers, body: { username: `rest.user${i}`, email: `rest.user${i}@example.org`, first_name: 'Rest', last_name: `User${i}` } })
  })
  return REST_CREATES / seconds
}

interface Sync { usersPerSecond: number, userSeconds: number, groupSeconds: number, memberPatches: number }

async function entraSync (server: Server): Promise<Sync> {
  const headers = await scimKeyOf(server)
  const scim = `${server.base}/scim/v2`
  const ids: string[] = new Array(USERS)
  const userSeconds = await inParallel(USERS, async (i) => {
    const userName = `sync.user${i}@contoso.example`
    const found = await call(`${scim}/Users?filter=${encodeURIComponent(`userName eq "${userName}"`)}`, { method: 'GET', headers })
    if (found.json.totalResults !== 0) throw new Error(`${userName} exists before its create`)
    const made = await call(`${scim}/Users`, {
      method: 'POST',
      headers,
      body: {
        schemas: ['urn:ietf:params:scim:schemas:core:2.0:User', 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'],
        externalId: randomUUID(),
        userName,
        active: true,
        displayName: `Sync User ${i}`,
        emails: [{ primary: true, type: 'work', value: userName }],
        name: { formatted: `Sync User ${i}`, familyName: `User${i}`, givenName: 'Sync' },
        'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User': { department: `dept${i % 20}` }
      }
    })
    ids[i] = made.json.id
  })
  let memberPatches = 0
  const perGroup = Math.ceil(USERS / GROUPS)
  const groupSeconds = await inParallel(GROUPS, async (g) => {
    const displayName = `sync-group-${g}`
    const found = await call(`${scim}/Groups?filter=${encodeURIComponent(`displayName eq "${displayName}"`)}&excludedAttributes=members`, { method: 'GET', headers })
    if (found.json.totalResults !== 0) throw new Error(`${displayName} exists before its create`)
    const made = await call(`${scim}/Groups`, { method: 'POST', headers, body: { schemas: ['urn:ietf:params:scim:schemas:core:2.0:Group'], externalId: randomUUID(), displayName, members: [] } })
    const members = ids.slice(g * perGroup, (g + 1) * perGroup)
    // Entra adds members in PATCHes of a few members each.
    for (let i = 0; i < members.length; i += 10) {
      await call(`${scim}/Groups/${made.json.id as string}`, {
        method: 'PATCH',
        headers,
        body: { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Add', path: 'members', value: members.slice(i, i + 10).map(value => ({ value })) }] }
      })
      memberPatches++
    }
  })
  return { usersPerSecond: USERS / userSeconds, userSeconds, groupSeconds, memberPatches }
}

const SEED_COLUMNS = 'id, username, username_key, email, email_key, first_name, last_name, role, groups, disabled, version, created_at, updated_at'

/** Fills the users table to `upTo` rows with seed.user0 … seed.user<n-1>, n being what was missing. */
function seedSqlite (file: string, upTo: number): void {
  const db = new Database(file)
  db.pragma('busy_timeout = 10000')
  const have = (db.prepare('select count(*) as n from users').get() as { n: number }).n
  const insert = db.prepare(`insert into users (${SEED_COLUMNS}) values (?, ?, ?, ?, ?, 'Seed', 'User', 'user', '[]', 0, 1, ?, ?)`)
  const now = new Date().toISOString()
  db.transaction(() => {
    for (let i = 0; i < upTo - have; i++) {
      const name = `seed.user${i}@contoso.example`
      insert.run(randomUUID(), name, name, name, name, now, now)
    }
  })()
  db.close()
}

async function seedPostgres (url: string, schema: string, upTo: number): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query(`select count(*)::int as n from "${schema}".users`)
    await client.query(`insert into "${schema}".users (${SEED_COLUMNS})
      select gen_random_uuid(), 'seed.user' || i || '@contoso.example', 'seed.user' || i || '@contoso.example', 'seed.user' || i || '@contoso.example',
             'seed.user' || i || '@contoso.example', 'Seed', 'User', 'user', '[]'::jsonb, false, 1, now(), now()
      from generate_series(0, $1::int - 1) as i`, [upTo - Number(rows[0].n)])
    await client.query(`analyze "${schema}".users`)
  } finally {
    await client.end()
  }
}

interface Latency { p50: number, p90: number, p99: number, max: number }

async function lookupLatency (server: Server, names: (i: number) => string, population: number): Promise<Latency> {
  const headers = await scimKeyOf(server)
  const once = async (): Promise<number> => {
    const userName = names(Math.floor(Math.random() * population))
    const started = performance.now()
    const res = await call(`${server.base}/scim/v2/Users?filter=${encodeURIComponent(`userName eq "${userName}"`)}`, { method: 'GET', headers })
    const ms = performance.now() - started
    if (res.json.totalResults !== 1) throw new Error(`${userName}: ${JSON.stringify(res.json).slice(0, 200)}`)
    return ms
  }
  for (let i = 0; i < 100; i++) await once()
  const times: number[] = []
  for (let i = 0; i < LOOKUPS; i++) times.push(await once())
  times.sort((a, b) => a - b)
  const at = (q: number): number => times[Math.min(times.length - 1, Math.floor(q * times.length))]!
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: times.at(-1)! }
}

async function main (): Promise<void> {
  installCleanUp({ keepTmp: process.env.BENCH_KEEP_TMP !== undefined })
  const tmp = makeTmpDir('gatehouse-bench-scim-')
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const databases: Array<{ name: string, env: (tag: string) => Record<string, string>, seed: (tag: string) => Promise<void> }> = [{
    name: 'sqlite',
    env: (tag) => ({ DATABASE_URL: `sqlite:${join(tmp, `${tag}.db`)}` }),
    seed: async (tag) => { seedSqlite(join(tmp, `${tag}.db`), LOOKUP_USERS) }
  }]
  const schemas: string[] = []
  if (PG_URL !== '') {
    databases.push({
      name: 'postgres',
      env: (tag) => {
        const schema = `bench_scim_${tag}_${randomBytes(3).toString('hex')}`
        schemas.push(schema)
        return { DATABASE_URL: PG_URL, DATABASE_SCHEMA: schema }
      },
      seed: async () => { await seedPostgres(PG_URL, schemas.at(-1)!, LOOKUP_USERS) }
    })
  }
  const report: Record<string, unknown> = { machine: machineInfo(), git: gitInfo(), settings: { USERS, GROUPS, CONCURRENCY, REST_CREATES, LOOKUP_USERS, LOOKUPS } }
  const rows: string[][] = []
  try {
    for (const database of databases) {
      log(`${database.name}: ${REST_CREATES} plain creates through POST /auth/api/users`)
      const rest = await startServer(`${database.name}-rest`, database.env('rest'))
      const restRate = await restCreates(rest)
      await rest.stop()

      log(`${database.name}: Entra-style initial sync of ${USERS} users and ${GROUPS} groups`)
      const server = await startServer(`${database.name}-scim`, database.env('scim'))
      const sync = await entraSync(server)
      log(`${database.name}: filling the users table to ${LOOKUP_USERS} rows, then ${LOOKUPS} userName eq lookups`)
      await database.seed('scim')
      const latency = await lookupLatency(server, i => `seed.user${i}@contoso.example`, LOOKUP_USERS - USERS)
      await server.stop()

      report[database.name] = { restCreatesPerSecond: restRate, sync, usernameEqAt100k: latency }
      rows.push([database.name, fmt(restRate), fmt(sync.usersPerSecond), fmt(sync.usersPerSecond / restRate, 2), fmt(sync.groupSeconds, 1), fmt(latency.p50, 2), fmt(latency.p90, 2), fmt(latency.p99, 2)])
    }
  } finally {
    if (schemas.length > 0) {
      const client = new pg.Client({ connectionString: PG_URL })
      await client.connect()
      for (const schema of schemas) await client.query(`drop schema if exists "${schema}" cascade`)
      await client.end()
    }
  }
  const { lines } = formatTable(['database', 'REST creates/s', 'SCIM sync users/s', 'ratio', `${GROUPS} groups (s)`, 'userName eq p50 ms', 'p90 ms', 'p99 ms'], rows)
  process.stdout.write(lines.join('\n') + '\n')
  writeResults('scim', stamp, report)
  await cleanUp()
}

await runBench(main)
