/**
 * `npm run bench:backup`: how long do `gatehouse backup`, `gatehouse backup
 * --verify` and `gatehouse restore` take (the CLI, as a process, wall clock
 * including its start), and how large is the file, at BENCH_BACKUP_USERS
 * users (default 100,000), each with its `user.created` event and a
 * membership of one group, on SQLite and, with BENCH_DATABASE_URL, on
 * PostgreSQL?
 *
 * The SQLite database is seeded directly (bench/fixtures.ts); PostgreSQL is
 * seeded by restoring the SQLite backup into a schema of its own (that
 * restore is the "SQLite → PostgreSQL" row), which is then backed up and
 * restored into a new SQLite file ("PostgreSQL → SQLite"). Prints a table,
 * writes bench/results/backup-<timestamp>.json, and drops what it made.
 */
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { loadavg } from 'node:os'
import { mkdirSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { v7 } from 'uuid'
import pg from 'pg'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { defaultConfig } from '../src/config.ts'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import { seedSqliteUsers } from './fixtures.ts'
import { childEnv, envInt, installCleanUp, log, makeTmpDir, RESULTS_DIR, ROOT } from './harness.ts'

const USERS = envInt('BENCH_BACKUP_USERS', 100_000)
const PG_URL = process.env.BENCH_DATABASE_URL ?? ''
const BIN = join(ROOT, 'bin', 'gatehouse.js')

interface Step { step: string, seconds: number, fileMiB: number | null, rows: number | null }

async function cli (args: string[], env: Record<string, string>): Promise<{ seconds: number, report: Record<string, any> }> {
  const started = performance.now()
  const child = spawn(process.execPath, [BIN, ...args, '--json'], { cwd: ROOT, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  const [code] = await once(child, 'close') as [number | null]
  const seconds = (performance.now() - started) / 1000
  if (code !== 0) throw new Error(`gatehouse ${args.join(' ')} exited ${String(code)}: ${stderr}`)
  return { seconds, report: JSON.parse(stdout) }
}

const rowsOf = (report: Record<string, any>): number => Object.values(report.tables as Record<string, { rows: number }>).reduce((sum, t) => sum + t.rows, 0)
const mib = (path: string): number => statSync(path).size / 1024 / 1024

async function seedSqlite (path: string): Promise<void> {
  const db = createDb(defaultConfig({ databaseUrl: `sqlite:${path}` }))
  try { await migrateToLatest(db) } finally { await db.destroy() }
  seedSqliteUsers(path, USERS)
  const sqlite = new Sqlite(path)
  try {
    const groupId = v7()
    const at = new Date().toISOString()
    sqlite.prepare('insert into groups (id, display_name, name_key, external_id, version, created_at, updated_at) values (?, ?, ?, null, 1, ?, ?)').run(groupId, 'etl', 'etl', at, at)
    const member = sqlite.prepare('insert into group_members (group_id, user_id) values (?, ?)')
    const event = sqlite.prepare("insert into events (id, type, occurred_at, actor_type, actor_id, target_type, target_id, request_id, client_ip, data) values (?, 'user.created', ?, 'api_key', 'bench', 'user', ?, null, '127.0.0.1', ?)")
    const users = sqlite.prepare('select id, username, created_at from users').all() as Array<{ id: string, username: string, created_at: string }>
    sqlite.transaction(() => {
      for (const user of users) {
        member.run(groupId, user.id)
        event.run(v7(), user.created_at, user.id, JSON.stringify({ username: user.username, role: 'user', groups: ['etl'] }))
      }
    })()
    sqlite.pragma('wal_checkpoint(TRUNCATE)')
  } finally {
    sqlite.close()
  }
}

async function main (): Promise<void> {
  installCleanUp({ keepTmp: false })
  const dir = makeTmpDir('gatehouse-bench-backup-')
  const steps: Step[] = []
  const source = join(dir, 'source.db')
  log(`seeding ${USERS} users, their events and memberships into SQLite`)
  await seedSqlite(source)
  const sqliteEnv = { DATABASE_URL: `sqlite:${source}` }

  const sqliteFile = join(dir, 'sqlite.backup.gz')
  const backup = await cli(['backup', sqliteFile], sqliteEnv)
  steps.push({ step: 'backup, SQLite', seconds: backup.seconds, fileMiB: mib(sqliteFile), rows: rowsOf(backup.report) })
  const verify = await cli(['backup', '--verify', sqliteFile], {})
  steps.push({ step: 'backup --verify (SQLite file)', seconds: verify.seconds, fileMiB: mib(sqliteFile), rows: rowsOf(verify.report) })
  const restore = await cli(['restore', sqliteFile], { DATABASE_URL: `sqlite:${join(dir, 'restored.db')}` })
  steps.push({ step: 'restore, SQLite → SQLite', seconds: restore.seconds, fileMiB: null, rows: rowsOf(restore.report) })

  if (PG_URL !== '') {
    const schema = `gh_bench_backup_${randomBytes(4).toString('hex')}`
    const pgEnv = { DATABASE_URL: PG_URL, DATABASE_SCHEMA: schema }
    try {
      const into = await cli(['restore', sqliteFile], pgEnv)
      steps.push({ step: 'restore, SQLite → PostgreSQL', seconds: into.seconds, fileMiB: null, rows: rowsOf(into.report) })
      const pgFile = join(dir, 'postgres.backup.gz')
      const pgBackup = await cli(['backup', pgFile], pgEnv)
      steps.push({ step: 'backup, PostgreSQL', seconds: pgBackup.seconds, fileMiB: mib(pgFile), rows: rowsOf(pgBackup.report) })
      const pgVerify = await cli(['backup', '--verify', pgFile], {})
      steps.push({ step: 'backup --verify (PostgreSQL file)', seconds: pgVerify.seconds, fileMiB: mib(pgFile), rows: rowsOf(pgVerify.report) })
      const back = await cli(['restore', pgFile], { DATABASE_URL: `sqlite:${join(dir, 'from-postgres.db')}` })
      steps.push({ step: 'restore, PostgreSQL → SQLite', seconds: back.seconds, fileMiB: null, rows: rowsOf(back.report) })
    } finally {
      const client = new pg.Client({ connectionString: PG_URL })
      await client.connect()
      await client.query(`drop schema if exists "${schema}" cascade`)
      await client.end()
    }
  }

  const load = loadavg().map(n => n.toFixed(2)).join(' ')
  process.stdout.write(`\n${USERS} users (${steps[0]!.rows} rows in all), SQLite file ${mib(source).toFixed(1)} MiB; load average at the end ${load}\n\n`)
  process.stdout.write('| step | seconds | file MiB | rows |\n| --- | --- | --- | --- |\n')
  for (const s of steps) process.stdout.write(`| ${s.step} | ${s.seconds.toFixed(1)} | ${s.fileMiB?.toFixed(1) ?? ''} | ${s.rows ?? ''} |\n`)
  mkdirSync(RESULTS_DIR, { recursive: true })
  const out = join(RESULTS_DIR, `backup-${new Date().toISOString().replace(/[:.]/g, '-')}.json`)
  writeFileSync(out, JSON.stringify({ users: USERS, load, steps }, null, 2))
  log(`wrote ${out}`)
}

main().catch((error: unknown) => {
  process.stderr.write(`[bench:backup] ${(error as Error).stack ?? String(error)}\n`)
  process.exitCode = 1
})
