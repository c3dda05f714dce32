import { strict as assert } from 'node:assert'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'

// The page and the browser's form posts are the subject here; the change itself is the API's (sessions.test.ts), so SQLite is enough.
const dialect = dialects()[0]!
const NEW_PASSWORD = 'a fresh passphrase from the browser'

test(`account page in Chromium: the page after sign-in links the account page, whose form changes the password as the API does (${dialect.name})`, { timeout: 120_000 }, async (t) => {
  if (browserSkipped(t)) return
  const { app, adminKey } = await createTestApp(dialect)
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as AddressInfo
    const origin = `http://localhost:${port}`
    const username = uniqueName('changer')
    const created = await fetch(`${origin}/auth/api/users`, {
      method: 'POST', headers: { ...auth(adminKey), 'content-type': 'application/json' }, body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    const body = await created.text()
    assert.equal(created.status, 201, body)
    const userId = (JSON.parse(body) as { id: string }).id
    const signIn = async (password: string): Promise<Response> => await fetch(`${origin}/auth/api/login`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username, password })
    })
    const other = await signIn(GOOD_PASSWORD)
    assert.equal(other.status, 200)
    const otherToken = (await other.json() as { token: string }).token
    const otherStatus = async (): Promise<number> => (await fetch(`${origin}/auth/api/me`, { headers: { authorization: `Bearer ${otherToken}` } })).status

    browser = await launchChromium()
    const page = browser.page
    await page.goto(`${origin}/auth/login`)
    await page.locator('#username').fill(username)
    await page.locator('#password').fill(GOOD_PASSWORD)
    await page.locator('button[type=submit]').click()
    await page.waitForURL(`${origin}/auth/login`)
    await page.getByRole('link', { name: 'Your account' }).click()
    await page.waitForURL(`${origin}/auth/account`)

    const changeWith = async (current: string, next: string, again = next): Promise<void> => {
      await page.getByLabel('Current password').fill(current)
      await page.getByLabel('New password', { exact: true }).fill(next)
      await page.getByLabel('The new password again').fill(again)
      await page.getByRole('button', { name: 'Change password' }).click()
      await page.waitForLoadState()
    }
    await changeWith(GOOD_PASSWORD, NEW_PASSWORD, `${NEW_PASSWORD}!`)
    assert.match(await page.locator('.error').innerText(), /The two new passwords differ/)
    await changeWith('not the password at all', NEW_PASSWORD)
    assert.match(await page.locator('.error').innerText(), /The current password is not right/)
    await changeWith(GOOD_PASSWORD, 'short')
    assert.equal(await page.locator('.error').count(), 1)
    assert.equal((await signIn(GOOD_PASSWORD)).status, 200, 'refused changes left the password as it was')

    await changeWith(GOOD_PASSWORD, NEW_PASSWORD)
    await page.waitForURL(`${origin}/auth/account?password_changed=1`)
    assert.match(await page.locator('#notice').innerText(), /Your password is changed\. Your other sessions have ended/)
    assert.match(await page.locator('#password-state').innerText(), /^Last changed /)
    // As PUT /api/me/password: the other session ended, this one goes on, the old password is refused, the event is recorded.
    assert.equal(await otherStatus(), 401)
    assert.equal((await browser.context.request.get(`${origin}/auth/api/me`)).status(), 200)
    assert.equal((await signIn(GOOD_PASSWORD)).status, 401)
    assert.equal((await signIn(NEW_PASSWORD)).status, 200)
    const events = await fetch(`${origin}/auth/api/events?type=user.password_changed&target_id=${userId}`, { headers: auth(adminKey) })
    const list = await events.json() as { items?: Array<{ actor?: { type: string } }> } | Array<{ actor?: { type: string } }>
    const items = Array.isArray(list) ? list : list.items ?? []
    assert.equal(items.length, 1, JSON.stringify(list))
  } finally {
    await browser?.close()
    await app.close()
  }
})
