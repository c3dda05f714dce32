import assert from 'node:assert/strict'
import type { AddressInfo } from 'node:net'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { ConfigError, loadConfig } from '../src/config.ts'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

const ORIGIN = 'http://localhost:80'

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function signInForm (t: TestApp, fields: Record<string, string>): Promise<LightMyRequestResponse> {
  return await t.app.inject({
    method: 'POST',
    url: '/auth/login',
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin: ORIGIN },
    payload: new URLSearchParams(fields).toString()
  })
}

function cookieOf (res: LightMyRequestResponse): string {
  const cookie = res.cookies.find(c => c.name === 'gatehouse_session')
  assert.ok(cookie, 'the sign-in set the session cookie')
  return `${cookie.name}=${cookie.value}`
}

/** What every page of the sign-in flow must be: self-contained HTML under the strict CSP. */
function assertStrictPage (res: LightMyRequestResponse): void {
  assert.match(res.headers['content-type'] as string, /^text\/html/)
  assert.match(res.body, /<html lang="en">/)
  assert.ok(!/\ssrc=/.test(res.body), 'no scripts, images or frames')
  assert.ok(!/<link\b|<script\b/.test(res.body), 'no external styles or scripts')
  const csp = res.headers['content-security-policy'] as string
  assert.match(csp, /default-src 'none'/)
  assert.match(csp, /form-action 'self'/)
  assert.match(csp, /frame-ancestors 'none'/)
  assert.equal(res.headers['x-frame-options'], 'DENY')
  assert.equal(res.headers['cache-control'], 'no-store')
}

for (const dialect of dialects()) {
  describe(`the sign-in page without a web UI (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('signs in without next and lands on a signed-in page naming the user and role, with a sign-out button', async () => {
      const user = await createUser(t, { role: 'admin' })
      const form = await t.app.inject({ url: '/auth/login' })
      assert.equal(form.statusCode, 200)
      assert.ok(!form.body.includes('name="next"'), 'no next was given, so the form carries none')

      const signedIn = await signInForm(t, { username: user.username, password: GOOD_PASSWORD })
      assert.equal(signedIn.statusCode, 303)
      assert.equal(signedIn.headers.location, '/auth/login', 'back to gatehouse\'s own page, not to a / that nothing serves')

      const page = await t.app.inject({ url: '/auth/login', headers: { cookie: cookieOf(signedIn) } })
      assert.equal(page.statusCode, 200)
      assertStrictPage(page)
      assert.match(page.body, /<title>Signed in<\/title>/)
      assert.match(page.body, /<h1>Signed in<\/h1>/)
      assert.match(page.body, new RegExp(`<dd id="username">${user.username}</dd>`))
      assert.match(page.body, /<dd id="role">admin<\/dd>/)
      assert.match(page.body, /<form method="post" action="\/auth\/logout">\s*<button type="submit">Sign out<\/button>\s*<\/form>/)
      assert.ok(!/<input[^>]+name="password"/.test(page.body), 'no sign-in form for a signed-in browser')
      assert.ok(!page.body.includes('>Continue</a>'), 'nowhere to continue to: no next and no web UI configured')
      assert.deepEqual([...page.body.matchAll(/href="([^"]*)"/g)].map(m => m[1]), ['/auth/account'], 'the one link is to the account page')
    })

    it('offers a same-origin next as the way on, and ignores one that leaves the origin', async () => {
      const user = await createUser(t)
      const cookie = cookieOf(await signInForm(t, { username: user.username, password: GOOD_PASSWORD }))
      const onward = await t.app.inject({ url: '/auth/login?next=/pipelines%3Ftab%3Druns%26a%3D%3Cb%3E', headers: { cookie } })
      assert.equal(onward.statusCode, 200)
      assert.match(onward.body, /<dd id="role">user<\/dd>/)
      // `<` and `>` are percent-encoded like any character a URL does not carry as it is; `&` is escaped for HTML.
      assert.match(onward.body, /<a href="\/pipelines\?tab=runs&#38;a=%3Cb%3E">Continue<\/a>/)
      for (const next of ['//evil.example/', 'https://evil.example/', 'javascript:alert(1)']) {
        const res = await t.app.inject({ url: `/auth/login?next=${encodeURIComponent(next)}`, headers: { cookie } })
        assert.equal(res.statusCode, 200)
        assert.deepEqual([...res.body.matchAll(/href="([^"]*)"/g)].map(m => m[1]), ['/auth/account'], next)
      }
    })

    it('shows the sign-in form again once the session has ended', async () => {
      const user = await createUser(t)
      const cookie = cookieOf(await signInForm(t, { username: user.username, password: GOOD_PASSWORD }))
      const out = await t.app.inject({ method: 'POST', url: '/auth/logout', headers: { cookie, origin: ORIGIN } })
      assert.equal(out.statusCode, 303)
      assert.equal(out.headers.location, '/auth/login')
      const page = await t.app.inject({ url: '/auth/login', headers: { cookie } })
      assert.equal(page.statusCode, 200)
      assert.match(page.body, /<h1>Sign in<\/h1>/)
      assert.ok(!page.body.includes(user.username))
      const forged = await t.app.inject({ url: '/auth/login', headers: { cookie: 'gatehouse_session=gatehouse_session_forged' } })
      assert.match(forged.body, /<h1>Sign in<\/h1>/)
    })

    it('percent-encodes a next holding characters beyond Latin-1, keeps it on this origin, and signs the user in', async () => {
      const user = await createUser(t)
      for (const [next, location] of [
        ['/\u3002evil.example', '/%E3%80%82evil.example'],
        ['/\u202E', '/%E2%80%AE'],
        ['/reports?owner=Zoë&q=a b', '/reports?owner=Zo%C3%AB&q=a%20b'],
        // Already encoded (the form carries next back in a hidden field): kept as it is.
        ['/%E3%80%82evil.example', '/%E3%80%82evil.example']
      ] as const) {
        const res = await signInForm(t, { username: user.username, password: GOOD_PASSWORD, next })
        assert.equal(res.statusCode, 303, `${next}: ${res.body}`)
        assert.equal(res.headers.location, location, next)
        assert.equal(new URL(location, ORIGIN).origin, new URL(ORIGIN).origin, next)
        const page = await t.app.inject({ url: '/auth/login', headers: { cookie: cookieOf(res) } })
        assert.ok(page.body.includes(user.username), `${next}: the session works`)
      }
    })

    it('falls back to the signed-in page, never to another origin, for an unusable next', async () => {
      const user = await createUser(t)
      for (const next of ['', 'https://evil.example/', '//evil.example/', '/\\evil.example', 'pipelines']) {
        const res = await signInForm(t, { username: user.username, password: GOOD_PASSWORD, next })
        assert.equal(res.statusCode, 303, next)
        assert.equal(res.headers.location, '/auth/login', next)
      }
    })
  })

  describe(`the sign-in page in front of a web UI (LOGIN_DEFAULT_NEXT, ${dialect.name})`, () => {
    const t = useTestApp(dialect, { loginDefaultNext: '/pipelines' })

    it('sends the browser to the configured page when no usable next is given, and offers it on the signed-in page', async () => {
      const user = await createUser(t)
      for (const next of [undefined, '//evil.example/']) {
        const res = await signInForm(t, { username: user.username, password: GOOD_PASSWORD, ...(next !== undefined ? { next } : {}) })
        assert.equal(res.statusCode, 303)
        assert.equal(res.headers.location, '/pipelines', String(next))
      }
      const given = await signInForm(t, { username: user.username, password: GOOD_PASSWORD, next: '/reports' })
      assert.equal(given.headers.location, '/reports', 'a usable next wins')
      const page = await t.app.inject({ url: '/auth/login', headers: { cookie: cookieOf(given) } })
      assert.match(page.body, /<a href="\/pipelines">Continue<\/a>/)
    })
  })
}

describe('LOGIN_DEFAULT_NEXT', () => {
  it('takes a same-origin path and refuses anything that could leave the origin', () => {
    assert.equal(loadConfig({ LOGIN_DEFAULT_NEXT: '/ui/?tab=1' }).loginDefaultNext, '/ui/?tab=1')
    assert.equal(loadConfig({}).loginDefaultNext, undefined)
    for (const value of ['https://ui.example.com/', '//ui.example.com', 'ui', '/\\ui']) {
      assert.throws(() => loadConfig({ LOGIN_DEFAULT_NEXT: value }), ConfigError, value)
    }
  })
})

describe('the signed-in page in a real browser', () => {
  it('signs in, shows who is signed in under its CSP, and signs out with the button', { timeout: 60_000 }, async (t) => {
    if (browserSkipped(t)) return
    const app = await createTestApp(dialects()[0]!)
    let browser: Browser | undefined
    try {
      const user = await createUser(app)
      await app.app.listen({ host: '127.0.0.1', port: 0 })
      const origin = `http://127.0.0.1:${(app.app.server.address() as AddressInfo).port}`
      browser = await launchChromium()
      const page = browser.page
      const problems: string[] = []
      page.on('console', message => { if (message.type() === 'error') problems.push(message.text()) })
      page.on('pageerror', error => { problems.push(error.message) })

      await page.goto(`${origin}/auth/login`)
      await page.getByLabel('Username or email').fill(user.username)
      await page.getByLabel('Password').fill(GOOD_PASSWORD)
      await page.getByRole('button', { name: 'Sign in' }).click()
      await page.getByRole('heading', { name: 'Signed in' }).waitFor()
      assert.equal(page.url(), `${origin}/auth/login`)
      assert.equal(await page.locator('#username').innerText(), user.username)
      assert.equal(await page.locator('#role').innerText(), 'user')
      // The inline style applies (its hash is in the CSP): the button is styled, not the browser's default.
      assert.equal(await page.evaluate('getComputedStyle(document.querySelector("button")).backgroundColor'), 'rgb(31, 95, 207)')

      await page.getByRole('button', { name: 'Sign out' }).click()
      await page.getByRole('heading', { name: 'Sign in' }).waitFor()
      assert.equal(page.url(), `${origin}/auth/login`)
      assert.equal((await browser.context.cookies(origin)).find(c => c.name === 'gatehouse_session'), undefined, 'the cookie is cleared')
      assert.deepEqual(problems, [], 'no CSP violations or script errors')
    } finally {
      await browser?.close()
      await app.app.close()
    }
  })
})
