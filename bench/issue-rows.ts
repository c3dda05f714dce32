/**
 * What `npm run bench` and the other benchmarks share beside harness.ts: a
 * timed start of the compiled server, its RSS, PostgreSQL's seed and schema,
 * the machine's argon2id limit, and the event loop's p99 from /auth/metrics.
 */
import { readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import { hash } from '@node-rs/argon2'
import pg from 'pg'
import { defaultConfig } from '../src/config.ts'
import { seedRow } from './fixtures.ts'
import { isRunning, log, startChild, tail, type Child } from './harness.ts'

/** Spawns the compiled server and times it from spawn to its first 2xx on /auth/healthz (polled every 10 ms). */
export async function startTimed (name: string, env: NodeJS.ProcessEnv, base: string, nodeArgs: string[] = [], script = 'dist/server.js'): Promise<{ child: Child, startupMs: number }> {
  const started = performance.now()
  const child = startChild(name, script, env, nodeArgs)
  const deadline = Date.now() + 60_000
  while (Date.now() < deadline) {
    if (!isRunning(child)) throw new Error(`${name} exited before it was ready:\n${tail(child.stderrPath)}\n${tail(child.stdoutPath)}`)
    try {
      const res = await fetch(`${base}/auth/healthz`)
      await res.arrayBuffer()
      if (res.ok) return { child, startupMs: performance.now() - started }
    } catch {
      // not listening yet
    }
    await sleep(10)
  }
  throw new Error(`${name} did not answer within 60 s`)
}

/** Resident set size of a process, in MiB, from /proc; null where there is none. */
export function rssMiB (child: Child): number | null {
  return statusMiB(child, 'VmRSS')
}

/** The most the process has held resident since it started (its high-water mark), in MiB; null where there is no /proc. */
export function peakRssMiB (child: Child): number | null {
  return statusMiB(child, 'VmHWM')
}

function statusMiB (child: Child, field: 'VmRSS' | 'VmHWM'): number | null {
  try {
    const status = readFileSync(`/proc/${child.proc.pid!}/status`, 'utf8')
    const kib = new RegExp(`${field}:\\s+(\\d+)`).exec(status)?.[1]
    return kib === undefined ? null : Number(kib) / 1024
  } catch {
    return null
  }
}

/** A PostgreSQL database reachable at `url`, or why not. */
export async function postgresReachable (url: string): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 })
  try {
    await client.connect()
    await client.query('select 1')
    return undefined
  } catch (error) {
    return (error as Error).message
  } finally {
    await client.end().catch(() => {})
  }
}

/** Inserts the same rows as the SQLite seed (fixtures.ts), 1,000 per statement, into `schema`.users. */
export async function seedPostgres (url: string, schema: string, count: number): Promise<void> {
  const client = new pg.Client({ connectionString: url, options: `-c search_path=${schema}` })
  await client.connect()
  try {
    const columns = ['id', 'username', 'username_key', 'email', 'email_key', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'version', 'created_at', 'updated_at']
    for (let start = 0; start < count; start += 1000) {
      const rows = Array.from({ length: Math.min(1000, count - start) }, (_, j) => seedRow(start + j))
      const values: unknown[] = []
      const tuples = rows.map(r => {
        const row = [r.id, r.username, r.username_key, r.email, r.email_key, r.first_name, r.last_name, r.role, r.groups, false, r.version, r.created_at, r.updated_at]
        const base = values.length
        values.push(...row)
        return `(${row.map((_, k) => `$${base + k + 1}`).join(', ')})`
      })
      await client.query(`insert into users (${columns.join(', ')}) values ${tuples.join(', ')}`, values)
    }
    await client.query('analyze users')
    // The seed's pages go to disk now, not during the timed start that follows (whose first commit
    // would wait behind them). CHECKPOINT needs a superuser or pg_checkpoint; without, the start pays.
    await client.query('checkpoint').catch((error: Error) => { log(`no CHECKPOINT after seeding (${error.message})`) })
  } finally {
    await client.end()
  }
}

export async function dropSchema (url: string, schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await client.query(`drop schema if exists "${schema}" cascade`)
  } finally {
    await client.end()
  }
}

export const BENCH_PASSWORD = 'correct horse battery staple'

/**
 * What this machine can hash, argon2id at gatehouse's default parameters,
 * `concurrency` at a time (HASH_CONCURRENCY's default, one per CPU but one), for
 * `seconds`, in this process with nothing else running: the ceiling for
 * creates with a password.
 */
export async function argon2Limit (seconds: number, concurrency = defaultConfig().hashConcurrency): Promise<{ hashesPerSec: number, concurrency: number }> {
  const config = defaultConfig()
  const options = { memoryCost: config.argon2MemoryKib, timeCost: config.argon2TimeCost, parallelism: config.argon2Parallelism, algorithm: 2 as const }
  const end = performance.now() + seconds * 1000
  let done = 0
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < end) {
      await hash(BENCH_PASSWORD, options)
      done++
    }
  }))
  log(`argon2id limit: ${done} hashes in ${seconds} s at concurrency ${concurrency} (${availableParallelism()} CPUs)`)
  return { hashesPerSec: done / seconds, concurrency }
}

/**
 * The event loop's delay p99 in ms since the previous read of the metrics
 * (prom-client resets its histogram on every collection).
 */
export async function eventLoopP99Ms (base: string, adminKey: string): Promise<number | null> {
  const res = await fetch(`${base}/auth/metrics`, { headers: { 'x-api-key': adminKey } })
  const text = await res.text()
  const match = /^(?:gatehouse_)?nodejs_eventloop_lag_p99_seconds\s+([0-9.e+-]+)/m.exec(text)
  return match === null ? null : Number(match[1]) * 1000
}
