import { strict as assert } from 'node:assert'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'
import { waitFor } from './polling.ts'

// The docs page is the subject here, not the database: SQLite is enough.
const dialect = dialects()[0]!

test(`docs page in a real browser: deep link, the SCIM section, Authorize, Try it out (${dialect.name})`, { timeout: 60_000 }, async (t) => {
  if (browserSkipped(t)) return

  const { app, adminKey } = await createTestApp(dialect)
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as AddressInfo
    const origin = `http://127.0.0.1:${port}`

    const username = uniqueName('browser')
    const created = await fetch(`${origin}/auth/api/users`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    assert.equal(created.status, 201, await created.text())

    browser = await launchChromium()
    const page = browser.page
    const requested: string[] = []
    page.on('request', (request) => { requested.push(request.url()) })

    // A deep link opens the operation it names.
    await page.goto(`${origin}/auth/docs#/default/create_user_users_post`)
    const createOp = page.locator('#operations-default-create_user_users_post')
    // Polled rather than locator.waitFor: with Chromium 156.0.8078.114 a waitFor begun while Swagger UI
    // renders the deep link never settled (15 s timeout), though the same locator was visible throughout.
    await waitFor('the deep-linked operation to show', async () => await createOp.isVisible())
    await page.locator('#operations-default-create_user_users_post.is-open').waitFor({ state: 'visible' })
    assert.ok(await createOp.locator('.opblock-body').isVisible(), 'the deep-linked Create User operation is expanded')

    // SCIM has its own section, with its operations.
    await page.locator('#operations-tag-scim').waitFor({ state: 'visible' })
    assert.equal(await page.locator('#operations-scim-scim_patch_user').count(), 1, 'the scim tag lists Patch User (SCIM)')

    // Authorize with the admin key, sent as X-API-Key.
    await page.locator('.auth-wrapper button.authorize').click()
    const dialog = page.locator('.dialog-ux .modal-ux')
    await dialog.waitFor({ state: 'visible' })
    // By the scheme's whole name: 'Bearer' is also in 'ScimBearer' and in each bearer scheme's '(http, Bearer)'.
    const schemeNamed = (scheme: string) => dialog.locator('.auth-container').filter({ has: page.locator('h4 code', { hasText: new RegExp(`^${scheme}$`) }) })
    for (const scheme of ['ApiKeyQuery', 'ApiKeyHeader', 'Bearer', 'ScimBearer']) {
      assert.equal(await schemeNamed(scheme).count(), 1, `the dialog offers ${scheme}`)
    }
    const headerScheme = schemeNamed('ApiKeyHeader')
    await headerScheme.locator('input').fill(adminKey)
    await headerScheme.locator('button.authorize').click()
    await headerScheme.locator('button', { hasText: 'Logout' }).waitFor({ state: 'visible' })
    await dialog.locator('button.close-modal').click()
    await dialog.waitFor({ state: 'hidden' })

    // List Users: Try it out, Execute.
    const listOp = page.locator('#operations-default-list_users_users_get')
    await listOp.locator('.opblock-summary-control').click()
    await listOp.locator('button.try-out__btn').click()
    await listOp.locator('button.execute').click()
    const live = listOp.locator('.live-responses-table')
    await live.waitFor({ state: 'visible' })
    const status = (await live.locator('tbody .response-col_status').first().innerText()).trim()
    const body = await live.locator('.response-col_description .highlight-code').first().innerText()
    assert.equal(status, '200', `response code shown: ${status}; body: ${body}`)
    assert.ok(body.includes(username), `the response body shown lists ${username}: ${body}`)

    // Swagger UI's files, the document and the call itself all came from this server.
    assert.ok(requested.length > 0)
    const foreign = requested.filter((url) => new URL(url).hostname !== '127.0.0.1')
    assert.deepEqual(foreign, [], 'every request the page made went to 127.0.0.1')
    assert.ok(requested.some((url) => url.startsWith(`${origin}/auth/api/users`)), 'Execute called the API')
  } finally {
    await browser?.close()
    await app.close()
  }
})
