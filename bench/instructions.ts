/**
 * Issue 20, row 1, taken apart in measures that do not swing with the
 * machine's state: the bare route (bench/bare-server.ts), its floor (the bare
 * route plus gatehouse's own read of the page, BARE_PAGE_DB) and gatehouse's
 * uncached page of 50 (a different cursor on every request), on one seeded
 * SQLite file, one server at a time.
 *
 * INSTR_MODE=callgrind (the default): each server runs under valgrind's
 * callgrind with instrumentation off until it has served INSTR_WARMUP
 * requests (V8 has compiled its hot code by then), and the instructions it
 * executes for the next INSTR_REQUESTS are counted, per thread: the main
 * thread's are the request's work; the others are V8's compiler and garbage
 * collector helpers and libuv's pool. INSTR_CACHE=1 adds callgrind's cache
 * simulation (the first-level instruction and data caches and the last level,
 * as this machine's CPU reports them): misses per response.
 *
 * INSTR_MODE=native: the same load without valgrind, INSTR_ROUNDS rounds of
 * the targets in turn; per response, the server's user and system CPU time
 * and minor page faults (/proc/<pid>/stat).
 *
 *   npm run bench:instructions
 *   INSTR_CACHE=1 npm run bench:instructions
 *   INSTR_MODE=native INSTR_ROUNDS=3 npm run bench:instructions
 *   INSTR_TARGETS=page INSTR_ENV_PAGE="LOG_LEVEL=warn" INSTR_MODE=native npm run bench:instructions
 *
 * INSTR_TARGETS (bare,floor,page), INSTR_USERS (20000), INSTR_CONNECTIONS (10),
 * INSTR_WARMUP and INSTR_REQUESTS (12000 and 1500 under callgrind, 10000 and
 * 40000 native), INSTR_ENV_PAGE: settings for gatehouse's server, as
 * NAME=value pairs separated by spaces; INSTR_TUNABLES: a GLIBC_TUNABLES value
 * for every server (`glibc.malloc.trim_threshold=268435456`).
 * Needs valgrind (Debian's package) for the callgrind mode; `npm run build` first.
 *
 * What it showed on 29 November 2026 is in the message of commit dae8fca.
 */
import autocannon from 'autocannon'
import { spawn, execFileSync, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readdirSync, readFileSync, existsSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { seedSqliteUsers, USERS_PATH } from './fixtures.ts'
import { uncachedPaths } from './uncached-page.ts'
import { childEnv, envFlag, envInt, envPairs, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, log, machineInfo, makeTmpDir, migrateSqliteFile, processUsageOf, ROOT, runBench, writeResults } from './harness.ts'

type Target = 'bare' | 'floor' | 'page'
const TARGETS: readonly Target[] = ['bare', 'floor', 'page']
const native = process.env.INSTR_MODE === 'native'
if (!native && process.env.INSTR_MODE !== undefined && process.env.INSTR_MODE !== 'callgrind') throw new Error('INSTR_MODE must be callgrind or native')
const settings = {
  targets: (process.env.INSTR_TARGETS ?? TARGETS.join(',')).split(',').map(t => {
    if (!(TARGETS as readonly string[]).includes(t)) throw new Error(`INSTR_TARGETS: ${t} is none of ${TARGETS.join(', ')}`)
    return t as Target
  }),
  users: envInt('INSTR_USERS', 20_000),
  connections: envInt('INSTR_CONNECTIONS', 10),
  warmup: envInt('INSTR_WARMUP', native ? 10_000 : 12_000),
  requests: envInt('INSTR_REQUESTS', native ? 40_000 : 1500),
  rounds: envInt('INSTR_ROUNDS', native ? 3 : 1),
  cache: envFlag('INSTR_CACHE'),
  pageEnv: envPairs('INSTR_ENV_PAGE'),
  tunables: process.env.INSTR_TUNABLES
}
const KEY = `gatehouse_${'instructions'.repeat(4).slice(0, 43)}`

installCleanUp({ keepTmp: false })
const running = new Set<ChildProcess>()
process.once('exit', () => { for (const child of running) child.kill('SIGKILL') })

interface Counted { target: Target, mainThread: number, allThreads: number, cache?: Record<string, number> }
interface Timed { target: Target, round: number, userUs: number, sysUs: number, minorFaults: number }

async function main (): Promise<void> {
  const tmp = makeTmpDir('gatehouse-instructions-')
  const dbPath = join(tmp, 'bench.db')
  await migrateSqliteFile(dbPath)
  seedSqliteUsers(dbPath, settings.users)
  log(`seeded ${settings.users} users; ${native ? `native, ${settings.rounds} round(s)` : `callgrind${settings.cache ? ' with the cache simulation' : ''}`}, ${settings.warmup} requests to warm up, ${settings.requests} measured, ${settings.connections} connections`)
  const paths = uncachedPaths(settings.users)
  const counted: Counted[] = []
  const timed: Timed[] = []
  for (let round = 1; round <= settings.rounds; round++) {
    for (const target of settings.targets) {
      const server = await startServer(target, tmp, dbPath)
      try {
        await load(server.port, target, paths, settings.warmup)
        if (native) {
          const before = processUsageOf(server.child.pid)
          await load(server.port, target, paths, settings.requests)
          const after = processUsageOf(server.child.pid)
          if (before === undefined || after === undefined) throw new Error('INSTR_MODE=native reads /proc/<pid>/stat, which this system does not have')
          const per = (a: number, b: number, scale: number): number => (b - a) * scale / settings.requests
          timed.push({ target, round, userUs: per(before.userS, after.userS, 1e6), sysUs: per(before.systemS, after.systemS, 1e6), minorFaults: per(before.minorFaults, after.minorFaults, 1) })
        } else {
          control(server, '--instr=on')
          // A few requests with instrumentation on before counting: callgrind translates the code it meets anew.
          await load(server.port, target, paths, 200)
          control(server, '-z')
          await load(server.port, target, paths, settings.requests)
          control(server, '-d')
          counted.push({ target, ...readCounts(server.outDir, settings.requests) })
        }
      } finally {
        server.child.kill('SIGKILL')
        await new Promise(resolve => server.child.once('exit', resolve))
        running.delete(server.child)
      }
      log(`${target} done${native ? ` (round ${round})` : ''}`)
    }
  }
  const report = native ? printNative(timed) : printCounted(counted)
  writeResults('instructions', new Date().toISOString().replace(/[:.]/g, '-'), { settings, machine: machineInfo(), git: gitInfo(), ...report })
}

interface Server { child: ChildProcess, port: number, env: NodeJS.ProcessEnv, outDir: string }

async function startServer (target: Target, tmp: string, dbPath: string): Promise<Server> {
  const port = await freePort()
  const outDir = mkdtempSync(join(tmp, `${target}-`))
  const env = childEnv({
    PORT: String(port),
    ...(settings.tunables !== undefined ? { GLIBC_TUNABLES: settings.tunables } : {}),
    ...(target === 'floor' ? { BARE_PAGE_DB: `sqlite:${dbPath}` } : {}),
    ...(target === 'page'
      ? { HOST, DATABASE_URL: `sqlite:${dbPath}`, RATE_LIMIT_PER_CREDENTIAL: '1000000000', RATE_LIMIT_PER_ADDRESS: '1000000000', GATEHOUSE_ADMIN_API_KEY: KEY, ...settings.pageEnv }
      : {})
  })
  // Every server with V8's defaults, as gatehouse's server and `npm run bench`'s floor (uncached-page.ts) run.
  const bareServer = ['--import', 'tsx', join(ROOT, 'bench', 'bare-server.ts')]
  const script = target === 'page' ? [join(ROOT, 'dist', 'server.js')] : bareServer
  if (target === 'page' && !existsSync(script[0]!)) throw new Error('dist/server.js is missing: run `npm run build` first')
  const command = native
    ? [process.execPath, ...script]
    // The JIT rewrites code it has run: valgrind must look for that, or it runs stale translations.
    : ['valgrind', '--tool=callgrind', '--separate-threads=yes', '--instr-atstart=no', '--smc-check=all-non-file',
        ...(settings.cache ? ['--cache-sim=yes'] : []), `--callgrind-out-file=${join(outDir, 'callgrind.out')}`, process.execPath, ...script]
  let stderr = ''
  const child = spawn(command[0]!, command.slice(1), { cwd: ROOT, env, stdio: ['ignore', 'ignore', 'pipe'] })
  running.add(child)
  child.stderr!.on('data', (chunk: Buffer) => { stderr = (stderr + chunk.toString()).slice(-4000) })
  const ready = `http://${HOST}:${port}${target === 'page' ? '/auth/healthz' : `${USERS_PATH}?limit=1`}`
  // Under valgrind a start takes some 10 to 30 s.
  const deadline = Date.now() + 180_000
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`${target} exited before it was ready:\n${stderr}`)
    try {
      const res = await fetch(ready)
      await res.arrayBuffer()
      if (res.ok) break
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${target} did not answer ${ready} within 180 s:\n${stderr}`)
    await sleep(200)
  }
  return { child, port, env, outDir }
}

async function load (port: number, target: Target, paths: string[], amount: number): Promise<void> {
  let next = 0
  const result = await autocannon(target === 'bare'
    ? { url: `http://${HOST}:${port}${USERS_PATH}?limit=50`, connections: settings.connections, amount }
    : {
        url: `http://${HOST}:${port}`,
        connections: settings.connections,
        amount,
        headers: { 'x-api-key': KEY },
        requests: [{ method: 'GET', setupRequest: (request: autocannon.Request) => ({ ...request, path: paths[next++ % paths.length]! }) }]
      })
  if (result.non2xx > 0 || result.errors > 0 || result.timeouts > 0) throw new Error(`${target}: ${result.non2xx} answers not 2xx, ${result.errors} errors, ${result.timeouts} timeouts`)
}

/**
 * callgrind_control finds the server by a pipe whose name holds the user and
 * host names valgrind read from its environment; it is given the same.
 */
function control (server: Server, command: string): void {
  execFileSync('callgrind_control', [command, String(server.child.pid)], { env: { ...server.env, PATH: process.env.PATH }, stdio: ['ignore', 'ignore', 'pipe'] })
}

/** The dump's counts per response: thread 1 (the main thread) and all threads; with the cache simulation, its misses in all threads. */
function readCounts (outDir: string, requests: number): Omit<Counted, 'target'> {
  let mainThread = 0
  let allThreads = 0
  const cache: Record<string, number> = {}
  const files = readdirSync(outDir).filter(name => /^callgrind\.out\.1-\d+$/.test(name))
  if (files.length === 0) throw new Error(`callgrind wrote no dump in ${outDir}`)
  for (const name of files) {
    const text = readFileSync(join(outDir, name), 'utf8')
    const events = /^events: (.+)$/m.exec(text)?.[1]?.split(' ')
    const summary = /^summary: (.+)$/m.exec(text)?.[1]?.split(' ').map(Number)
    if (events === undefined || summary === undefined) continue
    const ir = summary[events.indexOf('Ir')] ?? 0
    allThreads += ir
    if (name.endsWith('-01')) mainThread = ir
    events.forEach((event, i) => { if (event !== 'Ir') cache[event] = (cache[event] ?? 0) + (summary[i] ?? 0) })
  }
  const per = (n: number): number => n / requests
  return {
    mainThread: per(mainThread),
    allThreads: per(allThreads),
    ...(settings.cache ? { cache: Object.fromEntries(Object.entries(cache).map(([event, n]) => [event, per(n)])) } : {})
  }
}

function printCounted (counted: Counted[]): { counted: Counted[] } {
  const bare = counted.find(c => c.target === 'bare')
  const cacheColumns = settings.cache ? ['I1mr', 'D1mr', 'D1mw', 'ILmr', 'DLmr', 'DLmw'] : []
  const { lines } = formatTable(
    ['target', 'instructions / response, main thread', 'all threads', 'bare ÷ target (main thread)', ...cacheColumns.map(c => `${c} / response`)],
    counted.map(c => [
      c.target,
      fmt(c.mainThread),
      fmt(c.allThreads),
      bare === undefined ? '' : fmt(bare.mainThread / c.mainThread, 3),
      ...cacheColumns.map(column => fmt(c.cache?.[column] ?? 0))
    ]))
  console.log(lines.join('\n'))
  if (settings.cache) console.log('I1/D1: first-level instruction and data cache misses (mr read, mw write); IL/DL: last-level misses.')
  return { counted }
}

function printNative (timed: Timed[]): { timed: Timed[] } {
  const bareOf = (round: number): Timed | undefined => timed.find(t => t.target === 'bare' && t.round === round)
  const { lines } = formatTable(
    ['round', 'target', 'user µs / response', 'system µs', 'total µs', 'minor faults / response', 'bare ÷ target'],
    timed.map(t => {
      const bare = bareOf(t.round)
      const total = t.userUs + t.sysUs
      return [String(t.round), t.target, fmt(t.userUs, 1), fmt(t.sysUs, 1), fmt(total, 1), fmt(t.minorFaults, 2), bare === undefined ? '' : fmt((bare.userUs + bare.sysUs) / total, 3)]
    }))
  console.log(lines.join('\n'))
  return { timed }
}

await runBench(main)
