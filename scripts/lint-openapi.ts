import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { buildApp } from '../src/app.ts'
import { defaultConfig } from '../src/config.ts'

/**
 * `npm run lint:openapi`: lints the OpenAPI document the service serves with
 * Spectral (`spectral:oas` and the OWASP ruleset, see .spectral.yaml and
 * docs/openapi-lint.md). The document is taken from `GET /auth/openapi.json`
 * of an app built as production builds it, on in-memory SQLite, so what is
 * linted is what clients download. Any error or warning fails the run.
 */
const root = fileURLToPath(new URL('..', import.meta.url))

const app = await buildApp({ config: defaultConfig({ databaseUrl: 'sqlite::memory:', logLevel: 'silent' }), logger: false })
let document: string
try {
  const response = await app.inject({ method: 'GET', url: '/auth/openapi.json' })
  if (response.statusCode !== 200) throw new Error(`GET /auth/openapi.json answered ${response.statusCode}`)
  document = JSON.stringify(JSON.parse(response.body), null, 2)
} finally {
  await app.close()
}

const dir = mkdtempSync(join(tmpdir(), 'gatehouse-openapi-'))
try {
  const file = join(dir, 'openapi.json')
  writeFileSync(file, document)
  const args = ['lint', file, '--ruleset', join(root, '.spectral.yaml'), '--fail-severity', 'warn', ...process.argv.slice(2)]
  const result = spawnSync(join(root, 'node_modules', '.bin', 'spectral'), args, { stdio: 'inherit' })
  if (result.error !== undefined) throw result.error
  process.exitCode = result.status ?? 1
} finally {
  rmSync(dir, { recursive: true, force: true })
}
