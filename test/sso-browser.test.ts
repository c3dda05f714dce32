import { strict as assert } from 'node:assert'
import { randomBytes } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, uniqueName } from './helpers.ts'
import { startTestOp, type TestOp } from './oidc-op.ts'

// The redirects through the browser are the subject here, not the database: SQLite is enough.
const dialect = dialects()[0]!

test(`OpenID Connect in Chromium: "Sign in with" on /auth/login, the provider's login page, back signed in (${dialect.name})`, { timeout: 120_000 }, async (t) => {
  if (browserSkipped(t)) return
  // The provider runs on loopback, an internal address: a provider made through the API needs the SSRF guard's opt-out there.
  const { app, adminKey } = await createTestApp(dialect, { mfaEncryptionKey: randomBytes(32), webhookAllowPrivate: true })
  let op: TestOp | undefined
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const origin = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
    op = await startTestOp([`${origin}/auth/sso/testidp/callback`])
    const created = await fetch(`${origin}/auth/api/sso/providers`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ id: 'testidp', display_name: 'Test IdP', issuer: op.issuer, client_id: op.clientId, client_secret: op.clientSecret, jit: true })
    })
    assert.equal(created.status, 201, await created.text())
    const username = uniqueName('chromium')
    op.accounts.set('alice-sub', { preferred_username: username, email: `${username}@example.com`, email_verified: true })

    browser = await launchChromium()
    const page = browser.page
    await page.goto(`${origin}/auth/login`)
    await page.getByRole('link', { name: 'Sign in with Test IdP' }).click()

    // oidc-provider's own login page (its development interactions): any login, any password.
    await page.waitForURL(url => url.origin === op!.issuer && url.pathname.startsWith('/interaction/'))
    await page.locator('input[name=login]').fill('alice-sub')
    await page.locator('input[name=password]').fill('whatever')
    await page.locator('button[type=submit]').click()

    // Back at gatehouse, through the callback, on the signed-in page.
    await page.waitForURL(`${origin}/auth/login`)
    assert.equal(await page.locator('h1').textContent(), 'Signed in')
    assert.equal(await page.locator('#username').textContent(), username)
    const verify = await browser.context.request.get(`${origin}/auth/api/verify`)
    assert.equal(verify.status(), 200)
    assert.equal(verify.headers()['x-auth-username'], username)
    const cookies = await browser.context.cookies(origin)
    assert.ok(!cookies.some(c => c.name === 'gatehouse_oidc_state' && c.value !== ''), 'the state cookie is spent')
  } finally {
    await browser?.close()
    await app.close()
    await op?.close()
  }
})
