/**
 * `npm run bench:add-column` (issue 39): how long a migration that adds a
 * nullable column to `users` takes at BENCH_USERS users (default 1,000,000),
 * on SQLite and on PostgreSQL, while a second process keeps reading pages and
 * writing users on the same database, and how many of its requests failed.
 *
 * The users are seeded by SQL (bench/search.ts `seedUsers`: a recursive CTE
 * on SQLite, generate_series on PostgreSQL), after this release's migrations.
 * The second process (this file with `--serve`) opens its own handle
 * (createDb, as an instance does) and, one after another without pause,
 * reads a page of 50 at a random place in the default order (listUsers, the
 * list's own read) and changes a random user's `first_name`. The migration is
 * run through Kysely's Migrator as `gatehouse migrate` runs one: this
 * release's migrations and one more, `alter table users add column … text`,
 * in its own transaction. Printed per database: the migration's wall time,
 * and the second process's requests whose time overlapped it (count, failed,
 * slowest). PostgreSQL (BENCH_DATABASE_URL, default the tests' database) gets
 * a schema of its own, dropped at the end. BENCH_ENGINES=sqlite (or postgres)
 * runs one.
 */
import { fork } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Migrator, sql, type Kysely, type Migration } from 'kysely'
import { defaultConfig } from '../src/config.ts'
import { createDb, type Db } from '../src/db/database.ts'
import { migrateToLatest, MIGRATION_NAMES } from '../src/db/migrate.ts'
import { listUsers } from '../src/users/users.repository.ts'
import { envInt, log } from './harness.ts'
import { dropSchema, postgresReachable } from './issue-rows.ts'
import { seedUsers } from './search.ts'

const SELF = fileURLToPath(import.meta.url)
const START = Date.parse('2024-01-01T00:00:00.000Z')
/** What the second process reports: its requests that overlapped the window it was given. */
interface Overlap { requests: number, failed: number, slowestMs: number, errors: string[], total: number }
type Request = [startedAt: number, ms: number, ok: boolean]

function seededId (i: number): string {
  return `00000000-0000-7000-8000-${String(i).padStart(12, '0')}`
}

/** The second process: reads and writes until told the window to report on. */
async function serve (url: string, schema: string | undefined, users: number): Promise<void> {
  const db = createDb(defaultConfig({ databaseUrl: url, databaseSchema: schema }))
  const done: Request[] = []
  const errors = new Set<string>()
  const state = { stopping: false }
  process.on('message', (message: { from: number, to: number }) => {
    state.stopping = true
    const overlapping = done.filter(([at, ms]) => at + ms >= message.from && at <= message.to)
    const report: Overlap = {
      requests: overlapping.length,
      failed: overlapping.filter(([, , ok]) => !ok).length,
      slowestMs: Math.max(0, ...overlapping.map(([, ms]) => ms)),
      errors: [...errors].slice(0, 5),
      total: done.length
    }
    process.send!(report, () => { db.destroy().finally(() => process.exit(0)) })
  })
  process.send!('ready')
  for (let k = 0; !state.stopping; k++) {
    // A turn of the event loop between requests: SQLite's driver never leaves the microtask queue, and the parent's message must get in.
    await new Promise(resolve => setImmediate(resolve))
    const i = Math.floor(Math.random() * users)
    const startedAt = Date.now()
    const began = performance.now()
    try {
      if (k % 2 === 0) {
        await listUsers(db, {}, 'created_at', 50, [new Date(START + i * 1000).toISOString(), seededId(i)])
      } else {
        await db.updateTable('users').set({ first_name: `Bench${k}` }).where('id', '=', seededId(i)).execute()
      }
      done.push([startedAt, performance.now() - began, true])
    } catch (error) {
      errors.add(String(error))
      done.push([startedAt, performance.now() - began, false])
    }
  }
}

/** How long the added migration's own statement took, last time it ran. */
let alterMs = 0

/** This release's migrations, and one more that adds a nullable column to `users`. */
async function migrationsWithNewColumn (): Promise<Record<string, Migration>> {
  const migrations: Record<string, Migration> = {}
  for (const name of MIGRATION_NAMES) migrations[name] = await import(`../src/db/migrations/${name}.ts`) as Migration
  migrations['9999_bench_add_column'] = {
    async up (db: Kysely<any>) {
      const began = performance.now()
      await db.schema.alterTable('users').addColumn('bench_note', 'text').execute()
      alterMs = performance.now() - began
    }
  }
  return migrations
}

interface Row { engine: string, users: number, seedS: number, migrationMs: number, alterMs: number, overlap: Overlap, load: string }

async function measure (engine: 'sqlite' | 'postgres', url: string, schema: string | undefined, users: number): Promise<Row> {
  // Seeding a million users is one statement: no statement timeout for this handle (the second process keeps the default).
  const db: Db = createDb(defaultConfig({ databaseUrl: url, databaseSchema: schema, databaseStatementTimeoutMs: 3_600_000 }))
  try {
    await migrateToLatest(db, schema)
    const seedStart = performance.now()
    log(`${engine}: seeding ${users} users`)
    await seedUsers(db, users)
    const seedS = (performance.now() - seedStart) / 1000
    log(`${engine}: seeded in ${seedS.toFixed(0)} s`)
    const child = fork(SELF, ['--serve', url, schema ?? '', String(users)], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
    const reported = new Promise<Overlap>((resolve, reject) => {
      child.on('message', message => { if (message !== 'ready') resolve(message as Overlap) })
      child.once('exit', code => { reject(new Error(`the second process exited with ${code}`)) })
    })
    await new Promise<void>(resolve => child.once('message', () => { resolve() }))
    // A second of traffic first, so the window starts with the second process in its stride.
    await new Promise(resolve => setTimeout(resolve, 1000))
    // Loaded before the clock starts, as a built release has them in memory.
    const migrations = await migrationsWithNewColumn()
    const migrator = new Migrator({
      db,
      provider: { getMigrations: async () => migrations },
      ...(schema !== undefined ? { migrationTableSchema: schema } : {})
    })
    const from = Date.now()
    const began = performance.now()
    const result = await migrator.migrateUp()
    const migrationMs = performance.now() - began
    const to = Date.now()
    if (result.error !== undefined) throw result.error
    if (result.results?.[0]?.migrationName !== '9999_bench_add_column') throw new Error(`ran ${JSON.stringify(result.results)}`)
    await new Promise(resolve => setTimeout(resolve, 1000))
    child.send({ from, to })
    const overlap = await reported
    const added = await sql<{ n: number }>`select count(*) as n from users where bench_note is null`.execute(db)
    if (Number(added.rows[0]?.n) < users) throw new Error('the new column is not there for every user')
    return { engine, users, seedS, migrationMs, alterMs, overlap, load: loadavg().map(l => l.toFixed(1)).join(' ') }
  } finally {
    await db.destroy()
  }
}

async function main (): Promise<void> {
  const users = envInt('BENCH_USERS', 1_000_000)
  const engines = (process.env.BENCH_ENGINES ?? 'sqlite,postgres').split(',')
  const rows: Row[] = []
  if (engines.includes('sqlite')) {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-add-column-'))
    try {
      rows.push(await measure('sqlite', `sqlite:${join(dir, 'bench.db')}`, undefined, users))
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }
  if (engines.includes('postgres')) {
    const url = process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test'
    const unreachable = await postgresReachable(url)
    if (unreachable !== undefined) throw new Error(`PostgreSQL at ${url}: ${unreachable}`)
    const schema = `bench_add_column_${process.pid}`
    try {
      rows.push(await measure('postgres', url, schema, users))
    } finally {
      await dropSchema(url, schema)
    }
  }
  process.stdout.write('| database | users | migration (ms) | its ALTER TABLE (ms) | requests during it | failed | slowest (ms) | seed (s) | load |\n|---|---|---|---|---|---|---|---|---|\n')
  for (const row of rows) {
    process.stdout.write(`| ${row.engine} | ${row.users.toLocaleString('en')} | ${row.migrationMs.toFixed(1)} | ${row.alterMs.toFixed(1)} | ${row.overlap.requests} | ${row.overlap.failed} | ${row.overlap.slowestMs.toFixed(1)} | ${row.seedS.toFixed(0)} | ${row.load} |\n`)
    if (row.overlap.errors.length > 0) process.stdout.write(`  ${row.engine} errors: ${row.overlap.errors.join('; ')}\n`)
  }
}

if (process.argv[2] === '--serve') await serve(process.argv[3]!, process.argv[4] === '' ? undefined : process.argv[4], Number(process.argv[5]))
else await main()
