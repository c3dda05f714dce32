import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createServer } from 'node:net'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, it } from 'node:test'
import { auth, createTestApp, dialects, GOOD_PASSWORD, useTestApp, type TestApp } from './helpers.ts'
import { freePort } from './ports.ts'
import { bootstrap } from '../src/bootstrap.ts'

for (const dialect of dialects()) {
  describe(`first start (${dialect.name})`, () => {
    it('issues one admin key on an empty database, stores only its digest, and never again', async () => {
      const t = await createTestApp(dialect)
      try {
        assert.match(t.adminKey, /^gatehouse_/)
        const again = await bootstrap(t.app.db, t.app.passwords, t.config, t.app.log)
        assert.equal(again.generatedKey, undefined)
        const rows = await t.app.db.selectFrom('api_keys').selectAll().execute()
        assert.equal(rows.length, 1)
        assert.ok(!JSON.stringify(rows).includes(t.adminKey))
        assert.equal((await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).statusCode, 200)
      } finally {
        await t.app.close()
      }
    })

    it('registers GATEHOUSE_ADMIN_API_KEY and creates the GATEHOUSE_ADMIN_USERNAME admin without printing a key', async () => {
      const key = 'k'.repeat(48)
      const t = await createTestApp(dialect, { bootstrapAdminApiKey: key, bootstrapAdminUsername: 'root.admin', bootstrapAdminPassword: GOOD_PASSWORD })
      try {
        assert.equal(t.adminKey, key, 'no key was generated')
        const users = (await t.app.inject({ url: '/auth/api/users', headers: auth(key) })).json()
        assert.equal(users.length, 1)
        assert.equal(users[0].username, 'root.admin')
        assert.equal(users[0].role, 'admin')
        // Idempotent across restarts.
        await bootstrap(t.app.db, t.app.passwords, t.config, t.app.log)
        assert.equal((await t.app.db.selectFrom('api_keys').selectAll().execute()).length, 1)
      } finally {
        await t.app.close()
      }
    })

    it('refuses a configured key shorter than 32 characters', async () => {
      await assert.rejects(createTestApp(dialect, { bootstrapAdminApiKey: 'short' }), /at least 32/)
    })

    it('refuses a configured admin username the API would refuse, since the document promises every username has that form', async () => {
      await assert.rejects(createTestApp(dialect, { bootstrapAdminUsername: 'ada lovelace', bootstrapAdminPassword: GOOD_PASSWORD }), /GATEHOUSE_ADMIN_USERNAME must be/)
    })
  })

  describe(`the way into the console on a fresh deployment (${dialect.name})`, () => {
    const ORIGIN = 'http://localhost:80'
    const FORM = 'application/x-www-form-urlencoded'
    const setup = async (t: TestApp, fields: Record<string, string>, headers: Record<string, string> = { origin: ORIGIN }) =>
      await t.app.inject({ method: 'POST', url: '/auth/admin/setup', headers: { 'content-type': FORM, ...headers }, payload: new URLSearchParams(fields).toString() })

    it('turns the printed admin key into the first admin user, signed in to the console, once', async () => {
      const t = await createTestApp(dialect)
      try {
        const form = await t.app.inject({ url: '/auth/admin/setup' })
        assert.equal(form.statusCode, 200)
        assert.match(form.body, /name="api_key"/)
        assert.match(form.headers['content-security-policy'] as string, /default-src 'none'/)

        // Not from our own page: refused before anything else.
        assert.equal((await setup(t, { api_key: t.adminKey, username: 'first.admin', password: GOOD_PASSWORD }, { origin: 'https://evil.example' })).statusCode, 403)
        const wrongKey = await setup(t, { api_key: 'gatehouse_not-a-key', username: 'first.admin', password: GOOD_PASSWORD })
        assert.equal(wrongKey.statusCode, 401)
        assert.match(wrongKey.body, /not an admin API key/)
        assert.ok(!wrongKey.body.includes(GOOD_PASSWORD))
        const weak = await setup(t, { api_key: t.adminKey, username: 'first.admin', password: 'short' })
        assert.equal(weak.statusCode, 422)
        assert.ok(!weak.body.includes(t.adminKey), 'the key is never shown back')
        assert.equal((await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).json().length, 0)

        const done = await setup(t, { api_key: t.adminKey, username: 'first.admin', password: GOOD_PASSWORD })
        assert.equal(done.statusCode, 303, done.body)
        assert.equal(done.headers.location, '/auth/admin')
        const cookie = done.cookies.map(c => `${c.name}=${c.value}`).join('; ')
        const console = await t.app.inject({ url: '/auth/admin/users', headers: { cookie } })
        assert.equal(console.statusCode, 200)
        assert.match(console.body, /first\.admin/)
        const [user] = (await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).json()
        assert.equal(user.role, 'admin')
        const keyId = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json()[0].id
        const created = (await t.app.inject({ url: '/auth/api/events?type=user.created', headers: auth(t.adminKey) })).json()
        assert.deepEqual(created.map((e: { actor: { type: string, id: string } }) => [e.actor.type, e.actor.id]), [['api_key', keyId]])

        // Set up: the page says to sign in, and the key opens nothing more.
        const after = await t.app.inject({ url: '/auth/admin/setup' })
        assert.equal(after.statusCode, 200)
        assert.ok(!after.body.includes('name="api_key"'))
        assert.match(after.body, /Sign in to the admin console/)
        assert.equal((await setup(t, { api_key: t.adminKey, username: 'second.admin', password: GOOD_PASSWORD })).statusCode, 409)
        assert.equal((await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).json().length, 1)
      } finally {
        await t.app.close()
      }
    })

    it('counts wrong keys against the address like failed sign-ins', async () => {
      const t = await createTestApp(dialect, { loginMaxFailuresPerAddress: 2 })
      try {
        for (let i = 0; i < 2; i++) assert.equal((await setup(t, { api_key: `gatehouse_wrong${i}`, username: 'first.admin', password: GOOD_PASSWORD })).statusCode, 401)
        const refused = await setup(t, { api_key: t.adminKey, username: 'first.admin', password: GOOD_PASSWORD })
        assert.equal(refused.statusCode, 429)
        assert.ok(refused.headers['retry-after'])
      } finally {
        await t.app.close()
      }
    })

    it('answers /auth and /auth/ with a page naming the docs, the console and the sign-in page, and JSON links for other clients', async () => {
      const t = await createTestApp(dialect)
      try {
        for (const url of ['/auth', '/auth/']) {
          const page = await t.app.inject({ url, headers: { accept: 'text/html,application/xhtml+xml,*/*;q=0.8' } })
          assert.equal(page.statusCode, 200, url)
          assert.match(page.headers['content-type'] as string, /^text\/html/)
          assert.match(page.headers['content-security-policy'] as string, /default-src 'none'/)
          for (const link of ['/auth/docs', '/auth/admin', '/auth/login']) assert.match(page.body, new RegExp(`href="${link}"`), link)
          const json = await t.app.inject({ url })
          assert.equal(json.statusCode, 200)
          assert.deepEqual(json.json().links, { docs: '/auth/docs', openapi: '/auth/openapi.json', console: '/auth/admin', login: '/auth/login' })
        }
      } finally {
        await t.app.close()
      }
    })
  })

  describe(`OpenAPI document and docs page (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('serves OpenAPI 3.1 with named schemas, the seed operation ids under default, and deprecated legacy operations', async () => {
      const res = await t.app.inject({ url: '/auth/openapi.json' })
      assert.equal(res.statusCode, 200)
      const doc = res.json()
      assert.equal(doc.openapi, '3.1.0')
      assert.equal(doc.info.version, (await t.app.inject({ url: '/auth/api/version' })).json().version)
      for (const name of ['User', 'UserCreate', 'UserPatch', 'Problem', 'ApiKey', 'ApiKeyCreate', 'ApiKeyWithSecret', 'Event']) {
        assert.ok(doc.components.schemas[name], `components.schemas.${name}`)
      }
      assert.ok(!Object.keys(doc.components.schemas).some(k => k.startsWith('def-')), 'no anonymous def-N schemas')
      const ops = new Map<string, { method: string, path: string, op: Record<string, any> }>()
      for (const [path, item] of Object.entries<Record<string, any>>(doc.paths)) {
        for (const [method, op] of Object.entries<Record<string, any>>(item)) ops.set(op.operationId, { method, path, op })
      }
      const expectOp = (id: string, method: string, path: string) => {
        const found = ops.get(id)
        assert.ok(found, id)
        assert.equal(found.method, method)
        assert.equal(found.path, path)
        return found.op
      }
      for (const op of [
        expectOp('create_user_users_post', 'post', '/auth/api/users'),
        expectOp('list_users_users_get', 'get', '/auth/api/users'),
        expectOp('delete_user_users__user_id__delete', 'delete', '/auth/api/users/{user_id}'),
        expectOp('get_user_users__user_id__get', 'get', '/auth/api/users/{user_id}'),
        expectOp('update_user_users__user_id__patch', 'patch', '/auth/api/users/{user_id}')
      ]) {
        assert.deepEqual(op.tags, ['default'])
        assert.notEqual(op.deprecated, true)
      }
      const legacy = expectOp('legacy_create_user_users_post', 'post', '/auth/users')
      assert.equal(legacy.deprecated, true)
      assert.deepEqual(legacy.tags, ['legacy'])
      assert.deepEqual(Object.keys(ops.get('create_user_users_post')!.op.requestBody.content).sort(),
        ['application/json', 'application/x-www-form-urlencoded', 'multipart/form-data'])
      // Every operation that takes a credential documents 401, and every documented error is a Problem.
      for (const { path, op } of ops.values()) {
        if (!path.includes('/api/')) continue
        // Public operations say so with an empty requirement (`security: [{}]`).
        const needsCredential = op.security !== undefined && !op.security.some((requirement: object) => Object.keys(requirement).length === 0)
        if (needsCredential) assert.ok(op.responses['401'], `${op.operationId} documents 401`)
        for (const [status, response] of Object.entries<Record<string, any>>(op.responses)) {
          if (Number(status) < 400) continue
          assert.equal(response.content['application/problem+json'].schema.$ref, '#/components/schemas/Problem', `${op.operationId} ${status}`)
        }
      }
      assert.deepEqual(Object.keys(doc.components.securitySchemes).sort(), ['ApiKeyHeader', 'ApiKeyQuery', 'Bearer', 'ScimBearer'])
    })

    it('serves Swagger UI at /auth/docs from local files', async () => {
      const res = await t.app.inject({ url: '/auth/docs' })
      const page = res.statusCode === 302 ? await t.app.inject({ url: res.headers.location as string }) : res
      assert.equal(page.statusCode, 200)
      assert.match(page.body, /swagger-ui/)
      assert.ok(!/https?:\/\/(?!127\.0\.0\.1|localhost)[a-z]/i.test(page.body.replace(/https?:\/\/(www\.)?w3\.org[^"']*/g, '')), 'no external asset URL')
      const bundle = await t.app.inject({ url: '/auth/docs/static/swagger-ui-bundle.js' })
      assert.equal(bundle.statusCode, 200)
    })

    it('lets no page frame the docs, not even one of its own origin', async () => {
      for (const url of ['/auth/docs', '/auth/docs/', '/auth/docs/static/index.html']) {
        const res = await t.app.inject({ url })
        const csp = String(res.headers['content-security-policy'])
        assert.match(csp, /frame-ancestors 'none'/, url)
        assert.doesNotMatch(csp, /frame-ancestors[^;]*'self'/, url)
        assert.equal(res.headers['x-frame-options'], 'DENY', url)
      }
    })

    it('exposes Prometheus metrics labelled by route pattern, not by concrete URL', async () => {
      await t.app.inject({ url: '/auth/api/users/01900000-0000-7000-8000-000000000000', headers: auth(t.adminKey) })
      const res = await t.app.inject({ url: '/auth/metrics' })
      assert.equal(res.statusCode, 200)
      assert.match(res.headers['content-type'] as string, /^text\/plain/)
      assert.match(res.body, /gatehouse_http_requests_total\{method="GET",route="\/auth\/api\/users\/:user_id",status="404"\} 1/)
      assert.match(res.body, /gatehouse_password_hash_queue 0/)
      assert.ok(!res.body.includes('01900000-0000-7000-8000-000000000000'))
    })

    it('states the release at /auth/api/version', async () => {
      const res = await t.app.inject({ url: '/auth/api/version' })
      assert.equal(res.statusCode, 200)
      assert.equal(res.json().name, 'gatehouse')
      assert.equal(res.json().database, dialect.name)
      assert.equal((await t.app.inject({ url: '/auth/readyz' })).json().status, 'ready')
    })
  })
}

describe('the README start command', () => {
  it('starts on the embedded default, migrates, prints the one-time key with the docs hint, and serves', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-start-'))
    const port = String(20000 + Math.floor(Math.random() * 20000))
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: process.cwd(),
      env: { ...process.env, PORT: port, DATABASE_URL: `sqlite:${join(dir, 'data', 'gatehouse.db')}`, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    try {
      let out = ''
      child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
      child.stderr.on('data', (chunk: Buffer) => { out += chunk.toString() })
      const deadline = Date.now() + 30_000
      while (!out.includes('click Authorize') && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 100))
      const key = /Admin API key \(shown once, store it now\): (gatehouse_\w+)/.exec(out)?.[1]
      assert.ok(key, out)
      assert.match(out, new RegExp(`Open http://127\\.0\\.0\\.1:${port}/auth/docs, click Authorize, paste this key\\.`))
      assert.match(out, new RegExp(`open http://127\\.0\\.0\\.1:${port}/auth/admin/setup, paste this key`))
      const res = await fetch(`http://127.0.0.1:${port}/auth/api/users`, { headers: { 'x-api-key': key } })
      assert.equal(res.status, 200)
      assert.deepEqual(await res.json(), [])
    } finally {
      child.kill('SIGTERM')
      await new Promise(resolve => child.once('exit', resolve))
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('a first start that cannot listen', () => {
  it('prints no key when the port is busy, and the next start issues one that works', { timeout: 60_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-busy-'))
    const port = await freePort()
    const occupier = createServer()
    occupier.listen(port, '127.0.0.1')
    await once(occupier, 'listening')
    const start = (): { output: () => string, child: ReturnType<typeof spawn> } => {
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
        cwd: process.cwd(),
        env: { ...process.env, HOST: '127.0.0.1', PORT: String(port), DATABASE_URL: `sqlite:${join(dir, 'gatehouse.db')}`, LOG_LEVEL: 'warn' },
        stdio: ['ignore', 'pipe', 'pipe']
      })
      let out = ''
      child.stdout!.on('data', (chunk: Buffer) => { out += chunk.toString() })
      child.stderr!.on('data', (chunk: Buffer) => { out += chunk.toString() })
      return { output: () => out, child }
    }
    let second: ReturnType<typeof start> | undefined
    try {
      const first = start()
      const [code] = await once(first.child, 'exit') as [number]
      assert.equal(code, 1, first.output())
      assert.equal(first.output().trim(), `gatehouse: port ${port} on 127.0.0.1 is in use; set PORT to a free port, or stop the process that holds it`)

      occupier.close()
      await once(occupier, 'close')
      second = start()
      const deadline = Date.now() + 30_000
      while (!second.output().includes('click Authorize') && Date.now() < deadline && second.child.exitCode === null) await new Promise(resolve => setTimeout(resolve, 100))
      const key = /Admin API key \(shown once, store it now\): (gatehouse_\w+)/.exec(second.output())?.[1]
      assert.ok(key, second.output())
      const res = await fetch(`http://127.0.0.1:${port}/auth/api/users`, { headers: { authorization: `Bearer ${key}` } })
      assert.equal(res.status, 200)
    } finally {
      occupier.close()
      if (second !== undefined && second.child.exitCode === null) {
        second.child.kill('SIGTERM')
        await once(second.child, 'exit')
      }
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
