/**
 * `npm run bench:import`: how fast does `gatehouse users import FILE` (the CLI,
 * as a process) move users into a real server (a child process, SQLite in a
 * temporary directory, loopback only)?
 *
 * (a) BENCH_IMPORT_HASHED rows (default 100,000) that carry an existing argon2id
 *     hash: the server checks the hash's format and bounds and stores it, with no
 *     hashing. ONE real argon2id hash (of one password, made here once with the
 *     product's parameters) is reused for every row: verifying it is not part
 *     of an import, and generating 100,000 distinct hashes would take ~15 min.
 * (b) BENCH_IMPORT_PLAIN rows (default 2,000) with plaintext passwords, which
 *     the server hashes with argon2id (~9 ms each on one core). 100,000 of them
 *     would take several minutes on 2 cores, so (b) runs on fewer rows; its
 *     users per second do not depend on the row count once batches are full.
 *
 * Prints users/s for both, writes bench/results/import-users-<timestamp>.json,
 * and stops by itself (Ctrl-C too stops the server and deletes the temporary
 * directory). Exit code 0 when every row was created, 1 otherwise.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { cpus } from 'node:os'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, createWriteStream } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { hash as argon2Hash } from '@node-rs/argon2'
import { childEnv, envInt, freePort, HOST, RESULTS_DIR, ROOT } from './harness.ts'

const BIN = join(ROOT, 'bin', 'gatehouse.js')

const HASHED_ROWS = envInt('BENCH_IMPORT_HASHED', 100_000)
const PLAIN_ROWS = envInt('BENCH_IMPORT_PLAIN', 2_000)
const PASSWORD = 'correct horse battery staple'

function log (message: string): void {
  process.stderr.write(`[bench:import] ${message}\n`)
}

async function writeRows (file: string, count: number, row: (i: number) => Record<string, unknown>): Promise<void> {
  const out = createWriteStream(file)
  for (let i = 0; i < count; i++) {
    if (!out.write(JSON.stringify(row(i)) + '\n')) await once(out, 'drain')
  }
  out.end()
  await once(out, 'finish')
}

interface Run { rows: number, created: number, failed: number, seconds: number, usersPerSecond: number, exitCode: number | null }

async function runImport (file: string, env: NodeJS.ProcessEnv): Promise<Run & { rows: number }> {
  const started = performance.now()
  const child = spawn(process.execPath, [BIN, 'users', 'import', file, '--json'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  const [exitCode] = await once(child, 'close') as [number | null]
  const seconds = (performance.now() - started) / 1000
  let report: { rows_read: number, created: number, failed: number }
  try {
    report = JSON.parse(stdout)
  } catch {
    throw new Error(`the CLI did not print a report (exit ${String(exitCode)}): ${stderr.slice(-2000)}`)
  }
  return { rows: report.rows_read, created: report.created, failed: report.failed, seconds, usersPerSecond: report.created / seconds, exitCode }
}

let server: ChildProcess | undefined
let tmpDir: string | undefined

async function cleanUp (): Promise<void> {
  if (server !== undefined && server.exitCode === null && server.signalCode === null) {
    server.kill('SIGTERM')
    const stopped = await Promise.race([once(server, 'exit').then(() => true), sleep(10_000).then(() => false)])
    if (!stopped) server.kill('SIGKILL')
  }
  if (tmpDir !== undefined) rmSync(tmpDir, { recursive: true, force: true })
}

process.once('SIGINT', () => { cleanUp().catch(() => {}).finally(() => process.exit(130)) })

async function main (): Promise<number> {
  tmpDir = mkdtempSync(join(tmpdir(), 'gatehouse-bench-import-'))
  const adminKey = `gatehouse_bench_${randomBytes(24).toString('hex')}`
  const port = await freePort()
  server = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'pipe'],
    env: childEnv({
      HOST,
      PORT: String(port),
      DATABASE_URL: `sqlite:${join(tmpDir, 'bench.db')}`,
      GATEHOUSE_ADMIN_API_KEY: adminKey,
      // One key makes every request of the run (the CLI's checks page through the users, then a
      // request per 1000 rows, and (b)'s plaintext hashing); the general per-credential limit is a
      // production guard, not what is measured here. Raised rather than switched off, so its cost stays in.
      RATE_LIMIT_PER_CREDENTIAL: '1000000000',
      RATE_LIMIT_PER_ADDRESS: '1000000000',
      LOG_LEVEL: 'warn'
    })
  })
  let serverErr = ''
  server.stderr!.setEncoding('utf8').on('data', (d: string) => { serverErr = (serverErr + d).slice(-4000) })
  const base = `http://${HOST}:${port}/auth`
  const deadline = Date.now() + 30_000
  for (;;) {
    if (server.exitCode !== null) throw new Error(`the server exited: ${serverErr}`)
    try {
      if ((await fetch(`${base}/readyz`)).ok) break
    } catch {}
    if (Date.now() > deadline) throw new Error(`the server did not get ready: ${serverErr}`)
    await sleep(100)
  }
  log(`server ready on ${base} (pid ${String(server.pid)})`)

  // (a) One real argon2id hash, with the product's default parameters, reused for every row.
  const hash = await argon2Hash(PASSWORD, { algorithm: 2, memoryCost: 19456, timeCost: 2, parallelism: 1 })
  const hashedFile = join(tmpDir, 'hashed.jsonl')
  await writeRows(hashedFile, HASHED_ROWS, i => ({ username: `imp_h${i}`, email: `imp_h${i}@example.com`, first_name: 'Imported', groups: ['etl'], password_hash: hash }))
  const plainFile = join(tmpDir, 'plain.jsonl')
  await writeRows(plainFile, PLAIN_ROWS, i => ({ username: `imp_p${i}`, email: `imp_p${i}@example.com`, password: PASSWORD }))

  const cliEnv = childEnv({ GATEHOUSE_URL: base, GATEHOUSE_API_KEY: adminKey })
  log(`(a) importing ${HASHED_ROWS} rows with an existing argon2id hash…`)
  const hashed = await runImport(hashedFile, cliEnv)
  log(`(a) ${hashed.created} created in ${hashed.seconds.toFixed(1)} s: ${Math.round(hashed.usersPerSecond)} users/s`)
  log(`(b) importing ${PLAIN_ROWS} rows with plaintext passwords (hashed by the server)…`)
  const plain = await runImport(plainFile, cliEnv)
  log(`(b) ${plain.created} created in ${plain.seconds.toFixed(1)} s: ${Math.round(plain.usersPerSecond)} users/s`)

  // A sign-in with the shared hash proves the rows are usable (and upgrades nothing: it is already current).
  const login = await fetch(`${base}/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: 'imp_h0', password: PASSWORD }) })
  await login.arrayBuffer()

  const report = {
    bench: 'import-users',
    at: new Date().toISOString(),
    machine: { cpus: cpus().length, cpu: cpus()[0]?.model, node: process.version },
    database: 'sqlite (file, temporary directory)',
    note: '(a) reuses ONE real argon2id hash for every row (no hashing on the server); (b) runs on fewer rows than (a) because the server hashes each password',
    with_existing_hashes: hashed,
    with_plaintext_passwords: plain,
    sign_in_after_import: login.status
  }
  mkdirSync(RESULTS_DIR, { recursive: true })
  const file = join(RESULTS_DIR, `import-users-${report.at.replace(/[:.]/g, '-')}.json`)
  writeFileSync(file, JSON.stringify(report, null, 2) + '\n')

  process.stdout.write(`\nimport via the CLI (gatehouse users import, batches of 1000), SQLite, ${cpus().length} CPUs\n`)
  process.stdout.write(`  (a) existing argon2id hashes, ${hashed.rows} rows: ${Math.round(hashed.usersPerSecond)} users/s (${hashed.seconds.toFixed(1)} s, ${hashed.created} created)\n`)
  process.stdout.write(`  (b) plaintext passwords,      ${plain.rows} rows: ${Math.round(plain.usersPerSecond)} users/s (${plain.seconds.toFixed(1)} s, ${plain.created} created)\n`)
  process.stdout.write(`  sign-in with an imported hash: ${login.status}\n  results: ${file}\n`)
  const ok = hashed.created === HASHED_ROWS && plain.created === PLAIN_ROWS && login.status === 200
  return ok ? 0 : 1
}

main().then(
  async code => { await cleanUp(); process.exitCode = code },
  async (error: unknown) => { log(error instanceof Error ? error.message : String(error)); await cleanUp(); process.exitCode = 1 }
)
