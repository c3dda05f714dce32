import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { appendFileSync, cpSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'

const root = fileURLToPath(new URL('..', import.meta.url))
const run = promisify(execFile)

interface Violation { from: string, to: string, rule: { name: string } }

/** dependency-cruiser with the project's own rules (.dependency-cruiser.cjs), over `dir`'s src/. */
async function violations (dir: string): Promise<Violation[]> {
  const bin = join(root, 'node_modules', 'dependency-cruiser', 'bin', 'dependency-cruise.mjs')
  const { stdout } = await run(process.execPath, [bin, 'src', '--config', '.dependency-cruiser.cjs', '--output-type', 'json'], {
    cwd: dir, maxBuffer: 64 * 1024 * 1024
  }).catch((error: { stdout?: string }) => {
    // Exit code 1 with a report is a violation found, not a failure to check.
    if (typeof error.stdout === 'string' && error.stdout.startsWith('{')) return { stdout: error.stdout }
    throw error
  })
  return (JSON.parse(stdout) as { summary: { violations: Violation[] } }).summary.violations
}

describe('the import rules of src/ (docs/architecture.md)', () => {
  let copy: string
  before(() => {
    copy = mkdtempSync(join(tmpdir(), 'gatehouse-architecture-'))
    for (const entry of ['src', 'tsconfig.json', 'package.json', '.dependency-cruiser.cjs']) cpSync(join(root, entry), join(copy, entry), { recursive: true })
    symlinkSync(join(root, 'node_modules'), join(copy, 'node_modules'))
  })
  after(() => { rmSync(copy, { recursive: true, force: true }) })

  it('hold for src/ as it is: no cycle, no service importing a service, nothing but the entry point importing app.ts', async () => {
    assert.deepEqual(await violations(root), [])
  })

  // Each case adds one import that breaks one rule to a copy of src/, and expects exactly that rule to catch it.
  const cases: Array<{ rule: string, file: string, line: string }> = [
    { rule: 'services-never-import-services', file: 'src/users/users.service.ts', line: "export { openSession } from '../sessions/sessions.service.ts'" },
    { rule: 'services-stay-below-flows-and-routes', file: 'src/mfa/mfa.service.ts', line: "export { signIn } from '../sign-in/password.flow.ts'" },
    { rule: 'data-stays-at-the-bottom', file: 'src/users/users.repository.ts', line: "export type { UsersDeps } from './users.service.ts'" },
    { rule: 'flows-stay-below-routes', file: 'src/sign-in/oidc.flow.ts', line: "export { sessionContext } from '../sessions/cookies.ts'" },
    { rule: 'only-the-entry-point-imports-app', file: 'src/users/users.routes.ts', line: "export type { BuildOptions } from '../app.ts'" },
    { rule: 'no-circular', file: 'src/bootstrap.ts', line: "export { redactUrl } from './app.ts'" }
  ]
  for (const { rule, file, line } of cases) {
    it(`catch ${rule}: ${line.trim()} in ${file}`, async () => {
      const dir = mkdtempSync(join(copy, 'case-'))
      try {
        for (const entry of ['src', 'tsconfig.json', 'package.json', '.dependency-cruiser.cjs']) cpSync(join(copy, entry), join(dir, entry), { recursive: true })
        symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'))
        appendFileSync(join(dir, file), `\n${line}\n`)
        if (rule === 'no-circular') {
          // bootstrap.ts is imported by server.ts only; make app.ts import it back, closing a cycle.
          appendFileSync(join(dir, 'src/app.ts'), "\nexport { bootstrap as bootstrapForCycle } from './bootstrap.ts'\n")
        }
        const found = await violations(dir)
        assert.ok(found.some(v => v.rule.name === rule), `expected ${rule}, got ${JSON.stringify(found.map(v => [v.rule.name, v.from, v.to]))}`)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    })
  }

  it('are part of npm run lint, which npm test runs', () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }
    assert.match(pkg.scripts.lint!, /depcruise src --config \.dependency-cruiser\.cjs/)
    assert.match(pkg.scripts.test!, /npm run lint/)
  })
})
