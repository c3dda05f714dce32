import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { after, describe, it } from 'node:test'
import { loadConfig, RETIRED_SETTINGS, retiredSettingWarnings } from '../src/config.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

interface LogLine { level: number, msg: string }

/** The service's own start (src/server.ts) with this environment, until it serves; its log lines as JSON. */
async function startAndReadLog (env: Record<string, string>): Promise<LogLine[]> {
  const lines: LogLine[] = []
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stderr = ''
  let exited: number | null | undefined
  child.on('exit', code => { exited = code })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  let pending = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    pending += d
    const complete = pending.split('\n')
    pending = complete.pop() ?? ''
    for (const line of complete) if (line.startsWith('{')) lines.push(JSON.parse(line) as LogLine)
  })
  try {
    await waitFor('the service to serve', () => {
      if (exited !== undefined) throw new Error(`the service exited with ${exited}: ${stderr}`)
      return lines.some(line => line.msg === 'gatehouse is serving')
    }, 60_000)
  } finally {
    child.kill('SIGTERM')
    if (exited === undefined) await new Promise(resolve => child.once('exit', resolve))
  }
  return lines
}

describe('retired settings', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gatehouse-retired-'))
  after(() => { rmSync(dir, { recursive: true, force: true }) })

  it('names each retired setting and what replaced it, and reads none of them', () => {
    assert.ok('DATABASE_READ_PIPELINES' in RETIRED_SETTINGS)
    assert.deepEqual(retiredSettingWarnings({}), [])
    const [warning, ...more] = retiredSettingWarnings({ DATABASE_READ_PIPELINES: '4' })
    assert.deepEqual(more, [])
    assert.match(warning!, /^DATABASE_READ_PIPELINES is set but no longer read, and is ignored: .*DATABASE_POOL_SIZE/)
    // Even a value the earlier release refused starts: the setting is not read at all.
    assert.doesNotThrow(() => loadConfig({ DATABASE_READ_PIPELINES: 'many' }))
  })

  it('starts the service with a retired setting and warns at start, once, naming what replaced it', async () => {
    const base = {
      DATABASE_URL: `sqlite:${join(dir, 'retired.db')}`,
      HOST: '127.0.0.1',
      PORT: String(await freePort()),
      LOG_LEVEL: 'info',
      ARGON2_MEMORY_KIB: '19456'
    }
    const withRetired = await startAndReadLog({ ...base, DATABASE_READ_PIPELINES: '4' })
    const warnings = withRetired.filter(line => line.level === 40 && line.msg.startsWith('DATABASE_READ_PIPELINES'))
    assert.equal(warnings.length, 1, JSON.stringify(withRetired))
    assert.match(warnings[0]!.msg, /ignored: no longer needed: every query takes a connection of the pool, whose size is DATABASE_POOL_SIZE/)

    const without = await startAndReadLog({ ...base, PORT: String(await freePort()) })
    assert.deepEqual(without.filter(line => line.msg.includes('DATABASE_READ_PIPELINES')), [])
  })
})
