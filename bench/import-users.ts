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
 * (c) BENCH_IMPORT_DIRECT rows (default 300,000) with the same hash, posted
 *     straight to `POST /auth/api/users/import` in batches of 1,000 with
 *     BENCH_IMPORT_IN_FLIGHT requests in flight (default 2), as issue 38's
 *     migration script did, into a server of its own on a fresh file.
 *
 * While each part runs, the size of the `-wal` file beside the database is
 * sampled every WAL_SAMPLE_MS; each part reports its peak (issue 38: without
 * a reset, (c) left an 8.46 GB WAL beside a 1.06 GB database). Setting a
 * count to 0 skips that part.
 *
 * Prints users/s for all three, writes bench/results/import-users-<timestamp>.json,
 * and stops by itself (Ctrl-C too stops the server and deletes the temporary
 * directory). Exit code 0 when every row was created, 1 otherwise.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { cpus } from 'node:os'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, createWriteStream } from 'node:fs'
import { stat } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { hash as argon2Hash } from '@node-rs/argon2'
import { childEnv, envInt, freePort, HOST, RESULTS_DIR, ROOT } from './harness.ts'

const BIN = join(ROOT, 'bin', 'gatehouse.js')

/** A row count: 0 skips its part. */
function rowCount (name: string, fallback: number): number {
  return process.env[name] === '0' ? 0 : envInt(name, fallback)
}

const HASHED_ROWS = rowCount('BENCH_IMPORT_HASHED', 100_000)
const PLAIN_ROWS = rowCount('BENCH_IMPORT_PLAIN', 2_000)
const DIRECT_ROWS = rowCount('BENCH_IMPORT_DIRECT', 300_000)
const IN_FLIGHT = envInt('BENCH_IMPORT_IN_FLIGHT', 2)
const BATCH_ROWS = 1000
const WAL_SAMPLE_MS = 20
const MIB = 1024 * 1024
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

interface Run { rows: number, created: number, failed: number, seconds: number, usersPerSecond: number, exitCode: number | null, walPeakBytes?: number, walAfterBytes?: number }

/** Samples the size of `<database>-wal` until stopped; the peak is the largest size seen. */
function sampleWal (database: string): { stop: () => Promise<{ peakBytes: number, lastBytes: number }> } {
  let peakBytes = 0
  let lastBytes = 0
  const state = { sampling: true }
  const loop = (async () => {
    while (state.sampling) {
      lastBytes = (await stat(`${database}-wal`).catch(() => undefined))?.size ?? 0
      if (lastBytes > peakBytes) peakBytes = lastBytes
      await sleep(WAL_SAMPLE_MS)
    }
  })()
  return { stop: async () => { state.sampling = false; await loop; return { peakBytes, lastBytes } } }
}

async function sampled (database: string, run: () => Promise<Run>): Promise<Run> {
  const sampler = sampleWal(database)
  const result = await run()
  const { peakBytes, lastBytes } = await sampler.stop()
  return { ...result, walPeakBytes: peakBytes, walAfterBytes: lastBytes }
}

/** (c): the rows posted straight to the import route, `inFlight` batches at a time. */
async function postImports (base: string, adminKey: string, rows: number, inFlight: number, row: (i: number) => Record<string, unknown>): Promise<Run> {
  const started = performance.now()
  let next = 0
  let created = 0
  let failed = 0
  const poster = async (): Promise<void> => {
    while (next < rows) {
      const from = next
      next = Math.min(rows, next + BATCH_ROWS)
      const users = Array.from({ length: next - from }, (_, k) => row(from + k))
      const response = await fetch(`${base}/api/users/import`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${adminKey}` },
        body: JSON.stringify({ users })
      })
      const body = await response.json() as { created?: number, failed?: number }
      if (response.status !== 200) {
        failed += users.length
        log(`a batch was refused: ${response.status} ${JSON.stringify(body).slice(0, 300)}`)
        continue
      }
      created += body.created ?? 0
      failed += body.failed ?? 0
    }
  }
  await Promise.all(Array.from({ length: inFlight }, poster))
  const seconds = (performance.now() - started) / 1000
  return { rows, created, failed, seconds, usersPerSecond: created / seconds, exitCode: null }
}

const skipped: Run = { rows: 0, created: 0, failed: 0, seconds: 0, usersPerSecond: 0, exitCode: null }

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

async function stopServer (): Promise<void> {
  if (server !== undefined && server.exitCode === null && server.signalCode === null) {
    server.kill('SIGTERM')
    const stopped = await Promise.race([once(server, 'exit').then(() => true), sleep(10_000).then(() => false)])
    if (!stopped) server.kill('SIGKILL')
  }
  server = undefined
}

async function cleanUp (): Promise<void> {
  await stopServer()
  if (tmpDir !== undefined) rmSync(tmpDir, { recursive: true, force: true })
}

process.once('SIGINT', () => { cleanUp().catch(() => {}).finally(() => process.exit(130)) })

/** Starts the server on `database` (a fresh file) and answers its base URL once it is ready. */
async function startServer (database: string, adminKey: string): Promise<string> {
  const port = await freePort()
  const started = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'pipe'],
    env: childEnv({
      HOST,
      PORT: String(port),
      DATABASE_URL: `sqlite:${database}`,
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
  server = started
  started.stderr!.setEncoding('utf8').on('data', (d: string) => { serverErr = (serverErr + d).slice(-4000) })
  const base = `http://${HOST}:${port}/auth`
  const deadline = Date.now() + 120_000
  for (;;) {
    if (started.exitCode !== null) throw new Error(`the server exited: ${serverErr}`)
    try {
      if ((await fetch(`${base}/readyz`)).ok) break
    } catch {}
    if (Date.now() > deadline) throw new Error(`the server did not get ready: ${serverErr}`)
    await sleep(100)
  }
  log(`server ready on ${base} (pid ${String(started.pid)})`)
  return base
}

async function main (): Promise<number> {
  tmpDir = mkdtempSync(join(tmpdir(), 'gatehouse-bench-import-'))
  const adminKey = `gatehouse_bench_${randomBytes(24).toString('hex')}`
  const database = join(tmpDir, 'bench.db')
  const base = await startServer(database, adminKey)

  // (a) One real argon2id hash, with the product's default parameters, reused for every row.
  const hash = await argon2Hash(PASSWORD, { algorithm: 2, memoryCost: 19456, timeCost: 2, parallelism: 1 })
  const hashedFile = join(tmpDir, 'hashed.jsonl')
  await writeRows(hashedFile, HASHED_ROWS, i => ({ username: `imp_h${i}`, email: `imp_h${i}@example.com`, first_name: 'Imported', groups: ['etl'], password_hash: hash }))
  const plainFile = join(tmpDir, 'plain.jsonl')
  await writeRows(plainFile, PLAIN_ROWS, i => ({ username: `imp_p${i}`, email: `imp_p${i}@example.com`, password: PASSWORD }))

  const cliEnv = childEnv({ GATEHOUSE_URL: base, GATEHOUSE_API_KEY: adminKey })
  const walMib = (run: Run): string => `WAL peak ${((run.walPeakBytes ?? 0) / MIB).toFixed(1)} MiB`
  let hashed = skipped
  if (HASHED_ROWS > 0) {
    log(`(a) importing ${HASHED_ROWS} rows with an existing argon2id hash…`)
    hashed = await sampled(database, async () => await runImport(hashedFile, cliEnv))
    log(`(a) ${hashed.created} created in ${hashed.seconds.toFixed(1)} s: ${Math.round(hashed.usersPerSecond)} users/s, ${walMib(hashed)}`)
  }
  let plain = skipped
  if (PLAIN_ROWS > 0) {
    log(`(b) importing ${PLAIN_ROWS} rows with plaintext passwords (hashed by the server)…`)
    plain = await sampled(database, async () => await runImport(plainFile, cliEnv))
    log(`(b) ${plain.created} created in ${plain.seconds.toFixed(1)} s: ${Math.round(plain.usersPerSecond)} users/s, ${walMib(plain)}`)
  }

  // A sign-in with the shared hash proves the rows are usable (and upgrades nothing: it is already current).
  const login = await fetch(`${base}/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: HASHED_ROWS > 0 ? 'imp_h0' : 'imp_p0', password: PASSWORD }) })
  await login.arrayBuffer()
  await stopServer()

  let direct = skipped
  let directDatabaseBytes = 0
  if (DIRECT_ROWS > 0) {
    const directDatabase = join(tmpDir, 'direct.db')
    const directBase = await startServer(directDatabase, adminKey)
    log(`(c) posting ${DIRECT_ROWS} rows with an existing argon2id hash to /api/users/import, ${BATCH_ROWS} a request, ${IN_FLIGHT} in flight…`)
    direct = await sampled(directDatabase, async () => await postImports(directBase, adminKey, DIRECT_ROWS, IN_FLIGHT,
      i => ({ username: `imp_d${i}`, email: `imp_d${i}@example.com`, first_name: 'Imported', groups: ['etl'], password_hash: hash })))
    directDatabaseBytes = (await stat(directDatabase)).size
    log(`(c) ${direct.created} created in ${direct.seconds.toFixed(1)} s: ${Math.round(direct.usersPerSecond)} users/s, ${walMib(direct)}, ` +
      `${((direct.walAfterBytes ?? 0) / MIB).toFixed(1)} MiB at the end, database ${(directDatabaseBytes / MIB).toFixed(0)} MiB`)
    await stopServer()
  }

  const report = {
    bench: 'import-users',
    at: new Date().toISOString(),
    machine: { cpus: cpus().length, cpu: cpus()[0]?.model, node: process.version },
    database: 'sqlite (file, temporary directory)',
    note: '(a) reuses ONE real argon2id hash for every row (no hashing on the server); (b) runs on fewer rows than (a) because the server hashes each password',
    with_existing_hashes: hashed,
    with_plaintext_passwords: plain,
    posted_in_flight: { ...direct, in_flight: IN_FLIGHT, batch_rows: BATCH_ROWS, database_bytes: directDatabaseBytes },
    wal_sample_ms: WAL_SAMPLE_MS,
    sign_in_after_import: login.status
  }
  mkdirSync(RESULTS_DIR, { recursive: true })
  const file = join(RESULTS_DIR, `import-users-${report.at.replace(/[:.]/g, '-')}.json`)
  writeFileSync(file, JSON.stringify(report, null, 2) + '\n')

  process.stdout.write(`\nimport via the CLI (gatehouse users import, batches of 1000), SQLite, ${cpus().length} CPUs\n`)
  process.stdout.write(`  (a) existing argon2id hashes, ${hashed.rows} rows: ${Math.round(hashed.usersPerSecond)} users/s (${hashed.seconds.toFixed(1)} s, ${hashed.created} created)\n`)
  process.stdout.write(`  (b) plaintext passwords,      ${plain.rows} rows: ${Math.round(plain.usersPerSecond)} users/s (${plain.seconds.toFixed(1)} s, ${plain.created} created)\n`)
  process.stdout.write(`  (c) posted, ${IN_FLIGHT} in flight,     ${direct.rows} rows: ${Math.round(direct.usersPerSecond)} users/s (${direct.seconds.toFixed(1)} s, ${direct.created} created)\n`)
  process.stdout.write(`  WAL peak: (a) ${((hashed.walPeakBytes ?? 0) / MIB).toFixed(1)} MiB, (b) ${((plain.walPeakBytes ?? 0) / MIB).toFixed(1)} MiB, (c) ${((direct.walPeakBytes ?? 0) / MIB).toFixed(1)} MiB (sampled every ${WAL_SAMPLE_MS} ms)\n`)
  process.stdout.write(`  sign-in with an imported hash: ${login.status}\n  results: ${file}\n`)
  const ok = hashed.created === HASHED_ROWS && plain.created === PLAIN_ROWS && direct.created === DIRECT_ROWS && (login.status === 200 || HASHED_ROWS + PLAIN_ROWS === 0)
  return ok ? 0 : 1
}

main().then(
  async code => { await cleanUp(); process.exitCode = code },
  async (error: unknown) => { log(error instanceof Error ? error.message : String(error)); await cleanUp(); process.exitCode = 1 }
)
