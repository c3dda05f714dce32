import assert from 'node:assert/strict'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { cpSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { dialects, dropSchema, GOOD_PASSWORD } from './helpers.ts'
import { freePort } from './ports.ts'
import { TEST_REDIS_URL } from './redis.ts'
import { SmtpTestServer } from './smtp-server.ts'

const root = fileURLToPath(new URL('..', import.meta.url))
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }

/**
 * `npm start` runs the bundle in dist/, not the sources the other tests load
 * through tsx: what the bundler leaves out or moves (assets read next to a
 * module, package.json, packages that find their files through __dirname,
 * lazily loaded chunks) only shows in that build, so it is built and started
 * here as `npm install && npm start` would.
 */
describe('the built service (npm run build, then node dist/server.js)', () => {
  let tmp: string
  let smtp: SmtpTestServer
  before(async () => {
    smtp = await SmtpTestServer.start()
    tmp = mkdtempSync(join(tmpdir(), 'gatehouse-build-'))
    const build = spawnSync(process.execPath, [join(root, 'scripts/build.js')], { cwd: root, encoding: 'utf8' })
    assert.equal(build.status, 0, build.stderr)
  })
  after(async () => {
    rmSync(tmp, { recursive: true, force: true })
    await smtp.close()
  })

  for (const dialect of dialects()) {
    // With PostgreSQL, Redis too when there is one (CI has): ioredis and the rate limiter's Redis store are loaded from outside the bundle.
    it(`starts from dist/ on ${dialect.name} and serves the API, the docs, the pages' assets and the lazily loaded second factors, and sends mail`, { timeout: 60_000 }, async () => {
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
        MFA_ENCRYPTION_KEY: randomBytes(32).toString('base64'),
        SMTP_URL: smtp.url,
        NODE_EXTRA_CA_CERTS: smtp.writeCertificate(join(tmp, 'smtp.pem')),
        MAIL_FROM: 'gatehouse@example.test',
        PUBLIC_URL: 'https://pipelines.example.test/auth'
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
            // This service sends mail (below), so /readyz also reports the SMTP server, which does not decide readiness.
            assert.deepEqual(Object.keys((await ready.json() as { checks: object }).checks), redis ? ['database', 'redis', 'mail'] : ['database', 'mail'])
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
        // Mail: nodemailer is loaded from outside the bundle, the templates from dist/assets/.
        const me = await (await fetch(`${base}/api/me`, { headers: { authorization: `Bearer ${token}` } })).json() as { id: string }
        const address = `built-${dialect.name}@example.test`
        const email = await fetch(`${base}/api/users/${me.id}`, { method: 'PATCH', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/merge-patch+json' }, body: JSON.stringify({ email: address }) })
        assert.equal(email.status, 200, await email.clone().text())
        const password = await fetch(`${base}/api/me/password`, { method: 'PUT', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: JSON.stringify({ current_password: GOOD_PASSWORD, new_password: `${GOOD_PASSWORD} 2` }) })
        assert.equal(password.status, 204, await password.clone().text())
        const mail = await smtp.waitForMail(address)
        assert.equal(mail.subject, 'gatehouse: your password was changed')
        assert.equal(mail.secure, true)
      } finally {
        child.kill('SIGTERM')
        if (child.exitCode === null) await once(child, 'exit')
        if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
      }
    })
  }

  it('writes the bundles as CommonJS in strict mode, as the ES modules they are made of', () => {
    assert.deepEqual(JSON.parse(readFileSync(join(root, 'dist/package.json'), 'utf8')), { type: 'commonjs' })
    for (const file of ['dist/server.js', 'dist/cli/main.js']) {
      assert.match(readFileSync(join(root, file), 'utf8').slice(0, 100), /^'use strict';/, file)
    }
  })
})

/**
 * pnpm and monorepos give a project a node_modules that is a symbolic link
 * (or holds links): esbuild then names the bundled modules by their real
 * paths, and a build that matched them by the linked path gave Swagger UI the
 * bundle's directory as its own (ENOENT dist/static/logo.svg at start).
 */
describe('the build where node_modules is a symbolic link (pnpm, monorepos)', () => {
  let copy: string
  before(() => {
    copy = mkdtempSync(join(tmpdir(), 'gatehouse-linked-'))
    for (const part of ['package.json', 'tsconfig.json', 'scripts', 'src']) cpSync(join(root, part), join(copy, part), { recursive: true })
    symlinkSync(join(root, 'node_modules'), join(copy, 'node_modules'), 'dir')
  })
  after(() => { rmSync(copy, { recursive: true, force: true }) })

  it('builds a service that starts and serves Swagger UI with its own files', { timeout: 60_000 }, async () => {
    const build = spawnSync(process.execPath, [join(copy, 'scripts/build.js')], { cwd: copy, encoding: 'utf8' })
    assert.equal(build.status, 0, build.stderr)
    const port = await freePort()
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, HOST: '127.0.0.1', PORT: String(port), DATABASE_URL: `sqlite:${join(copy, 'linked.db')}` }
    const child = spawn(process.execPath, [join(copy, 'dist/server.js')], { cwd: copy, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.setEncoding('utf8').on('data', (d: string) => { output += d })
    child.stderr.setEncoding('utf8').on('data', (d: string) => { output += d })
    const base = `http://127.0.0.1:${port}/auth`
    try {
      const deadline = Date.now() + 30_000
      for (;;) {
        assert.equal(child.exitCode, null, `the linked copy's dist/server.js exited: ${output}`)
        if ((await fetch(`${base}/healthz`).catch(() => undefined))?.status === 200) break
        assert.ok(Date.now() < deadline, `not serving in 30 s: ${output}`)
        await new Promise(resolve => setTimeout(resolve, 50))
      }
      const docs = await fetch(`${base}/docs/`)
      assert.equal(docs.status, 200)
      assert.match(await docs.text(), /swagger-ui/i)
      const swaggerUi = join(root, 'node_modules/@fastify/swagger-ui/static')
      for (const file of ['logo.svg', 'swagger-ui.css']) {
        const asset = await fetch(`${base}/docs/static/${file}`)
        assert.equal(asset.status, 200, file)
        assert.ok(Buffer.from(await asset.arrayBuffer()).equals(readFileSync(join(swaggerUi, file))), file)
      }
    } finally {
      child.kill('SIGTERM')
      if (child.exitCode === null) await once(child, 'exit')
    }
  })
})
