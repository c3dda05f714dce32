/**
 * Webhooks: what delivery costs the create path, how fast events reach a
 * healthy local receiver, and how long they take to get there. Starts
 * gatehouse (SQLite in a temporary directory, default webhook settings but
 * WEBHOOK_ALLOW_PRIVATE, since the receiver is on 127.0.0.1) and a receiver
 * process (bench/webhook-sink.ts) on 127.0.0.1, then:
 *
 * With WEBHOOK_DELIVERY=false (the instance queues deliveries, sends none):
 *   1. create/none     POST /auth/api/users under load, no webhook endpoint
 *   2. create/one      the same with one endpoint subscribed to user.created:
 *                      the outbox row written with every event, nothing else
 *   3. create/none     again without the endpoint, to bracket 2 (the database grows)
 * Then the server is restarted on the same database with delivery on (the default):
 *   4. create/live     2 again, its deliveries sent by the same process
 *   5. latency         users created one at a time at ~50/s; per event, from its
 *                      occurred_at to its arrival at the receiver
 *
 * Goals (issue 9): create/one within 5% of create/none; latency p99 < 200 ms.
 * Delivered events/s is measured in 4, including the backlog drained after the load.
 *
 * The general request limit is raised to 1e9 a minute, as in bench/sign-in.ts.
 * Prints a table and writes bench/results/webhooks-<timestamp>.json. See bench/README.md.
 *
 *   npm run bench:webhooks
 *   BENCH_DURATION=20 BENCH_CONNECTIONS=20 npm run bench:webhooks
 */
import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type autocannon from 'autocannon'
import {
  busyDuring, childEnv, cleanUp, envFlag, envInt, fmt, formatTable, freePort, gitInfo, HOST, installCleanUp, isQuiet,
  log, machineInfo, makeTmpDir, measureLoad, runBench, startChild, stopChild, waitReady, writeResults, type Child, type LoadCpu, type LoadSummary
} from './harness.ts'

const BASE_PATH = '/auth'
const RAISED_RATE_LIMIT = 1_000_000_000

const settings = {
  durationS: envInt('BENCH_DURATION', 10),
  warmupS: envInt('BENCH_WARMUP', 2),
  connections: envInt('BENCH_CONNECTIONS', 10),
  latencyEvents: envInt('BENCH_LATENCY_EVENTS', 300),
  latencyIntervalMs: envInt('BENCH_LATENCY_INTERVAL_MS', 20),
  keepTmp: envFlag('BENCH_KEEP_TMP')
}

installCleanUp({ keepTmp: settings.keepTmp })

interface Measurement extends LoadSummary, LoadCpu {
  connections: number
  durationS: number
  created: number
  non2xx: number
  errors: number
}

interface SinkStats { count: number, unique: number, first: number | null, last: number | null, latencies: number[] }

function percentile (sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.ceil(p / 100 * sorted.length) - 1)]!
}

async function expectStatus (res: Response, status: number, what: string): Promise<string> {
  const body = await res.text()
  if (res.status !== status) throw new Error(`${what} answered ${res.status}, expected ${status}: ${body.slice(0, 500)}`)
  return body
}

async function main (): Promise<void> {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const dir = makeTmpDir('gatehouse-bench-webhooks-')
  const [port, sinkPort] = [await freePort(), await freePort()]
  const base = `http://${HOST}:${port}${BASE_PATH}`
  const sink = `http://${HOST}:${sinkPort}`
  const adminKey = `gatehouse_${randomBytes(24).toString('hex')}`
  const headers = { 'x-api-key': adminKey, 'content-type': 'application/json' }

  const sinkChild = startChild('sink', 'bench/webhook-sink.ts', childEnv({ PORT: String(sinkPort) }))
  const startServer = async (name: string, extra: Record<string, string>): Promise<Child> => {
    const child = startChild(name, 'src/server.ts', childEnv({
      DATABASE_URL: `sqlite:${join(dir, 'bench.db')}`,
      HOST,
      PORT: String(port),
      LOG_LEVEL: 'warn',
      GATEHOUSE_ADMIN_API_KEY: adminKey,
      RATE_LIMIT_PER_CREDENTIAL: String(RAISED_RATE_LIMIT),
      RATE_LIMIT_PER_ADDRESS: String(RAISED_RATE_LIMIT),
      WEBHOOK_ALLOW_PRIVATE: 'true',
      ...extra
    }))
    await waitReady(child, `${base}/readyz`)
    return child
  }
  await waitReady(sinkChild, `${sink}/stats`)
  let server = await startServer('gatehouse-queue-only', { WEBHOOK_DELIVERY: 'false' })
  log('server (delivery off) and receiver ready')

  let counter = 0
  const prefix = randomBytes(3).toString('hex')
  const createLoad = (): autocannon.Options & { connections: number } => ({
    url: `${base}/api/users`,
    connections: settings.connections,
    requests: [{
      method: 'POST',
      headers,
      setupRequest: (request: autocannon.Request) => ({ ...request, body: JSON.stringify({ username: `b${prefix}_${counter++}` }) })
    }]
  })
  const measure = async (name: string): Promise<Measurement> => {
    const run = await measureLoad(name, server, createLoad(), settings)
    return {
      ...run.summary,
      serverCpu: run.serverCpu,
      loadGeneratorCpu: run.loadGeneratorCpu,
      otherCpu: run.otherCpu,
      connections: settings.connections,
      durationS: settings.durationS,
      created: (run.warm.requests.total - run.warm.non2xx) + (run.result.requests.total - run.result.non2xx),
      non2xx: run.warm.non2xx + run.result.non2xx,
      errors: run.warm.errors + run.result.errors + run.result.timeouts
    }
  }
  const stats = async (since: number): Promise<SinkStats> => await (await fetch(`${sink}/stats?since=${since}`)).json() as SinkStats

  const createHook = async (): Promise<{ id: string }> => JSON.parse(await expectStatus(await fetch(`${base}/api/webhooks`, {
    method: 'POST', headers, body: JSON.stringify({ url: `${sink}/hook`, event_types: ['user.created'] })
  }), 201, 'POST /api/webhooks')) as { id: string }
  const deleteHook = async (id: string): Promise<void> => {
    await expectStatus(await fetch(`${base}/api/webhooks/${id}`, { method: 'DELETE', headers: { 'x-api-key': adminKey } }), 204, 'DELETE /api/webhooks')
  }

  // 1-3. The outbox's cost on the create path, delivery off.
  const none1 = await measure('create/none')
  const queued = await createHook()
  const one = await measure('create/one')
  await deleteHook(queued.id)
  const none2 = await measure('create/none (again)')

  // 4. Delivery on: the same load, its deliveries sent by the same process.
  await stopChild(server)
  server = await startServer('gatehouse', {})
  log('server restarted with delivery on')
  await createHook()
  const oneStart = Date.now()
  const live = await measure('create/live')
  const loadEnd = Date.now()
  const atLoadEnd = await stats(oneStart)
  log(`create/live: ${live.created} events to deliver, ${atLoadEnd.unique} delivered when the load ended; draining`)
  const drainDeadline = Date.now() + 300_000
  let delivered = atLoadEnd
  while (delivered.unique < live.created && Date.now() < drainDeadline) {
    await sleep(250)
    delivered = await stats(oneStart)
  }
  if (delivered.unique < live.created) throw new Error(`only ${delivered.unique} of ${live.created} events were delivered within 5 minutes`)
  // Requests autocannon had in flight when it stopped may still have created users: wait until nothing more arrives.
  for (let quiet = 0; quiet < 4 && Date.now() < drainDeadline;) {
    await sleep(250)
    const now = await stats(oneStart)
    quiet = now.count === delivered.count ? quiet + 1 : 0
    delivered = now
  }
  const drainedAfterLoad = delivered.unique - atLoadEnd.unique
  const throughput = {
    events: delivered.unique,
    deliveries: delivered.count,
    duplicates: delivered.count - delivered.unique,
    deliveredPerSecOverall: delivered.unique / ((delivered.last! - delivered.first!) / 1000),
    deliveredPerSecDuringLoad: atLoadEnd.unique / ((loadEnd - oneStart) / 1000),
    backlogAtLoadEnd: live.created - atLoadEnd.unique,
    drainPerSec: drainedAfterLoad > 0 ? drainedAfterLoad / ((delivered.last! - loadEnd) / 1000) : null
  }

  // 5. Latency with a healthy receiver, at a moderate steady rate.
  log(`latency: ${settings.latencyEvents} events, one every ${settings.latencyIntervalMs} ms`)
  const latencyStart = Date.now()
  for (let i = 0; i < settings.latencyEvents; i++) {
    const started = Date.now()
    await expectStatus(await fetch(`${base}/api/users`, { method: 'POST', headers, body: JSON.stringify({ username: `l${prefix}_${i}` }) }), 201, 'POST /api/users')
    await sleep(Math.max(0, settings.latencyIntervalMs - (Date.now() - started)))
  }
  let latencyStats = await stats(latencyStart)
  const latencyDeadline = Date.now() + 60_000
  while (latencyStats.unique < settings.latencyEvents && Date.now() < latencyDeadline) {
    await sleep(100)
    latencyStats = await stats(latencyStart)
  }
  const sorted = [...latencyStats.latencies].sort((a, b) => a - b)
  const latency = {
    events: settings.latencyEvents,
    delivered: latencyStats.unique,
    p50Ms: percentile(sorted, 50),
    p90Ms: percentile(sorted, 90),
    p99Ms: percentile(sorted, 99),
    maxMs: sorted.at(-1) ?? NaN
  }

  // Report.
  const baseline = (none1.reqPerSec.average + none2.reqPerSec.average) / 2
  const ratio = one.reqPerSec.average / baseline
  const cpuBaseline = none1.serverCpu !== null && none2.serverCpu !== null ? (none1.serverCpu.usPerRequest + none2.serverCpu.usPerRequest) / 2 : null
  const rows: Array<[string, Measurement]> = [['create/none', none1], ['create/one', one], ['create/none (again)', none2], ['create/live', live]]
  const { lines } = formatTable(['target', 'req/s', 'p50 ms', 'p99 ms', 'server cores', 'server µs/req'], rows.map(([name, m]) => [
    name, fmt(m.reqPerSec.average), fmt(m.latencyMs.p50), fmt(m.latencyMs.p99),
    m.serverCpu !== null ? fmt(m.serverCpu.cores, 2) : '?', m.serverCpu !== null ? fmt(m.serverCpu.usPerRequest) : '?'
  ]))
  for (const line of lines) process.stdout.write(line + '\n')
  process.stdout.write(`\ncreate/one ÷ mean(create/none): ${fmt(ratio * 100, 1)}% of the throughput (goal ≥ 95%)` +
    (cpuBaseline !== null && one.serverCpu !== null ? `; ${fmt(one.serverCpu.usPerRequest - cpuBaseline)} µs more server CPU per create (the outbox row)` : '') + '\n')
  process.stdout.write(`create/live ÷ mean(create/none): ${fmt(live.reqPerSec.average / baseline * 100, 1)}% (the same process also sending every delivery)\n`)
  process.stdout.write(`delivered: ${fmt(throughput.deliveredPerSecOverall)} events/s overall, ${fmt(throughput.deliveredPerSecDuringLoad)}/s during the load` +
    (throughput.drainPerSec !== null ? `, ${fmt(throughput.drainPerSec)}/s draining a backlog of ${fmt(throughput.backlogAtLoadEnd)}` : '') +
    `; ${throughput.duplicates} duplicates\n`)
  process.stdout.write(`latency (${latency.delivered}/${latency.events} events at ~${fmt(1000 / settings.latencyIntervalMs)}/s): p50 ${latency.p50Ms} ms, p90 ${latency.p90Ms} ms, p99 ${latency.p99Ms} ms, max ${latency.maxMs} ms (goal p99 < 200 ms)\n`)
  const busy = busyDuring(rows)
  if (busy.length > 0) process.stdout.write(`WARNING: other processes were busy: ${busy.join(', ')}; compare with care\n`)

  const valid = rows.every(([, m]) => m.non2xx === 0 && m.errors === 0) && latency.delivered === latency.events
  writeResults('webhooks', stamp, {
    benchmark: 'webhooks',
    startedAt: stamp,
    valid,
    quiet: isQuiet(rows.map(([, m]) => m)),
    settings,
    machine: machineInfo(),
    git: gitInfo(),
    createNone: none1,
    createOne: one,
    createNoneAgain: none2,
    createLive: live,
    createRatio: ratio,
    throughput,
    latency
  })
  await cleanUp()
  if (!valid) {
    log('INVALID RUN: non-2xx responses, errors, or undelivered events (see the JSON)')
    process.exitCode = 1
  }
}

await runBench(main)
