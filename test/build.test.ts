import assert from 'node:assert/strict'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { dialects, dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { freePort } from './ports.ts'
import { TEST_REDIS_URL } from './redis.ts'

const root = fileURLToPath(new URL('..', import.meta.url))
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }

/** The fields of the line that says the service is serving, from a start's output. */
function servingLine (output: string): Record<string, unknown> | undefined {
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue
    let entry: Record<string, unknown>
    try {
      entry = JSON.parse(line) as Record<string, unknown>
    } catch {
      // the last line, still arriving
      continue
    }
    if (entry.msg === 'gatehouse is serving') return entry
  }
  return undefined
}

/** Starts dist/server.js on SQLite and waits until it serves, and, with `until`, for a line matching it. */
async function startBuilt (env: NodeJS.ProcessEnv, until?: RegExp): Promise<{ output: string, stop: () => Promise<void> }> {
  const port = await freePort()
  const child = spawn(process.execPath, [join(root, 'dist/server.js')], { env: { PATH: process.env.PATH, HOST: '127.0.0.1', PORT: String(port), ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { output += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { output += d })
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null) return
    child.kill('SIGTERM')
    await once(child, 'exit')
  }
  try {
    const deadline = Date.now() + 30_000
    const ready = (): boolean => servingLine(output) !== undefined && (until === undefined || until.test(output))
    while (!ready()) {
      assert.equal(child.exitCode, null, `dist/server.js exited: ${output}`)
      assert.ok(Date.now() < deadline, `no ${until === undefined ? 'serving line' : String(until)} in 30 s: ${output}`)
      await new Promise(resolve => setTimeout(resolve, 50))
    }
    const health = await fetch(`http://127.0.0.1:${port}/auth/healthz`)
    assert.equal(health.status, 200, output)
  } catch (error) {
    await stop()
    throw error
  }
  return { get output () { return output }, stop }
}

/**
 * `npm start` runs the bundle in dist/, not the sources the other tests load
 * through tsx: what the bundler leaves out or moves (assets read next to a
 * module, package.json, packages that find their files through __dirname,
 * lazily loaded chunks) only shows in that build, so it is built and started
 * here as `npm install && npm start` would.
 */
describe('the built service (npm run build, then node dist/server.js)', () => {
  let tmp: string
  before(() => {
    tmp = mkdtempSync(join(tmpdir(), 'gatehouse-build-'))
    const build = spawnSync(process.execPath, [join(root, 'scripts/build.js')], { cwd: root, encoding: 'utf8' })
    assert.equal(build.status, 0, build.stderr)
  })
  after(() => { rmSync(tmp, { recursive: true, force: true }) })

  for (const dialect of dialects()) {
    // With PostgreSQL, Redis too when there is one (CI has): ioredis and the rate limiter's Redis store are loaded from outside the bundle.
    it(`starts from dist/ on ${dialect.name} and serves the API, the docs, the pages' assets and the lazily loaded second factors`, { timeout: 60_000 }, async () => {
      const port = await freePort()
      const redis = dialect.url !== undefined && TEST_REDIS_URL !== undefined
      const schema = `gh_build_${randomBytes(6).toString('hex')}`
      const env: NodeJS.ProcessEnv = {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        HOST: '127.0.0.1',
        PORT: String(port),
        DATABASE_URL: dialect.url ?? `sqlite:${join(tmp, 'built.db')}`,
        ...(dialect.url !== undefined ? { DATABASE_SCHEMA: schema } : {}),
        ...(redis ? { REDIS_URL: TEST_REDIS_URL } : {}),
        GATEHOUSE_ADMIN_USERNAME: 'builtadmin',
        GATEHOUSE_ADMIN_PASSWORD: GOOD_PASSWORD,
        MFA_ENCRYPTION_KEY: randomBytes(32).toString('base64')
      }
      const child: ChildProcess = spawn(process.execPath, [join(root, 'dist/server.js')], { env, stdio: ['ignore', 'pipe', 'pipe'] })
      let output = ''
      child.stdout!.setEncoding('utf8').on('data', (d: string) => { output += d })
      child.stderr!.setEncoding('utf8').on('data', (d: string) => { output += d })
      const base = `http://127.0.0.1:${port}/auth`
      try {
        const deadline = Date.now() + 30_000
        for (;;) {
          assert.equal(child.exitCode, null, `dist/server.js exited: ${output}`)
          const ready = await fetch(`${base}/readyz`).catch(() => undefined)
          if (ready?.status === 200) {
            assert.deepEqual(Object.keys((await ready.json() as { checks: object }).checks), redis ? ['database', 'redis'] : ['database'])
            break
          }
          assert.ok(Date.now() < deadline, `not ready in 30 s: ${output}`)
          await new Promise(resolve => setTimeout(resolve, 50))
        }

        const version = await (await fetch(`${base}/api/version`)).json() as { version: string, database: string }
        assert.deepEqual({ version: version.version, database: version.database }, { version: pkg.version, database: dialect.name })

        const signIn = await fetch(`${base}/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: 'builtadmin', password: GOOD_PASSWORD }) })
        assert.equal(signIn.status, 200, await signIn.clone().text())
        const { token } = await signIn.json() as { token: string }
        const users = await fetch(`${base}/api/users`, { headers: { authorization: `Bearer ${token}` } })
        assert.equal(users.status, 200)
        assert.deepEqual((await users.json() as Array<{ username: string }>).map(u => u.username), ['builtadmin'])

        const docs = await fetch(`${base}/docs/`)
        assert.equal(docs.status, 200)
        assert.match(await docs.text(), /swagger-ui/i)
        // Swagger UI serves these from its own directory, which the bundle has to give back to it.
        for (const file of ['swagger-ui.css', 'swagger-ui-bundle.js', 'logo.svg']) {
          assert.equal((await fetch(`${base}/docs/static/${file}`)).status, 200, file)
        }
        const spec = await (await fetch(`${base}/openapi.json`)).json() as { info: { version: string } }
        assert.equal(spec.info.version, pkg.version)

        for (const [path, file] of [['admin/assets/console.css', 'src/console/assets/console.css'], ['admin/assets/console.js', 'src/console/assets/console.js']] as const) {
          const asset = await fetch(`${base}/${path}`)
          assert.equal(asset.status, 200, path)
          assert.equal(await asset.text(), readFileSync(join(root, file), 'utf8'), path)
        }
        const mfaScript = await fetch(`${base}/assets/mfa.js`)
        assert.equal(await mfaScript.text(), readFileSync(join(root, 'src/mfa/assets/mfa.js'), 'utf8'))
        assert.equal((await fetch(`${base}/assets/webauthn.js`)).status, 200)
        // Passkeys load @simplewebauthn/server as a chunk of its own, on first use.
        const passkey = await fetch(`${base}/api/me/passkeys/options`, { method: 'POST', headers: { authorization: `Bearer ${token}` } })
        assert.equal(passkey.status, 200, await passkey.clone().text())
        assert.equal(typeof (await passkey.json() as { options: { challenge?: unknown } }).options.challenge, 'string')
        // So do otplib and qrcode, for an authenticator app.
        const totp = await fetch(`${base}/api/me/mfa/totp`, { method: 'POST', headers: { authorization: `Bearer ${token}` } })
        assert.equal(totp.status, 200, await totp.clone().text())
        assert.match((await totp.json() as { qr_svg: string }).qr_svg, /^<svg /)
      } finally {
        child.kill('SIGTERM')
        if (child.exitCode === null) await once(child, 'exit')
        if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
      }
      // The build kept the code V8 compiled for the bundle (dist/warm-code-cache.js), and this start used it.
      assert.equal(servingLine(output)?.code_cache, 'used', output)
    })
  }

  it('writes the service\'s bundle inside Node\'s module function, in strict mode as the ES modules it is made of', () => {
    const start = readFileSync(join(root, 'dist/gatehouse.cjs'), 'latin1').slice(0, 200)
    assert.match(start, /^\(function \(exports, require, module, __filename, __dirname\) \{ 'use strict';/)
    assert.match(readFileSync(join(root, 'dist/cli/main.cjs'), 'latin1').slice(0, 200), /^'use strict';/)
  })

  it('keeps the compiled code where there was none or it was damaged, uses it at the next start, and keeps none when told not to', { timeout: 60_000 }, async () => {
    const cacheDir = join(tmp, 'compile-cache')
    const env = { NODE_COMPILE_CACHE: cacheDir, DATABASE_URL: `sqlite:${join(tmp, 'cache.db')}`, GATEHOUSE_ADMIN_USERNAME: 'builtadmin', GATEHOUSE_ADMIN_PASSWORD: GOOD_PASSWORD }
    const kept = (): string[] => existsSync(join(cacheDir, 'gatehouse')) ? readdirSync(join(cacheDir, 'gatehouse')) : []

    const first = await startBuilt(env, /kept the compiled code for the next start/)
    await first.stop()
    assert.equal(servingLine(first.output)?.code_cache, 'missing', first.output)
    assert.equal(kept().length, 1, kept().join(', '))
    const file = join(cacheDir, 'gatehouse', kept()[0]!)

    const second = await startBuilt(env)
    await second.stop()
    assert.equal(servingLine(second.output)?.code_cache, 'used', second.output)

    // One byte changed in the middle, where V8 itself would not look: refused, compiled afresh, and kept again.
    const data = readFileSync(file)
    const middle = data.length >> 1
    data.writeUInt8(data.readUInt8(middle) ^ 0xff, middle)
    writeFileSync(file, data)
    const third = await startBuilt(env, /kept the compiled code for the next start/)
    await third.stop()
    assert.equal(servingLine(third.output)?.code_cache, 'rejected', third.output)
    const fourth = await startBuilt(env)
    await fourth.stop()
    assert.equal(servingLine(fourth.output)?.code_cache, 'used', fourth.output)

    rmSync(cacheDir, { recursive: true })
    const off = await startBuilt({ ...env, NODE_DISABLE_COMPILE_CACHE: '1' })
    // Past the moment a start would keep its code.
    await new Promise(resolve => setTimeout(resolve, 1500))
    await off.stop()
    assert.equal(servingLine(off.output)?.code_cache, 'off', off.output)
    assert.deepEqual(kept(), [])
  })
})
