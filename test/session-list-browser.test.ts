import { strict as assert } from 'node:assert'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'

// The page, its CSP and the browser's form posts are the subject here, not the database: SQLite is enough.
const dialect = dialects()[0]!
const SAFARI_IPHONE = 'Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1'

test(`account page in Chromium: "Where you're signed in" lists this browser and a phone, and End signs the phone out (${dialect.name})`, { timeout: 120_000 }, async (t) => {
  if (browserSkipped(t)) return
  const { app, adminKey } = await createTestApp(dialect)
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as AddressInfo
    const origin = `http://localhost:${port}`
    const username = uniqueName('devices')
    const created = await fetch(`${origin}/auth/api/users`, {
      method: 'POST', headers: { ...auth(adminKey), 'content-type': 'application/json' }, body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    assert.equal(created.status, 201, await created.text())
    const phone = await fetch(`${origin}/auth/api/login`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'user-agent': SAFARI_IPHONE }, body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    assert.equal(phone.status, 200)
    const phoneToken = (await phone.json() as { token: string }).token
    const phoneStatus = async (): Promise<number> => (await fetch(`${origin}/auth/api/me`, { headers: { authorization: `Bearer ${phoneToken}` } })).status
    assert.equal(await phoneStatus(), 200)

    browser = await launchChromium()
    const page = browser.page
    await page.goto(`${origin}/auth/login?next=${encodeURIComponent('/auth/account')}`)
    await page.locator('#username').fill(username)
    await page.locator('#password').fill(GOOD_PASSWORD)
    await page.locator('button[type=submit]').click()
    await page.waitForURL(`${origin}/auth/account`)

    const items = page.locator('#sessions li')
    assert.equal(await items.count(), 2)
    assert.match(await items.nth(0).innerText(), /\(this browser\)/)
    assert.match(await items.nth(0).innerText(), /Chrome/)
    assert.match(await items.nth(1).innerText(), /Mobile Safari 17 on iOS/)
    await items.nth(1).getByRole('button', { name: 'End the session on Mobile Safari 17 on iOS' }).click()
    await page.waitForURL(`${origin}/auth/account?sessions_ended=1`)
    assert.equal(await page.locator('#notice').innerText(), 'One session ended.')
    assert.equal(await page.locator('#sessions li').count(), 1)
    assert.equal(await phoneStatus(), 401)
    // This browser is still signed in.
    assert.equal((await browser.context.request.get(`${origin}/auth/api/me`)).status(), 200)
  } finally {
    await browser?.close()
    await app.close()
  }
})
