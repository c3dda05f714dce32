import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { generate } from 'otplib'
import { buildApp } from '../src/app.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { keyFilePathOf, withEmbeddedKey } from '../src/key-ring/key-file.ts'
import { keyId, open, seal, sealedKeyId } from '../src/lib/secret-box.ts'
import { auth, crashTestsSkipped, dialects, dropSchema, GOOD_PASSWORD, uniqueName, type Dialect } from './helpers.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const ADMIN_KEY = `ghk_${randomBytes(24).toString('base64url')}`

interface Place { settings: Partial<Config>, env: Record<string, string>, cleanUp: () => Promise<void> }

/** A fresh database of the dialect that several apps and processes share, as settings and as environment variables. */
function freshPlace (dialect: Dialect): Place {
  if (dialect.url === undefined) {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-key-ring-'))
    const url = `sqlite:${join(dir, 'gatehouse.db')}`
    return { settings: { databaseUrl: url }, env: { DATABASE_URL: url }, cleanUp: async () => { rmSync(dir, { recursive: true, force: true }) } }
  }
  const schema = `gh_keyring_${randomBytes(6).toString('hex')}`
  return {
    settings: { databaseUrl: dialect.url, databaseSchema: schema },
    env: { DATABASE_URL: dialect.url, DATABASE_SCHEMA: schema },
    cleanUp: async () => { await dropSchema(dialect.url!, schema) }
  }
}

async function startApp (place: Place, ring: Buffer[], extra: Partial<Config> = {}): Promise<FastifyTypeBox> {
  const config = defaultConfig({ ...place.settings, ...extra, logLevel: 'silent', mfaKeyRing: ring, webauthnRpId: 'localhost', bootstrapAdminApiKey: ADMIN_KEY })
  const app = await buildApp({ config, logger: false })
  await bootstrap(app.db, app.passwords, config, app.log)
  await app.ready()
  return app
}

/** Runs a command of the service (src/server.ts, or the CLI) to its end, or for at most `ms`. */
async function run (args: string[], env: Record<string, string>, ms = 60_000): Promise<{ code: number | null, output: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    cwd: ROOT, env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  for (const stream of [child.stdout, child.stderr]) stream.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  const timer = setTimeout(() => child.kill('SIGKILL'), ms)
  const code = await new Promise<number | null>(resolve => child.once('exit', resolve))
  clearTimeout(timer)
  return { code, output }
}

/** The code of the time step `steps` away from now (the server accepts one step either side, and each step once). */
const code = async (secret: string, steps = 0): Promise<string> => await generate({ secret, epoch: Math.floor(Date.now() / 1000) + steps * 30 })

async function createUser (app: FastifyTypeBox): Promise<string> {
  const username = uniqueName()
  const res = await app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(ADMIN_KEY), payload: { username, password: GOOD_PASSWORD } })
  assert.equal(res.statusCode, 201, res.body)
  return username
}

/** Signs in with the password and then, when asked, the TOTP code of the next step (once an account); the session token. */
async function signIn (app: FastifyTypeBox, username: string, secret?: string): Promise<string> {
  const first = await app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
  if (first.statusCode === 200) return first.json().token
  assert.equal(first.statusCode, 202, first.body)
  assert.ok(secret !== undefined, 'a second factor was asked for')
  const second = await app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: first.json().challenge_token, totp_code: await code(secret, 1) } })
  assert.equal(second.statusCode, 200, second.body)
  return second.json().token
}

async function enrolTotp (app: FastifyTypeBox, token: string): Promise<string> {
  const headers = { authorization: `Bearer ${token}` }
  const setup = await app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers })
  assert.equal(setup.statusCode, 200, setup.body)
  const { secret } = setup.json()
  const confirmed = await app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers, payload: { code: await code(secret) } })
  assert.equal(confirmed.statusCode, 200, confirmed.body)
  return secret
}

async function totpKeyIds (app: FastifyTypeBox): Promise<string[]> {
  const rows = await app.db.selectFrom('totp_factors').select('secret').execute()
  return rows.map(row => sealedKeyId(row.secret) ?? '?').sort()
}

describe('MFA_ENCRYPTION_KEY as a list', () => {
  it('refuses a malformed list at start, naming the entry, with a non-zero exit', { timeout: 60_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-key-ring-'))
    try {
      const env = { DATABASE_URL: `sqlite:${join(dir, 'gatehouse.db')}`, HOST: '127.0.0.1', PORT: '0' }
      const good = randomBytes(32).toString('base64')
      const bad = await run(['src/server.ts'], { ...env, MFA_ENCRYPTION_KEY: `${good},not-a-key` })
      assert.equal(bad.code, 2, bad.output)
      assert.match(bad.output, /entry 2 of MFA_ENCRYPTION_KEY must be 32 bytes/)
      const empty = await run(['src/server.ts'], { ...env, MFA_ENCRYPTION_KEY: `${good},,${good}` })
      assert.equal(empty.code, 2, empty.output)
      assert.match(empty.output, /entry 2 of MFA_ENCRYPTION_KEY is empty/)
      const repeated = await run(['src/server.ts'], { ...env, MFA_ENCRYPTION_KEY: `${good}, ${good}` })
      assert.equal(repeated.code, 2, repeated.output)
      assert.match(repeated.output, /entry 2 of MFA_ENCRYPTION_KEY repeats an earlier key/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

for (const dialect of dialects()) {
  describe(`a key ring on ${dialect.name}`, () => {
    const places: Place[] = []
    after(async () => { for (const place of places.splice(0)) await place.cleanUp() })

    it('seals with the first key and opens with any listed one: TOTP under the old key still signs in after a new key is put first', { timeout: 60_000 }, async () => {
      const place = freshPlace(dialect)
      places.push(place)
      const oldKey = randomBytes(32)
      const newKey = randomBytes(32)
      let app = await startApp(place, [oldKey])
      const before = await createUser(app)
      const beforeSecret = await enrolTotp(app, await signIn(app, before))
      await app.close()

      app = await startApp(place, [newKey, oldKey])
      try {
        await signIn(app, before, beforeSecret)
        const later = await createUser(app)
        const laterSecret = await enrolTotp(app, await signIn(app, later))
        await signIn(app, later, laterSecret)
        assert.deepEqual(await totpKeyIds(app), [keyId(newKey), keyId(oldKey)].sort())
      } finally {
        await app.close()
      }
    })
  })
}

/** A command of the service left running: its output so far, and how it ended once it has. */
interface Running { child: ChildProcess, output: () => string, exited: Promise<number | null> }

function launch (args: string[], env: Record<string, string>): Running {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    cwd: ROOT, env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  for (const stream of [child.stdout!, child.stderr!]) stream.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  const exited = new Promise<number | null>(resolve => child.once('exit', resolve))
  return { child, output: () => output, exited }
}

/** The service in its own process on a free port, once it serves; SIGTERM and its end when the test is done with it. */
async function serve (env: Record<string, string>): Promise<{ base: string, output: () => string, stop: () => Promise<void> }> {
  const port = await freePort()
  const running = launch(['src/server.ts'], { HOST: '127.0.0.1', PORT: String(port), LOG_LEVEL: 'info', ...env })
  await waitFor('the service to serve', () => running.output().includes('gatehouse is serving') || running.child.exitCode !== null, 60_000)
  assert.equal(running.child.exitCode, null, running.output())
  return { base: `http://127.0.0.1:${port}/auth`, output: running.output, stop: async () => { running.child.kill('SIGTERM'); await running.exited } }
}

async function call (base: string, method: string, path: string, options: { token?: string, key?: string, body?: unknown } = {}): Promise<{ status: number, json: any, text: string }> {
  const headers: Record<string, string> = {}
  if (options.body !== undefined) headers['content-type'] = 'application/json'
  if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`
  if (options.key !== undefined) headers['x-api-key'] = options.key
  const res = await fetch(`${base}${path}`, { method, headers, ...(options.body !== undefined ? { body: JSON.stringify(options.body) } : {}) })
  const text = await res.text()
  let json: any
  try { json = JSON.parse(text) } catch { json = undefined }
  return { status: res.status, json, text }
}

/** Signs in over HTTP, with the next step's TOTP code when asked; the session token. */
async function signInOver (base: string, username: string, secret?: string): Promise<string> {
  const first = await call(base, 'POST', '/api/login', { body: { username, password: GOOD_PASSWORD } })
  if (first.status === 200) return first.json.token
  assert.equal(first.status, 202, first.text)
  assert.ok(secret !== undefined, 'a second factor was asked for')
  const second = await call(base, 'POST', '/api/login/mfa', { body: { challenge_token: first.json.challenge_token, totp_code: await code(secret, 1) } })
  assert.equal(second.status, 200, second.text)
  return second.json.token
}

interface KeyCounts { key_id: string, role: string, totp: number, oidc: number, mail: number, total: number }

async function keysStatus (env: Record<string, string>): Promise<KeyCounts[]> {
  const status = await run(['src/cli/main.ts', 'keys', 'status', '--json'], env)
  assert.equal(status.code, 0, status.output)
  return JSON.parse(status.output).keys
}

const under = (rows: KeyCounts[], key: Buffer): KeyCounts | undefined => rows.find(row => row.key_id === keyId(key))

for (const dialect of dialects()) {
  describe(`gatehouse keys re-encrypt on ${dialect.name}`, () => {
    const places: Place[] = []
    after(async () => { for (const place of places.splice(0)) await place.cleanUp() })
    const FILLER = 3000

    it('moves every sealed value under the first key, resumes after a SIGKILL, refuses a key not listed, and a start names the key id it cannot open', { timeout: 600_000, skip: crashTestsSkipped() }, async () => {
      const place = freshPlace(dialect)
      places.push(place)
      const oldKey = randomBytes(32)
      const newKey = randomBytes(32)
      // The provider's issuer is never reached: only its sealed secret matters here.
      const app = await startApp(place, [oldKey], { webhookAllowPrivate: true })
      let username: string
      let secret: string
      try {
        username = await createUser(app)
        secret = await enrolTotp(app, await signIn(app, username))
        const provider = await app.inject({ method: 'POST', url: '/auth/api/sso/providers', headers: auth(ADMIN_KEY), payload: { id: 'corp', display_name: 'Corp', issuer: 'http://127.0.0.1:9', client_id: 'gatehouse', client_secret: 'the provider secret' } })
        assert.equal(provider.statusCode, 201, provider.body)
        // Enough factors that a run of batches of 10 is stopped halfway: accounts made by the import operation, factors sealed as enrolment seals them.
        for (let start = 0; start < FILLER; start += 1000) {
          const users = Array.from({ length: 1000 }, () => ({ username: uniqueName('filler') }))
          const imported = await app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(ADMIN_KEY), payload: { users } })
          assert.equal(imported.statusCode, 200, imported.body)
          const ids: string[] = imported.json().results.map((r: { id: string }) => r.id)
          const now = new Date().toISOString()
          await app.db.insertInto('totp_factors').values(ids.map(id => ({ user_id: id, secret: seal(oldKey, 'JBSWY3DPEHPK3PXP', id), confirmed_at: now, last_time_step: null, created_at: now }))).execute()
        }
      } finally {
        await app.close()
      }
      const total = FILLER + 2
      const both = { ...place.env, MFA_ENCRYPTION_KEY: `${newKey.toString('base64')},${oldKey.toString('base64')}` }
      const newOnly = { ...place.env, MFA_ENCRYPTION_KEY: newKey.toString('base64') }

      const before = await keysStatus(both)
      assert.deepEqual(under(before, oldKey), { key_id: keyId(oldKey), role: 'listed', position: 2, totp: FILLER + 1, oidc: 1, mail: 0, total })
      assert.equal(under(before, newKey)?.total, 0)

      // The old key dropped too early: the start says so at once, and re-encrypt refuses, changing nothing.
      const service = await serve({ ...newOnly, GATEHOUSE_ADMIN_API_KEY: ADMIN_KEY })
      try {
        const warning = service.output().split('\n').find(line => line.includes(keyId(oldKey)))
        assert.ok(warning !== undefined, service.output())
        assert.equal(JSON.parse(warning).level, 50)
        assert.equal(JSON.parse(warning).count, total)
        assert.match(warning, new RegExp(`${total} sealed value\\(s\\) \\(${FILLER + 1} TOTP secrets, 1 OIDC client secret\\) are under key id ${keyId(oldKey)}, which MFA_ENCRYPTION_KEY does not list`))
      } finally {
        await service.stop()
      }
      const refused = await run(['src/cli/main.ts', 'keys', 're-encrypt'], newOnly)
      assert.equal(refused.code, 1, refused.output)
      assert.match(refused.output, new RegExp(`refusing to re-encrypt: ${total} value\\(s\\) .* are under key id ${keyId(oldKey)}, which MFA_ENCRYPTION_KEY does not list.*nothing was changed`))
      const notListed = await run(['src/cli/main.ts', 'keys', 'status'], newOnly)
      assert.match(notListed.output, new RegExp(`${keyId(oldKey)} .*NOT LISTED`))
      assert.equal(under(await keysStatus(both), oldKey)?.total, total)

      // Killed once its first batches are done, then run again: it finishes.
      const first = launch(['src/cli/main.ts', 'keys', 're-encrypt', '--batch-size', '10'], both)
      await waitFor('re-encrypt to report progress', () => /re-encrypted [1-9]\d* of/.test(first.output()) || first.child.exitCode !== null, 60_000)
      first.child.kill('SIGKILL')
      assert.equal(await first.exited, null, `killed halfway, not ended on its own: ${first.output()}`)
      const halfway = await keysStatus(both)
      assert.ok(under(halfway, newKey)!.total > 0 && under(halfway, oldKey)!.total > 0, JSON.stringify(halfway))
      assert.equal(under(halfway, newKey)!.total + under(halfway, oldKey)!.total, total)

      const second = await run(['src/cli/main.ts', 'keys', 're-encrypt', '--batch-size', '10'], both, 300_000)
      assert.equal(second.code, 0, second.output)
      assert.match(second.output, new RegExp(`Re-encrypted ${under(halfway, oldKey)!.total} value\\(s\\) under key id ${keyId(newKey)}`))
      assert.match(second.output, new RegExp(`${keyId(oldKey)} .*entry 2 .* 0 .* 0 .* 0 .* 0 `))
      const done = await keysStatus(both)
      assert.equal(under(done, newKey)?.total, total)
      assert.equal(under(done, oldKey)?.total, 0)

      // With the old key gone: the TOTP sign-in and the provider's secret open under the new one alone, and the start warns of nothing.
      const moved = await startApp(place, [newKey])
      try {
        await signIn(moved, username, secret)
        const row = await moved.db.selectFrom('oidc_providers').select('client_secret').where('id', '=', 'corp').executeTakeFirstOrThrow()
        assert.equal(open([newKey], row.client_secret!, 'oidc_provider:corp'), 'the provider secret')
      } finally {
        await moved.close()
      }
      const quiet = await serve(newOnly)
      try {
        assert.doesNotMatch(quiet.output(), /does not list/)
      } finally {
        await quiet.stop()
      }
    })
  })
}

describe('the embedded default key (SQLite, no MFA_ENCRYPTION_KEY)', () => {
  it('is generated beside the database at the first start (mode 0600), enrols an authenticator app, and is read again at the next start', { timeout: 300_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-key-file-'))
    try {
      const database = join(dir, 'data', 'gatehouse.db')
      const env = { DATABASE_URL: `sqlite:${database}`, GATEHOUSE_ADMIN_API_KEY: ADMIN_KEY }
      const file = `${database}.mfa-key`
      let service = await serve(env)
      let username: string
      let secret: string
      try {
        assert.ok(existsSync(file))
        assert.equal(statSync(file).mode & 0o777, 0o600)
        assert.match(service.output(), new RegExp(`generated a key for authenticator apps \\(MFA_ENCRYPTION_KEY\\) into ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`))
        username = uniqueName()
        assert.equal((await call(service.base, 'POST', '/api/users', { key: ADMIN_KEY, body: { username, password: GOOD_PASSWORD } })).status, 201)
        const token = await signInOver(service.base, username)
        const page = await fetch(`${service.base}/account`, { headers: { cookie: `gatehouse_session=${token}` } })
        const html = await page.text()
        assert.equal(page.status, 200)
        assert.doesNotMatch(html, /Not available here/)
        const setup = await call(service.base, 'POST', '/api/me/mfa/totp', { token })
        assert.equal(setup.status, 200, setup.text)
        secret = setup.json.secret
        const confirmed = await call(service.base, 'POST', '/api/me/mfa/totp/confirm', { token, body: { code: await code(secret) } })
        assert.equal(confirmed.status, 200, confirmed.text)
      } finally {
        await service.stop()
      }
      const written = readFileSync(file, 'utf8')
      service = await serve(env)
      try {
        assert.match(service.output(), /MFA_ENCRYPTION_KEY is the key in /)
        assert.doesNotMatch(service.output(), /generated a key/)
        await signInOver(service.base, username, secret)
      } finally {
        await service.stop()
      }
      assert.equal(readFileSync(file, 'utf8'), written, 'the same key, not a new one')
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it('is not used on PostgreSQL, on an in-memory database, or when MFA_ENCRYPTION_KEY is set', () => {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-key-file-'))
    try {
      assert.equal(keyFilePathOf('postgres://127.0.0.1/gatehouse'), undefined)
      assert.equal(keyFilePathOf('sqlite::memory:'), undefined)
      const memory = withEmbeddedKey(defaultConfig({ databaseUrl: 'sqlite::memory:' }), { generate: true })
      assert.deepEqual(memory.config.mfaKeyRing, [])
      const url = `sqlite:${join(dir, 'g.db')}`
      const generated = withEmbeddedKey(defaultConfig({ databaseUrl: url }), { generate: true })
      assert.equal(generated.generated, true)
      const own = randomBytes(32)
      const explicit = withEmbeddedKey(defaultConfig({ databaseUrl: url, mfaKeyRing: [own] }), { generate: true })
      assert.deepEqual(explicit.config.mfaKeyRing, [own])
      assert.equal(explicit.file, undefined)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
