import { strict as assert } from 'node:assert'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { AxeBuilder } from '@axe-core/playwright'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { createTestApp, dialects, GOOD_PASSWORD } from './helpers.ts'

for (const dialect of dialects()) {
  test(`a fresh deployment in Chromium: from /auth to the set-up page, the printed key becomes a signed-in console admin (${dialect.name})`, { timeout: 120_000 }, async (t) => {
    if (browserSkipped(t)) return
    const { app, adminKey } = await createTestApp(dialect)
    let browser: Browser | undefined
    try {
      await app.listen({ host: '127.0.0.1', port: 0 })
      const { port } = app.server.address() as AddressInfo
      const origin = `http://127.0.0.1:${port}`
      browser = await launchChromium()
      const page = browser.page
      const cspErrors: string[] = []
      const foreign: string[] = []
      page.on('console', (message) => { if (/Content.Security.Policy/i.test(message.text())) cspErrors.push(message.text()) })
      page.on('request', (request) => { if (!request.url().startsWith(origin)) foreign.push(request.url()) })
      const accessible = async (name: string): Promise<void> => {
        const results = await new AxeBuilder({ page }).analyze()
        const bad = results.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
        assert.deepEqual(bad.map(v => `${v.id}: ${v.help}`), [], name)
      }

      // The service's address names where to go.
      await page.goto(`${origin}/auth`)
      await accessible('landing')
      for (const name of ['API documentation', 'Admin console', 'Sign in']) assert.ok(await page.getByRole('link', { name }).isVisible(), name)

      await page.goto(`${origin}/auth/admin/setup`)
      await accessible('setup')
      // A mistyped key: said at the field, nothing created.
      await page.getByLabel('Admin API key').fill(`${adminKey}x`)
      await page.getByLabel('Username').fill('first.admin')
      await page.getByLabel('Password (at least').fill(GOOD_PASSWORD)
      await page.getByRole('button', { name: 'Create admin and sign in' }).click()
      await page.locator('#api_key-error').waitFor()
      await accessible('setup-wrong-key')
      assert.equal(await page.getByLabel('Username').inputValue(), 'first.admin')
      assert.equal(await page.getByLabel('Admin API key').inputValue(), '', 'the key is not sent back')

      await page.getByLabel('Admin API key').fill(adminKey)
      await page.getByLabel('Password (at least').fill(GOOD_PASSWORD)
      await page.getByRole('button', { name: 'Create admin and sign in' }).click()
      await page.waitForURL(`${origin}/auth/admin/users`)
      assert.match(await page.locator('body').innerText(), /first\.admin/)

      // Once set up, the page sends people to sign in.
      await page.goto(`${origin}/auth/admin/setup`)
      assert.ok(await page.getByRole('link', { name: 'Sign in to the admin console' }).isVisible())
      assert.equal(await page.getByLabel('Admin API key').count(), 0)

      assert.deepEqual(cspErrors, [], 'the Content-Security-Policy refused something')
      assert.deepEqual(foreign, [], 'requests to other origins')
    } finally {
      await browser?.close()
      await app.close()
    }
  })
}
