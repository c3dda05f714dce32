/**
 * Does the full list (GET /auth/api/users with no parameters) keep the
 * server's memory flat however many users exist? Seeds SQLite files with
 * 10,000 and 1,000,000 users, starts the real server on each with its V8 heap
 * capped at 64 MiB, reads the whole streamed array, and samples the server's
 * resident memory while it answers.
 *
 *   npm run bench:stream            # 10k and 1M users
 *   BENCH_STREAM_USERS=200000 npm run bench:stream
 *
 * Loopback only; stops by itself.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { Sqlite as SQLite } from '../src/db/sqlite-binding.ts'
import { v7 } from 'uuid'
import { migrateSqliteFile } from './harness.ts'

const sizes = (process.env.BENCH_STREAM_USERS ?? '10000,1000000').split(',').map(Number)
/** The server's V8 heap cap: far below the size of the response, so a server that buffered it would die. */
const heapMiB = Number(process.env.BENCH_STREAM_HEAP_MIB ?? 64)
const dir = mkdtempSync(join(tmpdir(), 'gatehouse-stream-'))
const children: ChildProcess[] = []
const cleanup = (): void => {
  for (const child of children) child.kill('SIGKILL')
  rmSync(dir, { recursive: true, force: true })
}
process.on('SIGINT', () => { cleanup(); process.exit(130) })

async function seed (file: string, count: number): Promise<void> {
  await migrateSqliteFile(file)
  const raw = new SQLite(file)
  const insert = raw.prepare(`insert into users (id, username, username_key, email, email_key, first_name, last_name, role, groups, disabled,
    password_hash, version, created_at, updated_at, last_login_at, password_changed_at)
    values (?, ?, ?, ?, ?, ?, ?, 'user', '["etl"]', 0, null, 1, ?, ?, null, null)`)
  // Many users share a creation instant, so the keyset's id tie-break is exercised too.
  const base = Date.now() - count
  raw.transaction(() => {
    for (let i = 0; i < count; i++) {
      const username = `user${i}`
      const at = new Date(base + Math.floor(i / 10)).toISOString()
      insert.run(v7(), username, username, `${username}@example.com`, `${username}@example.com`, 'First', 'Last', at, at)
    }
  })()
  raw.close()
}

function rssKib (pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match === null ? 0 : Number(match[1])
}

async function startServer (file: string, port: number, key: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, [`--max-old-space-size=${heapMiB}`, '--import', 'tsx', 'src/server.ts'], {
    env: { ...process.env, PORT: String(port), DATABASE_URL: `sqlite:${file}`, GATEHOUSE_ADMIN_API_KEY: key, LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'inherit']
  })
  children.push(child)
  const deadline = Date.now() + 30_000
  for (;;) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/auth/readyz`)).ok) return child
    } catch {}
    if (Date.now() > deadline) throw new Error('server did not start')
    await new Promise(resolve => setTimeout(resolve, 200))
  }
}

interface Result { users: number, seconds: number, megabytes: number, rssBeforeMiB: number, rssPeakMiB: number }

async function measure (count: number, port: number): Promise<Result> {
  const file = join(dir, `users-${count}.db`)
  await seed(file, count)
  const key = 'bench_' + randomBytes(32).toString('hex')
  const child = await startServer(file, port, key)
  // Warm the route so JIT and caches do not count as growth.
  await (await fetch(`http://127.0.0.1:${port}/auth/api/users?limit=1000`, { headers: { 'x-api-key': key } })).arrayBuffer()
  const rssBefore = rssKib(child.pid!)
  let peak = rssBefore
  const sampler = setInterval(() => { peak = Math.max(peak, rssKib(child.pid!)) }, 50)
  const started = performance.now()
  const res = await fetch(`http://127.0.0.1:${port}/auth/api/users`, { headers: { 'x-api-key': key } })
  if (!res.ok || res.body === null) throw new Error(`list failed: ${res.status}`)
  let bytes = 0
  let users = 0
  const decoder = new TextDecoder()
  // The marker can straddle two chunks: keep the last few characters for the next count.
  let carry = ''
  for await (const chunk of res.body) {
    bytes += chunk.byteLength
    const text = carry + decoder.decode(chunk, { stream: true })
    users += text.split('{"id":').length - 1
    carry = text.slice(-5)
  }
  const seconds = (performance.now() - started) / 1000
  clearInterval(sampler)
  peak = Math.max(peak, rssKib(child.pid!))
  child.kill('SIGTERM')
  if (users !== count) throw new Error(`expected ${count} users in the stream, counted ${users}`)
  return { users, seconds, megabytes: bytes / 1e6, rssBeforeMiB: rssBefore / 1024, rssPeakMiB: peak / 1024 }
}

try {
  const results: Result[] = []
  for (const [i, count] of sizes.entries()) {
    const r = await measure(count, 18300 + i)
    results.push(r)
    console.log(`${r.users.toLocaleString('en')} users, server heap capped at ${heapMiB} MiB: ${r.megabytes.toFixed(1)} MB in ${r.seconds.toFixed(1)} s ` +
      `(${Math.round(r.users / r.seconds).toLocaleString('en')} users/s); server RSS ${r.rssBeforeMiB.toFixed(0)} MiB before, ` +
      `${r.rssPeakMiB.toFixed(0)} MiB peak (+${(r.rssPeakMiB - r.rssBeforeMiB).toFixed(0)} MiB)`)
  }
  if (results.length > 1) {
    const growth = results.map(r => r.rssPeakMiB - r.rssBeforeMiB)
    console.log(`peak growth while streaming: ${growth.map(g => g.toFixed(0) + ' MiB').join(' vs ')} for ` +
      `${results.map(r => r.users.toLocaleString('en')).join(' vs ')} users`)
  }
} finally {
  cleanup()
}
