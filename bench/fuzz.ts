/**
 * `npm run fuzz`: starts gatehouse (src/server.ts, the code as it is in this
 * checkout) on a free loopback port with a fresh database, sends generated
 * requests for every operation of its OpenAPI document and its pages
 * (bench/fuzz-requests.ts), and prints the status histogram and each distinct
 * 5xx with a curl that reproduces it and the server's error log line, and
 * the share of requests that went to SCIM (SCIM_SHARE). Exits 1
 * when any request got a 5xx, an error answer was not problem+json, or the
 * server died.
 *
 * FUZZ_REQUESTS (100000), FUZZ_SEED (random, printed), FUZZ_DATABASE (sqlite,
 * or a postgres:// URL: a fresh schema, dropped afterwards), FUZZ_REDIS_URL,
 * FUZZ_CONCURRENCY (8), FUZZ_TIME_LIMIT_S (3600), FUZZ_KEEP_TMP (keep the server log).
 */
import { randomBytes, randomInt } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import pg from 'pg'
import { childEnv, cleanUp, envFlag, envInt, fmt, freePort, HOST, installCleanUp, isRunning, log, makeTmpDir, runBench, startChild, tail, waitReady } from './harness.ts'
import { FUZZ_ADMIN_PASSWORD, FUZZ_ADMIN_USERNAME, FUZZ_SERVER_ENV, runFuzz, shorten, type Finding } from './fuzz-requests.ts'

const BASE_PATH = '/auth'

async function main (): Promise<void> {
  installCleanUp({ keepTmp: envFlag('FUZZ_KEEP_TMP') })
  const requests = envInt('FUZZ_REQUESTS', 100_000)
  const concurrency = envInt('FUZZ_CONCURRENCY', 8)
  const timeLimitS = envInt('FUZZ_TIME_LIMIT_S', 3600)
  const seedText = process.env.FUZZ_SEED
  if (seedText !== undefined && seedText !== '' && !/^-?\d+$/.test(seedText)) throw new Error(`FUZZ_SEED must be a whole number, got "${seedText}"`)
  const seed = seedText !== undefined && seedText !== '' ? Number(seedText) : randomInt(1, 2 ** 31 - 1)
  const database = process.env.FUZZ_DATABASE ?? 'sqlite'
  const redisUrl = process.env.FUZZ_REDIS_URL
  const tmp = makeTmpDir('gatehouse-fuzz-')
  const port = await freePort()
  const adminKey = `gatehouse_${randomBytes(32).toString('hex')}`

  let databaseUrl: string
  let schema: string | undefined
  if (database === 'sqlite') {
    databaseUrl = `sqlite:${join(tmp, 'fuzz.db')}`
  } else if (/^postgres(ql)?:\/\//.test(database)) {
    databaseUrl = database
    schema = `gh_fuzz_${randomBytes(6).toString('hex')}`
  } else {
    throw new Error(`FUZZ_DATABASE must be sqlite or a postgres:// URL, got "${database}"`)
  }

  const settings: Record<string, string> = {
    HOST,
    PORT: String(port),
    BASE_PATH,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'info',
    GATEHOUSE_ADMIN_API_KEY: adminKey,
    GATEHOUSE_ADMIN_USERNAME: FUZZ_ADMIN_USERNAME,
    GATEHOUSE_ADMIN_PASSWORD: FUZZ_ADMIN_PASSWORD,
    ...FUZZ_SERVER_ENV,
    ...(schema !== undefined ? { DATABASE_SCHEMA: schema } : {}),
    ...(redisUrl !== undefined && redisUrl !== '' ? { REDIS_URL: redisUrl } : {})
  }
  console.log(`fuzz: seed ${seed} (FUZZ_SEED=${seed} repeats this run), ${fmt(requests)} requests, concurrency ${concurrency}, time limit ${timeLimitS} s`)
  console.log(`fuzz: database ${database === 'sqlite' ? 'SQLite (fresh file)' : `PostgreSQL schema ${schema!}`}${redisUrl !== undefined && redisUrl !== '' ? `, Redis ${redisUrl}` : ''}`)
  console.log('fuzz: throttles off so that requests reach the handlers: ' + Object.entries(FUZZ_SERVER_ENV).filter(([k]) => k !== 'MFA_ENCRYPTION_KEY').map(([k, v]) => `${k}=${v}`).join(' '))

  const server = startChild('gatehouse', 'src/server.ts', childEnv(settings))
  try {
    await waitReady(server, `http://${HOST}:${port}${BASE_PATH}/healthz`)
    const started = Date.now()
    let lastReport = started
    const result = await runFuzz({
      target: { host: HOST, port, basePath: BASE_PATH, adminKey },
      seed,
      requests,
      concurrency,
      timeLimitMs: timeLimitS * 1000,
      isServerAlive: () => isRunning(server),
      onProgress: done => {
        if (Date.now() - lastReport > 15_000) {
          lastReport = Date.now()
          log(`${fmt(done)} requests, ${fmt(done / ((Date.now() - started) / 1000))}/s`)
        }
      }
    })
    const seconds = (Date.now() - started) / 1000
    const serverDied = result.serverDied || !isRunning(server)
    const serverLog = readFileSync(server.stdoutPath, 'utf8').split('\n')

    console.log(`\nfuzz: ${fmt(result.sent)} requests sent in ${fmt(seconds, 1)} s (${fmt(result.sent / seconds)}/s)` +
      `${result.notSent > 0 ? `; ${fmt(result.notSent)} generated requests Node's HTTP client refused to send` : ''}` +
      `${result.stoppedByTime ? '; stopped by FUZZ_TIME_LIMIT_S' : ''}`)
    console.log(`fuzz: ${fmt(result.scimSent)} of them to SCIM (${fmt(100 * result.scimSent / Math.max(1, result.sent), 1)} %)`)
    console.log('status histogram:')
    for (const [status, count] of [...result.statuses].sort((a, b) => a[0] - b[0])) {
      console.log(status === -1 ? `  (oversized body cut off by the server, EPIPE/ECONNRESET while sending)  ${fmt(count)}` : `  ${status}  ${fmt(count)}`)
    }

    const findings = [...result.findings.values()]
    const by = (kind: Finding['kind']): Array<Finding & { count: number }> => findings.filter(f => f.kind === kind).sort((a, b) => b.count - a.count)
    const fivexx = by('5xx')
    console.log(`\ndistinct 5xx: ${fivexx.length}`)
    for (const f of fivexx) {
      console.log(`\n- ${f.status} ${f.method} ${f.template} (${f.detail || 'no code'}): ${fmt(f.count)}x, first at request ${f.index}`)
      console.log(`  repro: ${shorten(f.curl, 1500)}`)
      console.log(`  body:  ${shorten(f.body, 1000)}`)
      const logLine = serverLog.find(line => line.includes(`"reqId":"${f.requestId}"`) && /"level":(50|60)/.test(line))
      console.log(`  log:   ${logLine !== undefined ? logLine.slice(0, 3000) : '(no error line for this request id)'}`)
    }
    const notProblem = by('not_problem_json')
    if (notProblem.length > 0) {
      console.log(`\nerror answers that are not problem+json: ${notProblem.length} distinct`)
      for (const f of notProblem) console.log(`- ${f.status} ${f.method} ${f.template}: ${f.detail} (${fmt(f.count)}x)\n  repro: ${shorten(f.curl)}\n  body: ${shorten(f.body, 300)}`)
    }
    const noAnswer = by('no_answer')
    if (noAnswer.length > 0) {
      console.log(`\nrequests without an answer: ${noAnswer.length} distinct`)
      for (const f of noAnswer) console.log(`- ${f.method} ${f.template}: ${f.detail} (${fmt(f.count)}x)\n  repro: ${shorten(f.curl)}\n  ${f.body}`)
    }
    const largeLocation = by('large_location')
    if (largeLocation.length > 0) {
      console.log('\nredirects with a Location over 8 KiB (not failures; Node\'s HTTP client refuses response headers over 16 KiB):')
      for (const f of largeLocation) console.log(`- ${f.status} ${f.method} ${f.template}: ${fmt(f.count)}x, e.g. ${shorten(f.curl, 400)}\n  ${f.body}`)
    }
    const dependencyDown = by('dependency_down')
    if (dependencyDown.length > 0) {
      console.log('\n503 by design, not counted as failures (an OIDC provider the fuzz itself created, whose issuer does not answer):')
      for (const f of dependencyDown) console.log(`- ${f.method} ${f.template}: ${fmt(f.count)}x`)
    }
    if (serverDied) console.log(`\nTHE SERVER DIED. Its stderr:\n${tail(server.stderrPath, 40)}`)
    console.log('\n(The curls use $ADMIN_KEY and $SESSION: an admin API key (for SCIM\'s operations, a key with the scim scope) and a session token of the server you repeat them against.)')
    const failed = fivexx.length > 0 || notProblem.length > 0 || noAnswer.length > 0 || serverDied
    console.log(`fuzz: ${failed ? 'FAILED' : 'passed'}: ${fmt(fivexx.reduce((n, f) => n + f.count, 0))} 5xx, ${fmt(result.scimSent)} of ${fmt(result.sent)} requests to SCIM, ${serverDied ? 'the server died' : 'the server stayed up'}, seed ${seed}`)
    process.exitCode = failed ? 1 : 0
  } finally {
    if (schema !== undefined) schemaToDrop = { url: databaseUrl, schema }
  }
}

/** The run's PostgreSQL schema, dropped once the server has stopped. */
let schemaToDrop: { url: string, schema: string } | undefined

await runBench(main)
await cleanUp()
if (schemaToDrop !== undefined) {
  const client = new pg.Client({ connectionString: schemaToDrop.url })
  await client.connect()
  try { await client.query(`drop schema if exists "${schemaToDrop.schema}" cascade`) } finally { await client.end() }
}
