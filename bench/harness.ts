/**
 * What the benchmark scripts share: settings from the environment, the
 * server under test as a child process (and its clean-up on every way out),
 * autocannon with CPU accounting, and the bits of the report. One process runs
 * one benchmark, so the state here (children, temporary directory, the running
 * autocannon) is module-wide.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { availableParallelism, cpus, tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import autocannon from 'autocannon'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'

export const ROOT = fileURLToPath(new URL('..', import.meta.url))
export const RESULTS_DIR = join(ROOT, 'bench', 'results')
/** Loopback only: a benchmark must never expose a server with a known admin key. */
export const HOST = '127.0.0.1'
const READY_TIMEOUT_MS = 60_000
/** Other processes busier than this (in cores) during a measurement make the run noisy; the table says so. */
export const NOISY_OTHER_CPU = 0.1

// ---------------------------------------------------------------- settings

/** A typo in a setting must stop the run, not silently measure something else. */
/** One row of a benchmark's table of goals as one run measured it (`npm run bench:storm`, `bench:stamp`). met null: not measured. */
export interface IssueRow { work: string, measured: string, goal: string, met: boolean | null }

export function envInt (name: string, fallback: number): number {
  const value = process.env[name]
  if (value === undefined || value === '') return fallback
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new Error(`${name} must be a positive whole number, got "${value}"`)
  return Number(value)
}

/** Words of a setting separated by spaces (node options, NAME=value pairs); none when it is unset. */
export function envWords (name: string): string[] {
  return (process.env[name] ?? '').split(' ').filter(word => word !== '')
}

/** A setting holding NAME=value pairs separated by spaces (settings for one server), as an environment. */
export function envPairs (name: string): Record<string, string> {
  const pairs: Record<string, string> = {}
  for (const pair of envWords(name)) {
    const at = pair.indexOf('=')
    if (at < 1) throw new Error(`${name}: "${pair}" is not NAME=value`)
    pairs[pair.slice(0, at)] = pair.slice(at + 1)
  }
  return pairs
}

/** Flags read the way a shell user writes them (1, true, yes, on); anything else is off. */
export function envFlag (name: string): boolean {
  return /^(1|true|yes|on)$/i.test(process.env[name] ?? '')
}

/**
 * The only variables the servers inherit from this shell: what a process needs to run. Everything else
 * (LOG_LEVEL, DATABASE_URL, LOGIN_MAX_FAILURES_*, NODE_OPTIONS, any other gatehouse setting) stays out, so
 * the server under test runs with its defaults plus the few settings each benchmark gives.
 */
export const INHERITED_ENV = ['PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_ALL', 'TZ', 'SYSTEMROOT']

/** An environment for a child that the developer's shell cannot skew (see INHERITED_ENV). */
export function childEnv (settings: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const name of INHERITED_ENV) if (process.env[name] !== undefined) env[name] = process.env[name]
  return { ...env, ...settings }
}

// ---------------------------------------------------------------- children and clean-up

export interface Child {
  name: string
  proc: ChildProcess
  exited: Promise<void>
  stdoutPath: string
  stderrPath: string
}

const children: Child[] = []
let tmpDir: string | undefined
let keepTmp = false
/** The autocannon runs in progress (bench/ab-builds.ts's AB_PAIRED runs two at once). */
const cannons = new Set<autocannon.Instance>()
let stopping = false
let cleanedUp: Promise<void> | undefined

/** On stderr, so stdout carries only the results table. */
export function log (line: string): void {
  process.stderr.write(`[bench] ${line}\n`)
}

/** Exit code and signal both, since a child killed by a signal has no exit code. */
export function isRunning (child: Child): boolean {
  return child.proc.exitCode === null && child.proc.signalCode === null
}

/** True once clean-up has begun (Ctrl-C, SIGTERM, an error): a measurement cut short then must not be reported. */
export function isStopping (): boolean {
  return stopping
}

/** The end of a child's log, to say why it failed without flooding the console. */
export function tail (path: string, lines = 20): string {
  try {
    return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return '(no output)'
  }
}

/**
 * Stops the children and removes the temporary directory however the run ends: SIGINT and SIGTERM
 * clean up and exit 130 / 143, and an exit that skipped cleanUp still kills the children. Call once,
 * before anything is started.
 */
export function installCleanUp (options: { keepTmp: boolean }): void {
  keepTmp = options.keepTmp
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      log(`${signal}: stopping`)
      cleanUp().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143))
    })
  }
  // Last resort if something exits the process without going through cleanUp.
  process.once('exit', () => {
    for (const child of children) if (isRunning(child)) child.proc.kill('SIGKILL')
    if (tmpDir !== undefined && !keepTmp) rmSync(tmpDir, { recursive: true, force: true })
  })
}

/** The run's temporary directory (database, child logs), registered so that clean-up removes it. */
export function makeTmpDir (prefix: string): string {
  tmpDir = mkdtempSync(join(tmpdir(), prefix))
  return tmpDir
}

/**
 * Starts `node [nodeArgs] --import tsx <script>` (`node [nodeArgs] <script>` for a .js file) with stdout and stderr going to files in the temporary
 * directory, never to this console (the server's log would bury the results, and a pipe nobody reads
 * would stall it). Registered so that clean-up stops it.
 */
export function startChild (name: string, script: string, env: NodeJS.ProcessEnv, nodeArgs: string[] = []): Child {
  const stdoutPath = join(tmpDir!, `${name}.stdout.log`)
  const stderrPath = join(tmpDir!, `${name}.stderr.log`)
  const out = openSync(stdoutPath, 'w')
  const err = openSync(stderrPath, 'w')
  // Compiled JavaScript (dist/, what `npm start` runs) starts without tsx.
  const args = script.endsWith('.js') ? [...nodeArgs, script] : [...nodeArgs, '--import', 'tsx', script]
  const proc = spawn(process.execPath, args, { cwd: ROOT, env, stdio: ['ignore', out, err] })
  closeSync(out)
  closeSync(err)
  const exited = new Promise<void>(resolve => {
    proc.once('exit', () => resolve())
    proc.once('error', () => resolve())
  })
  const child = { name, proc, exited, stdoutPath, stderrPath }
  children.push(child)
  return child
}

/** SIGTERM first, so the server shuts down cleanly (and `--cpu-prof` writes its profile); SIGKILL if it hangs. */
export async function stopChild (child: Child): Promise<void> {
  if (!isRunning(child)) return
  child.proc.kill('SIGTERM')
  const timeout = sleep(10_000, 'timeout', { ref: false })
  if (await Promise.race([child.exited.then(() => 'exited'), timeout]) === 'timeout') {
    log(`${child.name} did not stop within 10 s of SIGTERM; killing it`)
    child.proc.kill('SIGKILL')
    await child.exited
  }
}

/** Idempotent, so the normal end, a failure and a signal arriving meanwhile all share one clean-up. */
export async function cleanUp (): Promise<void> {
  cleanedUp ??= (async () => {
    stopping = true
    for (const running of cannons) running.stop()
    await Promise.all(children.map(stopChild))
    if (tmpDir !== undefined) {
      if (keepTmp) log(`kept ${tmpDir} (BENCH_KEEP_TMP)`)
      else rmSync(tmpDir, { recursive: true, force: true })
    }
  })()
  await cleanedUp
}

/**
 * Runs a benchmark's main. On failure says what failed, with the stderr of any child that died (usually
 * the cause), unless the failure is only the consequence of being stopped; then cleans up and exits 1.
 */
export async function runBench (main: () => Promise<void>): Promise<void> {
  try {
    await main()
  } catch (error) {
    await failRun(error)
  }
}

async function failRun (error: unknown): Promise<void> {
  if (!stopping) log(`failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}`)
  for (const child of children) {
    if (!stopping && !isRunning(child)) log(`${child.name} stderr:\n${tail(child.stderrPath)}`)
  }
  await cleanUp()
  process.exitCode = 1
}

// ---------------------------------------------------------------- helpers

/** Creates a SQLite file with gatehouse's schema, through its own migrations (the seed goes in after). */
export async function migrateSqliteFile (dbPath: string): Promise<void> {
  const db = createDb({ databaseUrl: `sqlite:${dbPath}`, databaseSchema: undefined, databasePoolSize: 1, databaseStatementTimeoutMs: 5000, databaseQueryTimeoutMs: 6000, databaseAcquireTimeoutMs: 5000 })
  await migrateToLatest(db)
  await db.destroy()
}

/** A port nobody listens on, so that parallel runs and other local services do not collide. */
export async function freePort (): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, HOST, () => {
      const address = server.address()
      server.close(() => typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port')))
    })
  })
}

/** Polls until the child answers 2xx; fails fast, with its log, if it exits instead. */
export async function waitReady (child: Child, url: string): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS
  while (Date.now() < deadline) {
    if (!isRunning(child)) throw new Error(`${child.name} exited before it was ready:\n${tail(child.stderrPath)}\n${tail(child.stdoutPath)}`)
    try {
      const res = await fetch(url)
      await res.arrayBuffer()
      if (res.ok) return
    } catch {
      // not listening yet
    }
    await sleep(100)
  }
  throw new Error(`${child.name} did not answer ${url} within ${READY_TIMEOUT_MS / 1000} s`)
}

// ---------------------------------------------------------------- load and CPU accounting

const CLOCK_TICKS = ((): number => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
  } catch {
    return 100
  }
})()

/**
 * What a process has used so far, from /proc/<pid>/stat: user and system CPU seconds and minor page faults;
 * undefined where there is no /proc (or no such process).
 */
export function processUsageOf (pid: number | undefined): { userS: number, systemS: number, minorFaults: number } | undefined {
  if (pid === undefined) return undefined
  try {
    // Fields after the command name (which may contain spaces): minflt is the 8th, utime and stime the 12th and 13th.
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ').at(-1)!.split(' ')
    return { userS: Number(fields[11]) / CLOCK_TICKS, systemS: Number(fields[12]) / CLOCK_TICKS, minorFaults: Number(fields[7]) }
  } catch {
    return undefined
  }
}

/** CPU seconds (user + system) a process has used so far, from /proc; undefined where there is no /proc. */
export function cpuSecondsOf (pid: number | undefined): number | undefined {
  const usage = processUsageOf(pid)
  return usage === undefined ? undefined : usage.userS + usage.systemS
}

/** Busy CPU seconds of the whole machine so far (all cores), from /proc/stat; undefined where there is no /proc. */
export function machineBusySeconds (): number | undefined {
  try {
    const [, ...ticks] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).map(Number)
    // user nice system idle iowait irq softirq steal (guest time is already inside user)
    const busy = ticks.slice(0, 8).reduce((sum, t, i) => i === 3 || i === 4 ? sum : sum + t, 0)
    return busy / CLOCK_TICKS
  } catch {
    return undefined
  }
}

/** autocannon as a promise, kept where clean-up can stop it when the run is interrupted. */
export async function runCannon (options: autocannon.Options): Promise<autocannon.Result> {
  return await new Promise((resolve, reject) => {
    const running = autocannon(options, (err, result) => {
      cannons.delete(running)
      if (err !== null && err !== undefined) reject(err instanceof Error ? err : new Error(String(err)))
      else resolve(result)
    })
    cannons.add(running)
  })
}

/** The counts and latencies every benchmark reports, in the order its JSON lists them. */
export interface LoadSummary {
  warmupRequests: number
  requests: number
  reqPerSec: { average: number, stddev: number, min: number, max: number }
  latencyMs: { average: number, p50: number, p90: number, p99: number, max: number }
}

/** Where the CPU went during the measured run: without it, req/s cannot tell a slow server from a busy machine. */
export interface LoadCpu {
  /** CPU the server process used during the measured window: cores busy on average, and CPU time per response. */
  serverCpu: {
    cores: number
    usPerRequest: number
    /**
     * Minor page faults of the server per response. Memory the C library gave back and took again faults
     * anew each time: 2.5 to 5 a response once cost the floor half its speed.
     */
    minorFaultsPerRequest?: number
  } | null
  /** The same for this process, which runs autocannon: near 1.0 core means the load generator is the limit. */
  loadGeneratorCpu: { cores: number }
  /** Busy cores of the whole machine minus the server and this process: other work competing for the CPU during the run. */
  otherCpu: { cores: number } | null
  /**
   * Processes that work for the server (its PostgreSQL backends), when the caller named them: their CPU during the
   * measured window, counted out of otherCpu. Null when none were named.
   */
  companionCpu?: { cores: number, usPerRequest: number, pids: number } | null
}

export interface LoadRun extends LoadCpu {
  warm: autocannon.Result
  result: autocannon.Result
  summary: LoadSummary
}

/**
 * A warm-up (so JIT and caches do not count) and then the measured run against one child, with the CPU
 * used by the server, by autocannon and by everything else: req/s alone cannot tell a slow server from a
 * busy machine or a saturated load generator. Throws once the run is being stopped.
 */
export async function measureLoad (
  name: string, child: Child, options: autocannon.Options & { connections: number }, timing: { warmupS: number, durationS: number },
  /** Called after the warm-up and again after the run: pids of processes whose CPU belongs to this target (PostgreSQL backends of the server). */
  companions?: () => Promise<number[]>
): Promise<LoadRun> {
  log(`${name}: warm-up ${timing.warmupS} s`)
  const warm = await runCannon({ ...options, duration: timing.warmupS })
  if (stopping) throw new Error('interrupted')
  if (warm.non2xx > 0 || warm.errors > 0) log(`${name}: warm-up had ${warm.non2xx} non-2xx and ${warm.errors} errors`)
  log(`${name}: measuring ${timing.durationS} s with ${options.connections} connections`)
  const companionPids = companions !== undefined ? await companions() : []
  const companionsBefore = new Map(companionPids.map(pid => [pid, cpuSecondsOf(pid)]))
  const serverBefore = processUsageOf(child.proc.pid)
  const machineBefore = machineBusySeconds()
  const ownBefore = process.cpuUsage()
  const r = await runCannon({ ...options, duration: timing.durationS })
  const own = process.cpuUsage(ownBefore)
  const machineAfter = machineBusySeconds()
  const serverAfter = processUsageOf(child.proc.pid)
  // A backend that appeared during the run counts from zero (it started within it); one that ended is lost, which the pid count shows.
  let companionS = 0
  const companionPidsAfter = companions !== undefined ? await companions() : []
  for (const pid of new Set([...companionPids, ...companionPidsAfter])) {
    const after = cpuSecondsOf(pid)
    if (after !== undefined) companionS += after - (companionsBefore.get(pid) ?? 0)
  }
  if (stopping) throw new Error('interrupted')
  const serverS = serverBefore !== undefined && serverAfter !== undefined
    ? serverAfter.userS + serverAfter.systemS - serverBefore.userS - serverBefore.systemS
    : undefined
  const ownS = (own.user + own.system) / 1e6
  const otherS = serverS !== undefined && machineBefore !== undefined && machineAfter !== undefined
    ? Math.max(0, machineAfter - machineBefore - serverS - ownS - companionS)
    : undefined
  return {
    warm,
    result: r,
    summary: {
      warmupRequests: warm.requests.total,
      requests: r.requests.total,
      reqPerSec: { average: r.requests.average, stddev: r.requests.stddev, min: r.requests.min, max: r.requests.max },
      latencyMs: { average: r.latency.average, p50: r.latency.p50, p90: r.latency.p90, p99: r.latency.p99, max: r.latency.max }
    },
    serverCpu: serverS === undefined
      ? null
      : {
          cores: serverS / r.duration,
          usPerRequest: serverS * 1e6 / Math.max(1, r.requests.total),
          ...(serverBefore !== undefined && serverAfter !== undefined ? { minorFaultsPerRequest: (serverAfter.minorFaults - serverBefore.minorFaults) / Math.max(1, r.requests.total) } : {})
        },
    loadGeneratorCpu: { cores: ownS / r.duration },
    otherCpu: otherS === undefined ? null : { cores: otherS / r.duration },
    companionCpu: companions === undefined ? null : { cores: companionS / r.duration, usPerRequest: companionS * 1e6 / Math.max(1, r.requests.total), pids: new Set([...companionPids, ...companionPidsAfter]).size }
  }
}

// ---------------------------------------------------------------- the report

/** Numbers as people read them (thousands separators, fixed decimals), whatever the machine's locale. */
export function fmt (n: number, digits = 0): string {
  return n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })
}

/** Aligned columns: the first left-aligned (names), the rest right-aligned (numbers). Widths are returned for lines that align with the table. */
export function formatTable (header: string[], body: string[][]): { widths: number[], lines: string[] } {
  const widths = header.map((h, i) => Math.max(h.length, ...body.map(r => r[i]!.length)))
  const line = (cells: string[]): string => cells.map((c, i) => i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)).join('  ')
  return { widths, lines: [line(header), line(widths.map(w => '-'.repeat(w))), ...body.map(line)] }
}

/** The targets during which other processes were busy enough to disturb the numbers, for the table's warning. */
export function busyDuring (rows: Array<[string, { otherCpu: { cores: number } | null }]>): string[] {
  return rows.filter(([, m]) => (m.otherCpu?.cores ?? 0) > NOISY_OTHER_CPU).map(([name, m]) => `${fmt(m.otherCpu!.cores * 100)}% (during ${name})`)
}

/** False when other processes competed for the CPU (see otherCpu): such runs must be compared with care. */
export function isQuiet (measurements: Array<{ otherCpu: { cores: number } | null }>): boolean {
  return measurements.every(m => (m.otherCpu?.cores ?? 0) <= NOISY_OTHER_CPU)
}

/** What a result file needs to be compared with another machine's. */
export function machineInfo (): { node: string, platform: string, cpus: number, cpuModel: string | null } {
  return { node: process.version, platform: `${process.platform} ${process.arch}`, cpus: availableParallelism(), cpuModel: cpus()[0]?.model ?? null }
}

/** Which code was measured; srcDirty says the numbers may not belong to that commit. */
export function gitInfo (): { commit: string | null, srcDirty: boolean | null } {
  try {
    const git = (...args: string[]): string => execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    const commit = git('rev-parse', 'HEAD').trim()
    const status = git('status', '--porcelain', '--', 'src')
    return { commit, srcDirty: status.trim() !== '' }
  } catch {
    return { commit: null, srcDirty: null }
  }
}

/** Writes bench/results/<benchmark>-<stamp>.json, so runs can be compared later, and says where. */
export function writeResults (benchmark: string, stamp: string, report: unknown): string {
  mkdirSync(RESULTS_DIR, { recursive: true })
  const file = join(RESULTS_DIR, `${benchmark}-${stamp}.json`)
  writeFileSync(file, JSON.stringify(report, null, 2) + '\n')
  log(`results written to ${file}`)
  return file
}

/** The one-time admin key gatehouse prints on stdout when the database has no admin. */
export async function readAdminKey (child: Child): Promise<string> {
  const deadline = Date.now() + 10_000
  while (Date.now() < deadline) {
    const match = /\b(gatehouse_[0-9A-Za-z]{43})\b/.exec(readFileSync(child.stdoutPath, 'utf8'))
    if (match !== null) return match[1]!
    await sleep(50)
  }
  throw new Error('gatehouse did not print an admin API key (line containing "gatehouse_…") on stdout')
}
