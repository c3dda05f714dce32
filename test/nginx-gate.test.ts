import { strict as assert } from 'node:assert'
import { existsSync, readFileSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { test } from 'node:test'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'
import { NGINX, nginxConf, startNginx, stopNginx, type Nginx } from './nginx.ts'
import { freePort } from './ports.ts'

const DOC = new URL('../docs/nginx.md', import.meta.url)
const IDENTITY_HEADERS = ['X-Auth-User-Id', 'X-Auth-Username', 'X-Auth-Role', 'X-Auth-Groups', 'X-Auth-Credential']
// The gate is the subject here, not the database: SQLite is enough.
const dialect = dialects()[0]!

/** The server-level lines of docs/nginx.md's example, between its `# >>> gatehouse gate` and `# <<< gatehouse gate` markers. */
function documentedGate (): string {
  const match = /^[ \t]*# >>> gatehouse gate\n([\s\S]*?)^[ \t]*# <<< gatehouse gate$/m.exec(readFileSync(DOC, 'utf8'))
  assert.ok(match !== null, 'docs/nginx.md marks its gate configuration with lines "# >>> gatehouse gate" and "# <<< gatehouse gate"')
  return match[1]!
}

function escapeHtml (text: string): string {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`)
}

interface Hit { method: string, url: string, headers: IncomingHttpHeaders }

/** The stand-in for the web UI: a page that shows the X-Auth-* headers it was sent, and a record of every request that reached it. */
function startUpstream (hits: Hit[]): Promise<Server> {
  const server = createServer((req, res) => {
    hits.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers })
    req.resume()
    const rows = IDENTITY_HEADERS.map(name => {
      const value = req.headers[name.toLowerCase()]
      return `<dt>${name}</dt><dd id="${name.toLowerCase()}">${escapeHtml(typeof value === 'string' ? value : '')}</dd>`
    })
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
    // The data: icon keeps Chromium from asking for /favicon.ico, so every hit is one the test made.
    res.end('<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>Pipelines</title></head>' +
      `<body><h1>Pipelines</h1><dl>${rows.join('')}</dl></body></html>`)
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve(server))
  })
}

function gateConf (dir: string, port: number, gatehousePort: number, upstreamPort: number): string {
  return nginxConf(dir, `  upstream gatehouse { server 127.0.0.1:${gatehousePort}; }
  upstream webui { server 127.0.0.1:${upstreamPort}; }
  server {
    listen 127.0.0.1:${port};
    server_name localhost;
${documentedGate()}
  }`)
}

test(`nginx auth_request gate from docs/nginx.md: sign-in page, identity headers, sign-out (${dialect.name})`, { timeout: 60_000 }, async (t) => {
  if (!existsSync(NGINX)) {
    t.skip(`${NGINX} is missing; install Debian's nginx package to run this test (CI does)`)
    return
  }
  if (browserSkipped(t)) return

  const { app, adminKey } = await createTestApp(dialect, { trustProxy: true })
  const hits: Hit[] = []
  let upstream: Server | undefined
  let dir: string | undefined
  let nginx: Nginx | undefined
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const gatehousePort = (app.server.address() as AddressInfo).port
    upstream = await startUpstream(hits)
    const upstreamPort = (upstream.address() as AddressInfo).port

    dir = await mkdtemp(join(tmpdir(), 'gatehouse-nginx-'))
    const port = await freePort()
    const gate = `http://127.0.0.1:${port}`
    await writeFile(join(dir, 'nginx.conf'), gateConf(dir, port, gatehousePort, upstreamPort))
    nginx = await startNginx(dir, gate)

    const username = uniqueName('gate')
    const created = await fetch(`${gate}/auth/api/users`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD, groups: ['etl', 'ops'] })
    })
    const createdBody = await created.text()
    assert.equal(created.status, 201, createdBody)
    const user = JSON.parse(createdBody) as { id: string, username: string }

    // Without a session nothing reaches the UI: every request is sent to the sign-in page.
    const anonymous: Array<[string, Record<string, string>, string]> = [
      ['/pipelines', {}, '/auth/login?next=/pipelines'],
      ['/pipelines?tab=runs', {}, '/auth/login?next=/pipelines?tab=runs'],
      ['/pipelines', { 'x-auth-username': username, 'x-auth-user-id': user.id, 'x-auth-role': 'admin' }, '/auth/login?next=/pipelines'],
      ['/pipelines', { cookie: 'gatehouse_session=gatehouse_session_forged' }, '/auth/login?next=/pipelines'],
      ['/', {}, '/auth/login?next=/']
    ]
    for (const [path, headers, location] of anonymous) {
      const res = await fetch(`${gate}${path}`, { headers, redirect: 'manual' })
      await res.arrayBuffer()
      assert.equal(res.status, 302, `${path} ${JSON.stringify(headers)}`)
      assert.equal(res.headers.get('location'), location, `${path} ${JSON.stringify(headers)}`)
    }
    const post = await fetch(`${gate}/pipelines/run`, { method: 'POST', body: 'x=1', redirect: 'manual' })
    await post.arrayBuffer()
    assert.equal(post.status, 302, 'an unauthenticated POST is redirected too')
    const internal = await fetch(`${gate}/_gatehouse_verify`)
    await internal.arrayBuffer()
    assert.equal(internal.status, 404, 'the verify location is internal to nginx')
    assert.equal(hits.length, 0, 'no unauthenticated request reached the upstream')

    // (a) The browser asks for a UI page and lands on the sign-in page.
    browser = await launchChromium()
    const page = browser.page
    await page.goto(`${gate}/pipelines`)
    assert.equal(page.url(), `${gate}/auth/login?next=/pipelines`)
    assert.equal(await page.locator('h1').innerText(), 'Sign in')
    assert.equal(await page.locator('input[name="next"]').inputValue(), '/pipelines')
    assert.equal(hits.length, 0, 'the upstream saw nothing before sign-in')

    // (b) Signing in returns the browser to the page, which the upstream serves with the identity headers.
    await page.locator('#username').fill(username)
    await page.locator('#password').fill(GOOD_PASSWORD)
    const [signInResponse] = await Promise.all([
      page.waitForResponse(res => res.url() === `${gate}/auth/login` && res.request().method() === 'POST'),
      page.locator('button[type="submit"]').click()
    ])
    if (signInResponse.status() !== 303) {
      const sentOrigin = await signInResponse.request().headerValue('origin')
      assert.fail(`the sign-in form answered ${signInResponse.status()}, not 303 (the browser sent Origin: ${String(sentOrigin)}): ` +
        (await signInResponse.text()).slice(0, 300))
    }
    await page.waitForURL(`${gate}/pipelines`)
    await page.locator('h1', { hasText: 'Pipelines' }).waitFor()
    assert.equal(await page.locator('#x-auth-username').innerText(), username)
    assert.equal(await page.locator('#x-auth-user-id').innerText(), user.id)
    assert.equal(await page.locator('#x-auth-role').innerText(), 'user')
    assert.equal(await page.locator('#x-auth-groups').innerText(), 'etl,ops')
    assert.equal(await page.locator('#x-auth-credential').innerText(), 'session')
    assert.deepEqual(hits.map(hit => `${hit.method} ${hit.url}`), ['GET /pipelines'], 'the upstream served the page, once')
    const pageHit = hits[0]!
    assert.equal(pageHit.headers['x-auth-username'], username)
    assert.equal(pageHit.headers['x-auth-user-id'], user.id)
    const cookie = (await browser.context.cookies(gate)).find(c => c.name === 'gatehouse_session')
    assert.ok(cookie !== undefined, 'the browser holds the session cookie')
    assert.equal(cookie.httpOnly, true)
    assert.equal(cookie.path, '/')
    assert.equal(cookie.sameSite, 'Lax')

    // The identity the UI gets is gatehouse's, whatever the client sends; any method passes the gate.
    const sessionCookie = `gatehouse_session=${cookie.value}`
    const spoofed = await fetch(`${gate}/pipelines/run`, {
      method: 'POST',
      headers: { cookie: sessionCookie, 'content-type': 'application/json', 'x-auth-username': 'admin', 'x-auth-role': 'admin', 'x-auth-user-id': 'someone-else' },
      body: '{"pipeline":"nightly"}',
      redirect: 'manual'
    })
    assert.equal(spoofed.status, 200, await spoofed.text())
    const postHit = hits.at(-1)!
    assert.equal(postHit.method, 'POST')
    assert.equal(postHit.url, '/pipelines/run')
    assert.equal(postHit.headers['x-auth-username'], username)
    assert.equal(postHit.headers['x-auth-role'], 'user')
    assert.equal(postHit.headers['x-auth-user-id'], user.id)

    // gatehouse saw the client's address from nginx, not one the client made up.
    const viaFetch = await fetch(`${gate}/auth/login`, {
      method: 'POST',
      headers: { origin: gate, 'content-type': 'application/x-www-form-urlencoded', 'x-forwarded-for': '203.0.113.9' },
      body: new URLSearchParams({ username, password: GOOD_PASSWORD, next: '/pipelines' }).toString(),
      redirect: 'manual'
    })
    await viaFetch.arrayBuffer()
    assert.equal(viaFetch.status, 303)
    const events = await fetch(`${gate}/auth/api/events?type=user.login_succeeded&target_id=${user.id}`, { headers: auth(adminKey) })
    const logins = await events.json() as Array<{ client_ip: string | null }>
    assert.equal(events.status, 200, JSON.stringify(logins))
    assert.equal(logins.length, 2, 'the browser\'s sign-in and this one')
    assert.deepEqual(logins.map(e => e.client_ip), ['127.0.0.1', '127.0.0.1'])

    // (c) Signing out, with a form posted from the UI's page (same origin), ends the session.
    const hitsBeforeLogout = hits.length
    await Promise.all([
      page.waitForURL(`${gate}/auth/login`),
      page.evaluate(`(() => {
        const form = document.createElement('form')
        form.method = 'post'
        form.action = '/auth/logout'
        document.body.append(form)
        form.submit()
      })()`)
    ])
    assert.equal(await page.locator('h1').innerText(), 'Sign in')
    assert.equal((await browser.context.cookies(gate)).find(c => c.name === 'gatehouse_session'), undefined, 'the cookie is cleared')
    await page.goto(`${gate}/pipelines`)
    assert.equal(page.url(), `${gate}/auth/login?next=/pipelines`)
    assert.equal(await page.locator('h1').innerText(), 'Sign in')
    const replayed = await fetch(`${gate}/pipelines`, { headers: { cookie: sessionCookie }, redirect: 'manual' })
    await replayed.arrayBuffer()
    assert.equal(replayed.status, 302, 'the old cookie no longer opens the gate')
    assert.equal(hits.length, hitsBeforeLogout, 'nothing reached the upstream after sign-out')
  } finally {
    await browser?.close()
    if (nginx !== undefined) await stopNginx(nginx)
    if (upstream !== undefined) {
      upstream.closeAllConnections()
      await new Promise(resolve => upstream!.close(resolve))
    }
    await app.close()
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
  }
})

test(`nginx gate: a member of groups named in any script, with a comma or a line break, gets through and the UI reads the names back exactly (${dialect.name})`, { timeout: 60_000 }, async (t) => {
  if (!existsSync(NGINX)) {
    t.skip(`${NGINX} is missing; install Debian's nginx package to run this test (CI does)`)
    return
  }
  const { app, adminKey } = await createTestApp(dialect, { trustProxy: true })
  const hits: Hit[] = []
  let upstream: Server | undefined
  let dir: string | undefined
  let nginx: Nginx | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    upstream = await startUpstream(hits)
    dir = await mkdtemp(join(tmpdir(), 'gatehouse-nginx-'))
    const port = await freePort()
    const gate = `http://127.0.0.1:${port}`
    await writeFile(join(dir, 'nginx.conf'), gateConf(dir, port, (app.server.address() as AddressInfo).port, (upstream.address() as AddressInfo).port))
    nginx = await startNginx(dir, gate)

    const names = ['データ', 'Бухгалтерия', 'line\r\nbreak', 'north,south', 'Data Team', 'data-eng']
    const username = uniqueName('gate')
    const created = await fetch(`${gate}/auth/api/users`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD, groups: names })
    })
    assert.equal(created.status, 201, await created.text())
    const login = await fetch(`${gate}/auth/api/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    const { token } = await login.json() as { token: string }
    assert.equal(login.status, 200)

    const inGroups = await fetch(`${gate}/pipelines`, { headers: { authorization: `Bearer ${token}` }, redirect: 'manual' })
    await inGroups.arrayBuffer()
    assert.equal(inGroups.status, 200, 'the member is let through')
    const header = hits.at(-1)?.headers['x-auth-groups']
    assert.equal(typeof header, 'string')
    // The line docs/nginx.md gives the UI.
    assert.deepEqual(String(header ?? '').split(',').filter(Boolean).map(decodeURIComponent), names)

    // nginx sends no empty header: a user in no group reads as no groups.
    const loner = uniqueName('gate')
    await fetch(`${gate}/auth/api/users`, { method: 'POST', headers: { ...auth(adminKey), 'content-type': 'application/json' }, body: JSON.stringify({ username: loner, password: GOOD_PASSWORD }) })
    const lonerLogin = await fetch(`${gate}/auth/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: loner, password: GOOD_PASSWORD }) })
    const lonerToken = (await lonerLogin.json() as { token: string }).token
    const noGroups = await fetch(`${gate}/pipelines`, { headers: { authorization: `Bearer ${lonerToken}` }, redirect: 'manual' })
    await noGroups.arrayBuffer()
    assert.equal(noGroups.status, 200)
    const absent = hits.at(-1)?.headers['x-auth-groups']
    assert.deepEqual(String(absent ?? '').split(',').filter(Boolean).map(decodeURIComponent), [])
  } finally {
    if (nginx !== undefined) await stopNginx(nginx)
    if (upstream !== undefined) {
      upstream.closeAllConnections()
      await new Promise(resolve => upstream!.close(resolve))
    }
    await app.close()
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
  }
})
