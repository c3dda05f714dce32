import { strict as assert } from 'node:assert'
import { randomBytes } from 'node:crypto'
import { readFile } from 'node:fs/promises'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { generate } from 'otplib'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'

// The pages and the browser's WebAuthn are the subject here, not the database: SQLite is enough.
const dialect = dialects()[0]!

async function codeAt (secret: string, steps: number): Promise<string> {
  return await generate({ secret, epoch: Math.floor(Date.now() / 1000) + steps * 30 })
}

test(`second factors in Chromium: enrol TOTP and a passkey on the account page, sign in with each (${dialect.name})`, { timeout: 120_000 }, async (t) => {
  if (browserSkipped(t)) return
  const { app, adminKey } = await createTestApp(dialect, { mfaEncryptionKey: randomBytes(32) })
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as AddressInfo
    // A WebAuthn relying party id must be a domain, never an IP address: the browser goes to localhost.
    const origin = `http://localhost:${port}`
    const username = uniqueName('mfa')
    const created = await fetch(`http://127.0.0.1:${port}/auth/api/users`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    assert.equal(created.status, 201, await created.text())

    browser = await launchChromium()
    const page = browser.page
    const cdp = await browser.context.newCDPSession(page)
    await cdp.send('WebAuthn.enable')
    const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
      options: { protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true }
    })
    const mfaHeader = async (): Promise<string | undefined> => {
      const res = await browser!.context.request.get(`${origin}/auth/api/verify`)
      assert.equal(res.status(), 200)
      return res.headers()['x-auth-mfa']
    }
    const passwordStep = async (): Promise<void> => {
      await page.goto(`${origin}/auth/login?next=${encodeURIComponent('/auth/account')}`)
      await page.locator('#username').fill(username)
      await page.locator('#password').fill(GOOD_PASSWORD)
      await page.locator('button[type=submit]').click()
    }
    const signOut = async (): Promise<void> => {
      await page.goto(`${origin}/auth/account`)
      await page.locator('button', { hasText: 'Sign out' }).click()
      await page.waitForURL(`${origin}/auth/login`)
    }

    // Password only: straight to the account page.
    await passwordStep()
    await page.waitForURL(`${origin}/auth/account`)
    assert.equal(await page.locator('#username').textContent(), username)
    assert.equal(await mfaHeader(), 'false')

    // Authenticator app: scan (read the key), confirm, keep the recovery codes.
    await page.locator('button', { hasText: 'Set up an authenticator app' }).click()
    assert.equal(await page.locator('#totp-qr svg').count(), 1)
    // Shown in groups of four for typing; apps ignore the spaces.
    const secret = (await page.locator('#totp-secret').textContent())!.replace(/\s/g, '')
    await page.locator('#code').fill(await codeAt(secret, 0))
    await page.locator('button', { hasText: 'Turn on' }).click()
    assert.equal(await page.locator('#recovery-codes li').count(), 10)
    await page.locator('#continue').click()
    await page.waitForURL(`${origin}/auth/account`)
    assert.equal(await page.locator('#totp-state').textContent(), 'On.')

    // A passkey, made by Chromium's virtual authenticator.
    await page.locator('#passkey-name').fill('Chromium')
    await page.locator('button', { hasText: 'Add a passkey' }).click()
    await page.locator('#passkeys li', { hasText: 'Chromium' }).waitFor({ state: 'visible' })
    const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId })
    assert.equal(credentials.length, 1)
    assert.equal(credentials[0]!.isResidentCredential, true)
    await signOut()

    // Password, then the app's code.
    await passwordStep()
    await page.locator('#code').waitFor({ state: 'visible' })
    assert.equal(await page.locator('h1').textContent(), 'Second step')
    await page.locator('#code').fill(await codeAt(secret, 1))
    await page.locator('button', { hasText: 'Continue' }).click()
    await page.waitForURL(`${origin}/auth/account`)
    assert.equal(await mfaHeader(), 'true')
    await signOut()

    // Password, then the passkey.
    await passwordStep()
    await page.locator('button', { hasText: 'Use a passkey' }).click()
    await page.waitForURL(`${origin}/auth/account`)
    assert.equal(await page.locator('#username').textContent(), username)
    assert.equal(await mfaHeader(), 'true')
    await signOut()

    // The passkey alone, from the sign-in page's link.
    await page.goto(`${origin}/auth/login`)
    await page.locator('a', { hasText: 'Sign in with a passkey' }).click()
    await page.locator('button', { hasText: 'Use a passkey' }).click()
    await page.waitForURL(`${origin}/auth/login`)
    await page.locator('#username').waitFor({ state: 'visible' })
    assert.equal(await page.locator('#username').textContent(), username)
    assert.equal(await mfaHeader(), 'true')
  } finally {
    await browser?.close()
    await app.close()
  }
})

test(`account page in Chromium: a mistyped set-up code keeps the key, recovery codes copy and download, an old session confirms it is you (${dialect.name})`, { timeout: 120_000 }, async (t) => {
  if (browserSkipped(t)) return
  const { app, adminKey, config } = await createTestApp(dialect, { mfaEncryptionKey: randomBytes(32) })
  let browser: Browser | undefined
  try {
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as AddressInfo
    const origin = `http://localhost:${port}`
    const username = uniqueName('reauth')
    const created = await fetch(`http://127.0.0.1:${port}/auth/api/users`, {
      method: 'POST',
      headers: { ...auth(adminKey), 'content-type': 'application/json' },
      body: JSON.stringify({ username, password: GOOD_PASSWORD })
    })
    const body = await created.text()
    assert.equal(created.status, 201, body)
    const userId = (JSON.parse(body) as { id: string }).id
    /** Moves the browser's sign-in (and re-authentication) past REAUTH_WINDOW_SECONDS, in the database rather than by waiting. */
    const signedInLongAgo = async (): Promise<void> => {
      await app.db.updateTable('sessions').set({ created_at: new Date(Date.now() - config.reauthWindowMs - 60_000).toISOString(), reauthenticated_at: null })
        .where('user_id', '=', userId).execute()
    }

    browser = await launchChromium()
    const page = browser.page
    await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin })
    const cdp = await browser.context.newCDPSession(page)
    await cdp.send('WebAuthn.enable')
    await cdp.send('WebAuthn.addVirtualAuthenticator', {
      options: { protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true }
    })
    await page.goto(`${origin}/auth/login?next=${encodeURIComponent('/auth/account')}`)
    await page.locator('#username').fill(username)
    await page.locator('#password').fill(GOOD_PASSWORD)
    await page.locator('button[type=submit]').click()
    await page.waitForURL(`${origin}/auth/account`)

    // A mistyped code: the same key again, so the entry already scanned still works.
    await page.locator('button', { hasText: 'Set up an authenticator app' }).click()
    const shown = (await page.locator('#totp-secret').textContent())!
    assert.match(shown, /^([A-Z2-7]{4} )+[A-Z2-7]{1,4}$/)
    const secret = shown.replace(/ /g, '')
    await page.locator('#code').fill(await codeAt(secret, 0) === '000000' ? '111111' : '000000')
    await page.locator('button', { hasText: 'Turn on' }).click()
    await page.locator('#error').waitFor({ state: 'visible' })
    assert.equal(await page.locator('#totp-secret').textContent(), shown)
    await page.locator('#code').fill(await codeAt(secret, 0))
    await page.locator('button', { hasText: 'Turn on' }).click()
    assert.equal(await page.locator('#recovery-codes li').count(), 10)
    const codes = (await page.locator('#recovery-codes code').allTextContents()).join('\n') + '\n'

    // Copy and Download, from the page's own script (the CSP allows no other).
    await page.locator('#copy-codes').click()
    await page.locator('#codes-status', { hasText: 'Copied.' }).waitFor({ state: 'visible' })
    assert.equal(await page.evaluate('navigator.clipboard.readText()'), codes)
    const [download] = await Promise.all([page.waitForEvent('download'), page.locator('#download-codes').click()])
    assert.equal(download.suggestedFilename(), 'gatehouse-recovery-codes.txt')
    assert.equal(await readFile((await download.path())!, 'utf8'), codes)
    await page.locator('#continue').click()
    await page.waitForURL(`${origin}/auth/account`)

    // Signed in too long ago: new recovery codes ask for the password first, then work.
    await signedInLongAgo()
    await page.locator('button', { hasText: 'Make new recovery codes' }).click()
    await page.locator('#reauth').waitFor({ state: 'visible' })
    await page.locator('#reauth-password').fill(GOOD_PASSWORD)
    await page.locator('#reauth button[type=submit]').click()
    await page.waitForURL(`${origin}/auth/account?reauthenticated=1`)
    await page.locator('#notice').waitFor({ state: 'visible' })
    await page.locator('button', { hasText: 'Make new recovery codes' }).click()
    assert.equal(await page.locator('#recovery-codes li').count(), 10)
    assert.notEqual((await page.locator('#recovery-codes code').allTextContents()).join('\n') + '\n', codes)
    await page.locator('#continue').click()
    await page.waitForURL(`${origin}/auth/account`)

    // Adding a passkey from an old session: the script comes back to the form; a TOTP code confirms, then the passkey is added.
    await signedInLongAgo()
    await page.locator('button', { hasText: 'Add a passkey' }).click()
    await page.waitForURL(`${origin}/auth/account?reauthenticate=1`)
    await page.locator('#reauth-code').fill(await codeAt(secret, 1))
    await page.locator('#reauth button[type=submit]').click()
    await page.locator('#notice').waitFor({ state: 'visible' })
    await page.locator('button', { hasText: 'Add a passkey' }).click()
    await page.locator('#passkeys li').waitFor({ state: 'visible' })

    // And with the passkey itself.
    await signedInLongAgo()
    await page.locator('button', { hasText: 'Remove the authenticator app' }).click()
    await page.locator('#reauth').waitFor({ state: 'visible' })
    await page.locator('button', { hasText: 'Confirm with a passkey' }).click()
    await page.waitForURL(`${origin}/auth/account?reauthenticated=1`)
    await page.locator('button', { hasText: 'Remove the authenticator app' }).click()
    await page.waitForURL(`${origin}/auth/account`)
    assert.equal(await page.locator('#totp-state').textContent(), 'Off.')
  } finally {
    await browser?.close()
    await app.close()
  }
})
