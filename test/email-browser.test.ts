import { strict as assert } from 'node:assert'
import { after, test } from 'node:test'
import { AxeBuilder } from '@axe-core/playwright'
import type { Page } from 'playwright-core'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'
import { freePort } from './ports.ts'
import { SmtpTestServer } from './smtp-server.ts'

// The pages, their CSP, Referrer-Policy and a real browser's form posts are the subject here: SQLite is enough.
const dialect = dialects()[0]!
const smtp = await SmtpTestServer.start()
after(async () => { await smtp.close() })
const NEW_PASSWORD = 'a brand new passphrase for this'

/** No serious or critical axe violation on the page as it is now. */
async function assertAccessible (page: Page, name: string): Promise<void> {
  const results = await new AxeBuilder({ page }).analyze()
  const bad = results.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
  assert.deepEqual(bad.map(v => `${v.id}: ${v.help}`), [], name)
}

test(`Chromium follows the mailed links: accepts an invitation and signs in, then resets the password from "Forgot password?" and changes the address (${dialect.name})`, { timeout: 180_000 }, async (t) => {
  if (browserSkipped(t)) return
  const port = await freePort()
  const origin = `http://localhost:${port}`
  const { app, adminKey } = await createTestApp(dialect, {
    smtpUrl: smtp.url,
    smtpTrustForTests: [smtp.certificate],
    mailFrom: 'gatehouse@example.test',
    publicUrl: `${origin}/auth`,
    mailPollIntervalMs: 50,
    mailTimeoutMs: 2000
  })
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port })
    const username = uniqueName('browser')
    const email = `${username}@example.test`
    const created = await fetch(`${origin}/auth/api/users`, {
      method: 'POST', headers: { ...auth(adminKey), 'content-type': 'application/json' }, body: JSON.stringify({ username, email, invite: true })
    })
    assert.equal(created.status, 201, await created.text())
    const invitation = await smtp.waitForMail(email, { subject: /invited/ })
    const invitationLink = invitation.links.find(l => l.startsWith(`${origin}/auth/invitation?token=`))
    assert.ok(invitationLink !== undefined, invitation.text)

    browser = await launchChromium()
    const page = browser.page
    const cspErrors: string[] = []
    page.on('console', (message) => { if (/Content.Security.Policy/i.test(message.text())) cspErrors.push(message.text()) })
    const referrers: string[] = []
    page.on('request', (request) => { const referer = request.headers().referer; if (referer !== undefined) referrers.push(referer) })

    const opened = await page.goto(invitationLink)
    assert.equal(opened?.headers()['referrer-policy'], 'no-referrer')
    assert.equal(await page.locator('#username').innerText(), username)
    await assertAccessible(page, 'invitation page')
    await page.locator('#password').fill(GOOD_PASSWORD)
    await page.locator('#confirm').fill(GOOD_PASSWORD)
    await page.getByRole('button', { name: 'Accept and sign in' }).click()
    await page.waitForURL(`${origin}/auth/login`)
    assert.equal(await page.locator('#username').innerText(), username, 'signed in, on the signed-in page')
    await page.getByRole('button', { name: 'Sign out' }).click()
    await page.waitForURL(`${origin}/auth/login`)

    await page.getByRole('link', { name: 'Forgot password?' }).click()
    await page.waitForURL(`${origin}/auth/forgot-password`)
    await assertAccessible(page, 'forgot-password page')
    await page.locator('#login').fill(email)
    await page.getByRole('button', { name: 'Mail me a link' }).click()
    await page.locator('#sent').waitFor()
    const reset = await smtp.waitForMail(email, { subject: /reset your password/ })
    const resetLink = reset.links.find(l => l.startsWith(`${origin}/auth/reset-password?token=`))
    assert.ok(resetLink !== undefined, reset.text)
    await page.goto(resetLink)
    await assertAccessible(page, 'reset page')
    await page.locator('#password').fill(NEW_PASSWORD)
    await page.locator('#confirm').fill(NEW_PASSWORD)
    await page.getByRole('button', { name: 'Set the new password' }).click()
    await page.locator('#done').waitFor()
    await page.getByRole('link', { name: 'Sign in' }).click()
    await page.locator('#password').fill(NEW_PASSWORD)
    await page.locator('#username').fill(username)
    await page.getByRole('button', { name: 'Sign in' }).click()
    await page.locator('dd#username').waitFor()

    // The account page asks for a new address; it changes once the link mailed there is followed.
    const newEmail = `new_${username}@example.test`
    await page.goto(`${origin}/auth/account`)
    await page.locator('#new-email').fill(newEmail)
    await page.getByRole('button', { name: 'Change address' }).click()
    await page.locator('#notice').waitFor()
    const confirmation = await smtp.waitForMail(newEmail, { subject: /confirm your e-mail address/ })
    const confirmLink = confirmation.links.find(l => l.startsWith(`${origin}/auth/verify-email?token=`))
    assert.ok(confirmLink !== undefined, confirmation.text)
    await page.goto(confirmLink)
    await assertAccessible(page, 'confirmation page')
    assert.equal(await page.locator('#email').innerText(), newEmail)
    await page.getByRole('button', { name: 'Confirm the address' }).click()
    await page.locator('#done').waitFor()
    await page.goto(`${origin}/auth/account`)
    assert.match(await page.locator('#email-state').innerText(), new RegExp(`${newEmail}: confirmed`))

    assert.deepEqual(referrers.filter(r => r.includes('token=')), [], 'no request carried a token in its Referer')
    assert.deepEqual(cspErrors, [], 'the Content-Security-Policy refused something')
  } finally {
    await browser?.close()
    await app.close()
  }
})
