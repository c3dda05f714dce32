import { strict as assert } from 'node:assert'
import { randomBytes } from 'node:crypto'
import { mkdir } from 'node:fs/promises'
import type { AddressInfo } from 'node:net'
import { test } from 'node:test'
import { AxeBuilder } from '@axe-core/playwright'
import { generate } from 'otplib'
import type { Page } from 'playwright-core'
import { browserSkipped, launchChromium, type Browser } from './browser.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName } from './helpers.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'

/** Screenshots of every page at both widths, for people to look at (gitignored). */
const ARTIFACTS = new URL('./artifacts/', import.meta.url)
const WIDTHS = [[1280, 800], [360, 740]] as const

/**
 * Checks a page the way a person and a screen reader meet it: no serious or
 * critical axe violation, nothing refused by the Content-Security-Policy,
 * nothing wider than the window at a desktop or a phone width, and a
 * screenshot at each.
 */
async function inspect (page: Page, name: string, dialect: string, cspErrors: string[]): Promise<void> {
  const results = await new AxeBuilder({ page }).analyze()
  const bad = results.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
  assert.deepEqual(bad.map(v => `${v.id}: ${v.help} (${v.nodes.map(n => n.target.join(' ')).join(', ')})`), [], name)
  for (const [width, height] of WIDTHS) {
    await page.setViewportSize({ width, height })
    // Nothing may stick out sideways at phone width except inside the scrollable table regions.
    const overflow = await page.evaluate('document.documentElement.scrollWidth - document.documentElement.clientWidth') as number
    assert.ok(overflow <= 0, `${name} at ${width} px scrolls sideways by ${overflow} px`)
    await page.screenshot({ path: new URL(`console-${dialect}-${name}-${width}.png`, ARTIFACTS).pathname, fullPage: true })
  }
  await page.setViewportSize({ width: 1280, height: 800 })
  assert.deepEqual(cspErrors, [], `${name}: the Content-Security-Policy refused something`)
}

for (const dialect of dialects()) {
  test(`admin console in Chromium: the seed's workflows, keys, a conflict, a second-factor reset, filtered events, a refusal, accessibility (${dialect.name})`, { timeout: 180_000 }, async (t) => {
    if (browserSkipped(t)) return
    await mkdir(ARTIFACTS, { recursive: true })
    const { app, adminKey } = await createTestApp(dialect, { mfaEncryptionKey: randomBytes(32) })
    let browser: Browser | undefined
    try {
      await app.listen({ host: '127.0.0.1', port: 0 })
      const { port } = app.server.address() as AddressInfo
      const origin = `http://127.0.0.1:${port}`
      const api = async (path: string, init: RequestInit = {}): Promise<Response> =>
        await fetch(`${origin}/auth/api${path}`, { ...init, headers: { ...auth(adminKey), 'content-type': 'application/json', ...init.headers } })
      const adminName = uniqueName('boss')
      const plainName = uniqueName('plain')
      for (const [username, role] of [[adminName, 'admin'], [plainName, 'user']]) {
        const res = await api('/users', { method: 'POST', body: JSON.stringify({ username, role, password: GOOD_PASSWORD }) })
        assert.equal(res.status, 201, await res.text())
      }

      browser = await launchChromium()
      await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin })
      const page = browser.page
      const cspErrors: string[] = []
      const foreign: string[] = []
      page.on('console', (message) => { if (/Content.Security.Policy/i.test(message.text())) cspErrors.push(message.text()) })
      page.on('request', (request) => { if (!request.url().startsWith(origin)) foreign.push(request.url()) })
      const check = async (name: string): Promise<void> => { await inspect(page, name, dialect.name, cspErrors) }

      // Sign in through the ordinary sign-in page, which sends the browser on to the console.
      await page.goto(`${origin}/auth/admin`)
      assert.match(page.url(), /\/auth\/login\?next=%2Fauth%2Fadmin$/)
      await page.getByLabel('Username or email').fill(adminName)
      await page.getByLabel('Password').fill(GOOD_PASSWORD)
      await page.getByRole('button', { name: 'Sign in' }).click()
      await page.waitForURL(`${origin}/auth/admin/users`)
      await check('users')

      // The keyboard reaches the content first through the skip link.
      await page.keyboard.press('Tab')
      assert.equal(await page.evaluate('document.activeElement.textContent'), 'Skip to content')

      // Workflow 1: create a user.
      const username = uniqueName('ada')
      await page.getByRole('link', { name: 'Create user' }).click()
      await check('new-user')
      await page.getByLabel('Username').fill('not valid!')
      await page.getByRole('button', { name: 'Create user' }).click()
      await page.locator('#form-errors').waitFor()
      await check('new-user-errors')
      await page.getByLabel('Username').fill(username)
      await page.getByLabel('Email').fill(`${username}@example.com`)
      await page.getByLabel('First name').fill('Ada')
      await page.getByLabel('Last name').fill('Lovelace')
      await page.getByLabel('Groups').fill('analysts')
      await page.getByLabel('Password').fill(GOOD_PASSWORD)
      // Submitted from the keyboard.
      await page.getByLabel('Password').press('Enter')
      await page.waitForURL(/\/auth\/admin\/users\/[0-9a-f-]{36}\?done=created$/)
      assert.equal(await page.getByRole('status').innerText(), 'User created.')
      assert.match(await page.locator('pre.command').first().innerText(), new RegExp(`npx gatehouse db-user create ${username}`))
      await check('user-created')

      // Workflow 2: find them in the list.
      await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Users' }).click()
      await page.getByLabel('Search').fill('lovelace')
      await page.getByRole('button', { name: 'Apply' }).click()
      await page.waitForURL(/q=lovelace/)
      const rows = page.locator('tbody tr')
      assert.equal(await rows.count(), 1)
      assert.equal(await rows.first().locator('td').first().innerText(), username)
      const id = (await rows.first().locator('td.id').innerText()).trim()
      assert.match(id, /^[0-9a-f-]{36}$/)
      await check('users-search')

      // Workflow 3: delete them by the id the list shows.
      await page.goto(`${origin}/auth/admin/users/${id}`)
      await check('user')
      await page.getByRole('link', { name: 'Delete…' }).click()
      assert.equal(await page.getByRole('heading', { level: 1 }).innerText(), `Delete ${username}?`)
      await check('delete-confirm')
      await page.getByRole('button', { name: `Delete ${username}` }).click()
      await page.waitForURL(/done=deleted/)
      assert.match(await page.getByRole('status').innerText(), new RegExp(`Deleted ${username}`))
      await check('user-deleted')
      assert.equal((await api(`/users/${id}`)).status, 404)

      // A conflict on concurrent edit: both versions are shown, nothing is overwritten.
      const other = await (await api('/users', { method: 'POST', body: JSON.stringify({ username: uniqueName('grace'), first_name: 'Grace' }) })).json() as { id: string }
      await page.goto(`${origin}/auth/admin/users/${other.id}`)
      await page.getByLabel('First name').fill('Amazing Grace')
      const patched = await api(`/users/${other.id}`, { method: 'PATCH', body: JSON.stringify({ last_name: 'Hopper' }) })
      assert.equal(patched.status, 200)
      await page.getByRole('button', { name: 'Save changes' }).click()
      await page.getByRole('heading', { name: /was changed by someone else/ }).waitFor()
      const firstName = page.locator('tr', { has: page.getByRole('rowheader', { name: 'First name' }) })
      assert.deepEqual(await firstName.locator('td').allInnerTexts(), ['Grace', 'Amazing Grace', 'Grace', 'you changed'])
      const lastName = page.locator('tr', { has: page.getByRole('rowheader', { name: 'Last name' }) })
      assert.deepEqual(await lastName.locator('td').allInnerTexts(), ['—', '—', 'Hopper', 'they changed'])
      await check('conflict')
      assert.equal((await (await api(`/users/${other.id}`)).json() as { first_name: string }).first_name, 'Grace')
      await page.getByRole('button', { name: 'Apply my changes to the current version' }).click()
      await page.waitForURL(/done=saved/)
      assert.deepEqual(await (await api(`/users/${other.id}`)).json().then(u => [(u as { first_name: string }).first_name, (u as { last_name: string }).last_name]), ['Amazing Grace', 'Hopper'])

      // Groups: create one, add a member by username, see them listed, remove them after a confirmation dialog.
      await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Groups' }).click()
      await page.waitForURL(`${origin}/auth/admin/groups`)
      await check('groups')
      const groupName = uniqueName('pipeline-ops')
      await page.getByLabel('Name').fill(groupName)
      await page.getByRole('button', { name: 'Create group' }).click()
      await page.waitForURL(/\/auth\/admin\/groups\/[0-9a-f-]{36}\?done=group-created$/)
      assert.equal(await page.getByRole('status').innerText(), 'Group created.')
      await check('group')
      await page.getByLabel('Username').fill(plainName)
      await page.getByRole('button', { name: 'Add member' }).click()
      await page.waitForURL(/done=member-added$/)
      const memberRows = page.locator('tbody tr')
      assert.equal(await memberRows.count(), 1)
      assert.equal(await memberRows.first().locator('td').first().innerText(), plainName)
      await check('group-members')
      await page.getByRole('button', { name: `Remove ${plainName} from the group` }).click()
      const removeDialog = page.getByRole('dialog')
      await removeDialog.waitFor()
      await check('group-remove-dialog')
      await removeDialog.getByRole('button', { name: 'Remove' }).click()
      await page.waitForURL(/done=member-removed$/)
      assert.equal(await page.locator('tbody tr').count(), 0)
      await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Groups' }).click()
      const groupRow = page.locator('tbody tr', { has: page.getByRole('link', { name: groupName }) })
      assert.equal(await groupRow.locator('td[data-label="Members"]').innerText(), '0')
      const analystsRow = page.locator('tbody tr', { has: page.getByRole('link', { name: 'analysts', exact: true }) })
      assert.equal(await analystsRow.count(), 1, 'the group the user form named was made')

      // API keys: create (secret once, copy button), revoke after a confirmation dialog.
      await page.getByRole('link', { name: 'API keys' }).click()
      await check('api-keys')
      await page.getByLabel('Name').fill('nightly export')
      await page.getByLabel(/users:read/).check()
      await page.getByRole('button', { name: 'Create key' }).click()
      await page.getByRole('heading', { name: 'Key created: nightly export' }).waitFor()
      const secret = (await page.locator('#secret').innerText()).trim()
      assert.match(secret, /^gatehouse_[A-Za-z0-9]+$/)
      await page.getByRole('button', { name: 'Copy' }).click()
      await page.getByRole('button', { name: 'Copied' }).waitFor()
      assert.equal(await page.evaluate('navigator.clipboard.readText()'), secret)
      await check('key-secret')
      const withKey = await fetch(`${origin}/auth/api/users?limit=1`, { headers: auth(secret) })
      assert.equal(withKey.status, 200)

      await page.getByRole('link', { name: 'Back to the keys' }).click()
      await page.getByRole('button', { name: 'Revoke nightly export' }).click()
      const dialog = page.getByRole('dialog')
      await dialog.waitFor()
      assert.match(await dialog.innerText(), /Revoke “nightly export”\? It stops working at once\./)
      await check('revoke-dialog')
      await dialog.getByRole('button', { name: 'Revoke' }).click()
      await page.waitForURL(/done=revoked/)
      assert.equal(await page.getByRole('status').innerText(), 'Key revoked.')
      assert.equal((await fetch(`${origin}/auth/api/users?limit=1`, { headers: auth(secret) })).status, 401)

      // A second factor lost: a user with an authenticator app (enrolled through the API with their own session) is reset from their page.
      const mfaName = uniqueName('lost')
      const mfaUser = await (await api('/users', { method: 'POST', body: JSON.stringify({ username: mfaName, password: GOOD_PASSWORD }) })).json() as { id: string }
      const session = await (await fetch(`${origin}/auth/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: mfaName, password: GOOD_PASSWORD }) })).json() as { token: string }
      const own = { authorization: `Bearer ${session.token}` }
      const setup = await (await fetch(`${origin}/auth/api/me/mfa/totp`, { method: 'POST', headers: own })).json() as { secret: string }
      const confirmed = await fetch(`${origin}/auth/api/me/mfa/totp/confirm`, { method: 'POST', headers: { ...own, 'content-type': 'application/json' }, body: JSON.stringify({ code: await generate({ secret: setup.secret }) }) })
      assert.equal(confirmed.status, 200, await confirmed.text())
      await page.goto(`${origin}/auth/admin/users/${mfaUser.id}`)
      const factors = page.locator('#mfa-state')
      assert.deepEqual(await factors.locator('dd').allInnerTexts().then(texts => texts.slice(0, 3)), ['yes', '0', '10 of 10'])
      await check('user-mfa')
      await page.getByRole('link', { name: 'Reset second factor…' }).click()
      assert.equal(await page.getByRole('heading', { level: 1 }).innerText(), `Reset the second factor of ${mfaName}?`)
      await check('mfa-reset-confirm')
      await page.getByRole('button', { name: `Reset the second factor of ${mfaName}` }).click()
      await page.waitForURL(/done=mfa-reset$/)
      assert.match(await page.getByRole('status').innerText(), /^Second factor reset/)
      assert.deepEqual(await factors.locator('dd').allInnerTexts().then(texts => texts.slice(0, 3)), ['no', '0', '0 of 10'])
      await check('user-mfa-reset')
      const status = await (await api(`/users/${mfaUser.id}/mfa`)).json() as { totp: { enrolled: boolean }, passkeys: unknown[], recovery_codes_remaining: number }
      assert.deepEqual([status.totp.enrolled, status.passkeys.length, status.recovery_codes_remaining], [false, 0, 0])
      const resets = await (await api(`/events?type=user.mfa_reset&target_id=${mfaUser.id}`)).json() as Array<{ actor: { type: string } }>
      assert.deepEqual(resets.map(e => e.actor.type), ['user'])

      // Events: the timeline, filtered by type.
      await page.getByRole('link', { name: 'Events' }).click()
      await page.getByLabel('Type').selectOption('api_key.revoked')
      await page.getByRole('button', { name: 'Apply' }).click()
      await page.waitForURL(/type=api_key.revoked/)
      assert.equal(await page.locator('tbody tr').count(), 1)
      await check('events')

      // ... and by who, typed as usernames, within a time range in UTC: the reset above, done by this admin to that user.
      await page.getByRole('link', { name: 'Clear' }).click()
      await page.getByLabel('Actor', { exact: true }).fill(adminName)
      await page.getByLabel('Target', { exact: true }).fill(mfaName)
      const minute = (offset: number): string => new Date(Date.now() + offset).toISOString().slice(0, 16)
      await page.getByLabel('From (UTC)').fill(minute(-10 * 60_000))
      await page.getByLabel('To (UTC)').fill(minute(10 * 60_000))
      await page.getByRole('button', { name: 'Apply' }).click()
      await page.waitForURL(/actor=/)
      const eventRows = page.locator('tbody tr')
      assert.equal(await eventRows.count(), 1)
      assert.equal(await eventRows.locator('td[data-label="Event"]').innerText(), 'user.mfa_reset')
      assert.match(await eventRows.locator('td[data-label="Actor"] a').innerText(), new RegExp(`^${adminName}$`))
      assert.equal(await eventRows.locator('td[data-label="Target"] a').innerText(), mfaName)
      assert.match(await eventRows.locator('td[data-label="Details"]').innerText(), /totp: true\npasskeys: 0\nrecovery_codes: 10/)
      await check('events-filtered')
      await page.getByLabel('Actor', { exact: true }).fill('nobody_by_this_name')
      await page.getByRole('button', { name: 'Apply' }).click()
      await page.locator('#unmatched').waitFor()
      await check('events-unmatched')

      // The admin's own second factor is managed on the account security page, one link away.
      await page.getByRole('link', { name: 'Account security' }).click()
      await page.waitForURL(`${origin}/auth/account`)

      // A non-admin is refused with a page that says so.
      await page.getByRole('button', { name: 'Sign out' }).click()
      await page.waitForURL(/\/auth\/login/)
      await page.goto(`${origin}/auth/login?next=/auth/admin`)
      await page.getByLabel('Username or email').fill(plainName)
      await page.getByLabel('Password').fill(GOOD_PASSWORD)
      const refused = page.waitForResponse(res => /\/auth\/admin(\/users)?$/.test(res.url()))
      await page.getByRole('button', { name: 'Sign in' }).click()
      assert.equal((await refused).status(), 403)
      assert.equal(await page.getByRole('heading', { level: 1 }).innerText(), 'Admins only')
      assert.match(await page.getByRole('alert').innerText(), new RegExp(`signed in as ${plainName}`))
      await check('not-admin')

      assert.deepEqual(foreign, [], 'every request went to this server')
    } finally {
      await browser?.close()
      await app.close()
    }
  })
}

for (const dialect of dialects()) {
  test(`admin console in Chromium: a webhook endpoint added, pinged, its attempts listed and a delivery retried (${dialect.name})`, { timeout: 180_000 }, async (t) => {
    if (browserSkipped(t)) return
    await mkdir(ARTIFACTS, { recursive: true })
    // The receiver is on 127.0.0.1; a failed delivery waits a minute for its retry, so the page can show it pending.
    const { app, adminKey } = await createTestApp(dialect, { webhookAllowPrivate: true, webhookPollIntervalMs: 50, webhookRetryBaseMs: 60_000, webhookTimeoutMs: 2000 })
    const receiver = new Receiver()
    let browser: Browser | undefined
    try {
      const hookUrl = await receiver.listen()
      await app.listen({ host: '127.0.0.1', port: 0 })
      const { port } = app.server.address() as AddressInfo
      const origin = `http://127.0.0.1:${port}`
      const api = async (path: string, init: RequestInit = {}): Promise<Response> =>
        await fetch(`${origin}/auth/api${path}`, { ...init, headers: { ...auth(adminKey), 'content-type': 'application/json', ...init.headers } })
      const adminName = uniqueName('hooks')
      assert.equal((await api('/users', { method: 'POST', body: JSON.stringify({ username: adminName, role: 'admin', password: GOOD_PASSWORD }) })).status, 201)

      browser = await launchChromium()
      await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin })
      const page = browser.page
      const cspErrors: string[] = []
      page.on('console', (message) => { if (/Content.Security.Policy/i.test(message.text())) cspErrors.push(message.text()) })
      const check = async (name: string): Promise<void> => { await inspect(page, name, dialect.name, cspErrors) }

      await page.goto(`${origin}/auth/login?next=/auth/admin`)
      await page.getByLabel('Username or email').fill(adminName)
      await page.getByLabel('Password').fill(GOOD_PASSWORD)
      await page.getByRole('button', { name: 'Sign in' }).click()
      await page.waitForURL(`${origin}/auth/admin/users`)

      await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Webhooks' }).click()
      await page.waitForURL(`${origin}/auth/admin/webhooks`)
      await check('webhooks-empty')

      // A mistyped event type is shown next to its field; what was typed stays.
      await page.getByLabel('URL').fill(hookUrl)
      await page.getByLabel('Event types').fill('user.*, user.exploded')
      await page.getByLabel('Description').fill('local receiver')
      await page.getByRole('button', { name: 'Add endpoint' }).click()
      await page.locator('#form-errors').waitFor()
      assert.match(await page.locator('#event_types-error').innerText(), /Event types is not an event type/)
      assert.equal(await page.getByLabel('URL').inputValue(), hookUrl)
      await check('webhooks-errors')

      await page.getByLabel('Event types').fill('user.*')
      await page.getByRole('button', { name: 'Add endpoint' }).click()
      await page.getByRole('heading', { name: 'Endpoint added' }).waitFor()
      const secret = (await page.locator('#secret').innerText()).trim()
      assert.match(secret, /^whsec_[A-Za-z0-9+/]+=*$/)
      await page.getByRole('button', { name: 'Copy' }).click()
      await page.getByRole('button', { name: 'Copied' }).waitFor()
      assert.equal(await page.evaluate('navigator.clipboard.readText()'), secret)
      await check('webhook-secret')

      await page.getByRole('link', { name: 'Back to the webhooks' }).click()
      const row = page.locator('tbody tr')
      assert.equal(await row.count(), 1)
      assert.equal(await row.locator('td[data-label="URL"]').innerText(), hookUrl)
      assert.equal(await row.locator('td[data-label="Description"]').innerText(), 'local receiver')
      await check('webhooks')

      // Ping: signed with the secret just shown, answered by the receiver, the answer on the page.
      receiver.answer = () => 204
      await row.getByRole('link', { name: hookUrl }).click()
      await page.getByRole('button', { name: 'Send a test ping' }).click()
      await page.locator('#ping-result').waitFor()
      assert.match(await page.locator('#ping-result').innerText(), /Ping delivered: the receiver answered 204 in \d+ ms/)
      const ping = receiver.received.at(-1)!
      assert.equal(JSON.parse(ping.body).type, 'webhook.ping')
      assert.match(String(ping.headers['webhook-signature']), /^v1,/)
      await check('webhook-ping')

      // A real delivery: the receiver refuses it once, so the attempt shows its status code and next attempt, and Retry.
      receiver.answer = () => 503
      const made = await api('/users', { method: 'POST', body: JSON.stringify({ username: uniqueName('delivered') }) })
      assert.equal(made.status, 201)
      await waitFor('the first delivery attempt', () => receiver.received.some(r => r.body.includes('"user.created"')))
      // The ping's answer is the page at the form's address; the endpoint's own page is one up.
      const hookPage = page.url().replace(/\/ping$/, '')
      await waitFor('the attempt to be recorded', async () => {
        await page.goto(hookPage)
        return await page.getByRole('region', { name: 'Attempts' }).count() === 1
      })
      const attempt = page.getByRole('region', { name: 'Attempts' }).locator('tbody tr').first()
      assert.equal(await attempt.locator('td[data-label="Status code"]').innerText(), '503')
      assert.match(await attempt.locator('td[data-label="Latency"]').innerText(), /^\d+ ms$/)
      assert.match(await attempt.locator('td[data-label="Next attempt"]').innerText(), /UTC$/)
      const delivery = page.getByRole('region', { name: 'Deliveries' }).locator('tbody tr').first()
      assert.match(await delivery.locator('td[data-label="Status"]').innerText(), /pending/)
      await check('webhook-attempts')

      receiver.answer = () => 204
      await delivery.getByRole('button', { name: /^Retry user\.created/ }).click()
      await page.waitForURL(/done=retried/)
      await waitFor('the retried delivery', () => [...receiver.accepted().keys()].some(id => receiver.received.some(r => r.id === id && r.body.includes('"user.created"'))))
      await page.getByLabel('Status').selectOption('delivered')
      await page.getByRole('button', { name: 'Apply' }).click()
      await page.waitForURL(/status=delivered/)
      await waitFor('the delivery to show as delivered', async () => {
        await page.reload()
        return await page.getByRole('region', { name: 'Deliveries' }).locator('tbody tr').count() === 1
      })
      await check('webhook-delivered')

      // Disabling asks first; deleting goes through a page that names the URL.
      await page.getByRole('button', { name: 'Disable' }).click()
      const dialog = page.getByRole('dialog')
      await dialog.waitFor()
      assert.match(await dialog.innerText(), new RegExp(`Disable the endpoint ${hookUrl.replace(/[.]/g, '\\.')}\\?`))
      await dialog.getByRole('button', { name: 'Disable' }).click()
      await page.waitForURL(/done=webhook-disabled/)
      await page.getByRole('link', { name: 'Delete…' }).click()
      assert.equal(await page.getByRole('heading', { level: 1 }).innerText(), `Delete the endpoint ${hookUrl}?`)
      await check('webhook-delete')
      await page.getByRole('button', { name: 'Delete this endpoint' }).click()
      await page.waitForURL(/done=deleted/)
      assert.equal(await page.getByRole('status').innerText(), `Deleted the endpoint ${hookUrl}.`)
      assert.deepEqual(await (await api('/webhooks')).json(), [])
    } finally {
      await browser?.close()
      await app.close()
      await receiver.close()
    }
  })
}
