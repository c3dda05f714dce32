import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { generate } from 'otplib'
import { buildApp } from '../src/app.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { keyId, sealedKeyId } from '../src/lib/secret-box.ts'
import { auth, dialects, dropSchema, GOOD_PASSWORD, uniqueName, type Dialect } from './helpers.ts'

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

async function startApp (place: Place, ring: Buffer[]): Promise<FastifyTypeBox> {
  const config = defaultConfig({ ...place.settings, logLevel: 'silent', mfaKeyRing: ring, webauthnRpId: 'localhost', bootstrapAdminApiKey: ADMIN_KEY })
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
