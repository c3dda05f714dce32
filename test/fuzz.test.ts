import assert from 'node:assert/strict'
import type { AddressInfo } from 'node:net'
import { describe, test } from 'node:test'
import { FUZZ_CONFIG_OVERRIDES, runFuzz, shorten } from '../bench/fuzz-requests.ts'
import { dialects, useTestApp } from './helpers.ts'

/**
 * A small seeded slice of `npm run fuzz` (bench/fuzz.ts), on each database:
 * the same generator, over the real HTTP server. A fixed seed, so a failure
 * here repeats; `FUZZ_SEED=<seed> npm run fuzz` explores further.
 */
const SEED = 20261124
const REQUESTS = 1500

for (const dialect of dialects()) {
  describe(`fuzzed requests from the OpenAPI document (${dialect.name})`, () => {
    const errorLines: string[] = []
    const t = useTestApp(dialect, FUZZ_CONFIG_OVERRIDES, {
      write: (line: string) => { if (/"level":(50|60)/.test(line)) errorLines.push(line) }
    })

    test(`${REQUESTS} generated requests (seed ${SEED}), at least 15 % of them to SCIM, get no 5xx, every error is problem+json (SCIM's error body on SCIM), and every request is answered`, async () => {
      await t.app.listen({ host: '127.0.0.1', port: 0 })
      const { port } = t.app.server.address() as AddressInfo
      const result = await runFuzz({
        target: { host: '127.0.0.1', port, basePath: t.config.basePath, adminKey: t.adminKey },
        seed: SEED,
        requests: REQUESTS,
        concurrency: 8,
        timeLimitMs: 120_000
      })
      assert.equal(result.stoppedByTime, false, 'the run ended before all requests were sent')
      const failures = [...result.findings.values()].filter(f => f.kind === '5xx' || f.kind === 'not_problem_json' || f.kind === 'no_answer')
      const report = failures.map(f => {
        const logLine = errorLines.find(line => line.includes(`"reqId":"${f.requestId}"`))
        return `${f.kind} ${f.status} ${f.method} ${f.template} (${f.detail}) ${f.count}x, request ${f.index}\n  ${shorten(f.curl, 600)}\n  ${shorten(f.body, 400)}\n  ${logLine?.slice(0, 1500) ?? ''}`
      }).join('\n')
      assert.equal(failures.length, 0, `seed ${SEED}:\n${report}`)
      assert.ok(result.sent >= REQUESTS * 0.95, `only ${result.sent} of ${REQUESTS} requests were sent`)
      // SCIM is in the document, so the fuzz reaches it: issue 38 asks for at least 15 % of the requests.
      assert.ok(result.scimSent >= result.sent * 0.15, `only ${result.scimSent} of ${result.sent} requests went to SCIM`)
    })
  })
}
