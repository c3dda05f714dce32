import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { mailedCode, mailSettings, PUBLIC_URL, smtpForThisFile } from './mail-flows.ts'
import { waitFor } from './polling.ts'
import { listen, runCli } from './cli-helpers.ts'

const smtp = await smtpForThisFile()
const NEW_PASSWORD = 'a brand new passphrase for this'

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string, email: string }> {
  const username = uniqueName('rst')
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function requestReset (t: TestApp, body: Record<string, unknown>, ip = '203.0.113.7') {
  return await t.app.inject({ method: 'POST', url: '/auth/api/password-resets', payload: body, remoteAddress: ip })
}

/** The outcome the background look-up recorded for a reset request, polled for. */
async function outcomeOf (t: TestApp, requestId: string): Promise<string> {
  let outcome: string | undefined
  await waitFor(`the outcome of reset request ${requestId}`, async () => {
    const row = await t.app.db.selectFrom('events').select('data').where('type', '=', 'user.password_reset_requested').where('request_id', '=', requestId).executeTakeFirst()
    if (row === undefined) return false
    outcome = (typeof row.data === 'string' ? JSON.parse(row.data) : row.data).outcome
    return true
  }, 10_000)
  return outcome!
}

async function pendingMail (t: TestApp): Promise<number> {
  return (await t.app.db.selectFrom('mail_outbox').select('id').where('status', '=', 'pending').execute()).length
}

function tokenOf (link: string): string {
  return new URL(link).searchParams.get('token')!
}

async function resetMail (email: string, count = 1): Promise<{ link: string, code: string, text: string }> {
  const mail = await smtp.waitForMail(email, { count, subject: /reset your password/ })
  const link = mail.links.find(l => l.includes('/reset-password?token='))!
  return { link, code: mailedCode(mail.text)!, text: mail.text }
}

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

for (const dialect of dialects()) {
  describe(`password reset over SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(smtp))

    it('mails a link that a GET or HEAD does not use; completing sets the password, ends every session and notifies the owner', async () => {
      const user = await createUser(t)
      const session = (await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })).json().token
      const res = await requestReset(t, { email: user.email.toUpperCase() })
      assert.equal(res.statusCode, 202)
      assert.equal(await outcomeOf(t, res.headers['x-request-id'] as string), 'mailed')
      const { link, text } = await resetMail(user.email)
      assert.ok(link.startsWith(`${PUBLIC_URL}/reset-password?token=ght_`), link)
      assert.match(text, /until \d{1,2} [A-Z][a-z]+ \d{4}, \d{2}:\d{2} UTC/)
      const path = `/auth/reset-password?token=${tokenOf(link)}`
      for (const method of ['HEAD', 'GET'] as const) {
        const page = await t.app.inject({ method, url: path })
        assert.equal(page.statusCode, 200)
        assert.equal(page.headers['referrer-policy'], 'no-referrer')
      }
      const done = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(link), new_password: NEW_PASSWORD } })
      assert.equal(done.statusCode, 204, done.body)
      assert.equal((await t.app.inject({ method: 'GET', url: '/auth/api/me', headers: { authorization: `Bearer ${session}` } })).statusCode, 401, 'the earlier session ended')
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })).statusCode, 401)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: NEW_PASSWORD } })).statusCode, 200)
      const twice = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(link), new_password: `${NEW_PASSWORD} 2` } })
      assert.equal(twice.statusCode, 400)
      assert.equal(twice.json().code, 'token_invalid')
      const notice = await smtp.waitForMail(user.email, { subject: /password was changed/ })
      assert.match(notice.text, new RegExp(user.username))
    })

    it('a second request ends the first link; the username and code work instead of the link', async () => {
      const user = await createUser(t)
      await outcomeOf(t, (await requestReset(t, { username: user.username })).headers['x-request-id'] as string)
      const first = await resetMail(user.email)
      await outcomeOf(t, (await requestReset(t, { username: user.username })).headers['x-request-id'] as string)
      const second = await resetMail(user.email, 2)
      const old = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(first.link), new_password: NEW_PASSWORD } })
      assert.equal(old.json().code, 'token_invalid')
      const byOldCode = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { login: user.username, code: first.code, new_password: NEW_PASSWORD } })
      assert.equal(byOldCode.json().code, 'token_invalid')
      const byCode = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { login: user.email, code: second.code, new_password: NEW_PASSWORD } })
      assert.equal(byCode.statusCode, 204, byCode.body)
    })

    it('refuses an expired link and an invitation-purpose use of a reset token', async () => {
      const user = await createUser(t)
      await outcomeOf(t, (await requestReset(t, { email: user.email })).headers['x-request-id'] as string)
      const { link } = await resetMail(user.email)
      const asInvitation = await t.app.inject({ method: 'POST', url: '/auth/api/invitations/accept', payload: { token: tokenOf(link), password: NEW_PASSWORD } })
      assert.equal(asInvitation.json().code, 'token_invalid')
      await t.app.db.updateTable('account_tokens').set({ expires_at: new Date(Date.now() - 1000).toISOString() }).where('user_id', '=', user.id).execute()
      const late = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(link), new_password: NEW_PASSWORD } })
      assert.equal(late.json().code, 'token_invalid')
    })

    it('writes the link\'s expiry in the mail in words, and an expired link\'s page says when it expired and how to get a new one', async () => {
      const user = await createUser(t)
      await outcomeOf(t, (await requestReset(t, { email: user.email })).headers['x-request-id'] as string)
      const { link, text } = await resetMail(user.email)
      const row = await t.app.db.selectFrom('account_tokens').select('expires_at').where('user_id', '=', user.id).where('used_at', 'is', null).executeTakeFirstOrThrow()
      const expiresAt = new Date(row.expires_at)
      const months = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December']
      const inWords = `${expiresAt.getUTCDate()} ${months[expiresAt.getUTCMonth()]} ${expiresAt.getUTCFullYear()}, ${String(expiresAt.getUTCHours()).padStart(2, '0')}:${String(expiresAt.getUTCMinutes()).padStart(2, '0')} UTC`
      assert.ok(text.replace(/\s+/g, ' ').includes(`until ${inWords}.`), text)
      assert.doesNotMatch(text, /\d{4}-\d{2}-\d{2}T/)
      const path = `/auth/reset-password?token=${tokenOf(link)}`
      const live = await t.app.inject({ url: path })
      assert.equal(live.statusCode, 200)

      const past = new Date(Date.now() - 90_000)
      await t.app.db.updateTable('account_tokens').set({ expires_at: past.toISOString() }).where('user_id', '=', user.id).execute()
      const expired = await t.app.inject({ url: path })
      assert.equal(expired.statusCode, 400)
      assert.match(expired.body, /This link expired on \d{1,2} [A-Z][a-z]+ \d{4}, \d{2}:\d{2} UTC\. Ask for a new one/)
      assert.match(expired.body, /href="\/auth\/forgot-password"/)
      const posted = await t.app.inject({ method: 'POST', url: '/auth/reset-password', headers: { origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: new URLSearchParams({ token: tokenOf(link), password: NEW_PASSWORD, confirm: NEW_PASSWORD }).toString() })
      assert.equal(posted.statusCode, 400, posted.body)
      assert.match(posted.body, /This link expired on /)
    })

    it('keeps one message for a used link, saying nothing of expiry', async () => {
      const user = await createUser(t)
      await outcomeOf(t, (await requestReset(t, { email: user.email })).headers['x-request-id'] as string)
      const { link } = await resetMail(user.email)
      const done = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(link), new_password: NEW_PASSWORD } })
      assert.equal(done.statusCode, 204, done.body)
      const used = await t.app.inject({ url: `/auth/reset-password?token=${tokenOf(link)}` })
      assert.equal(used.statusCode, 400)
      assert.match(used.body, /This link does not work: it was used, replaced by a newer one, or has expired\./)
    })

    it('answers unknown, disabled and single-sign-on-only accounts alike, and mails none of them', async () => {
      const disabled = await createUser(t, { disabled: true })
      const ssoOnly = await createUser(t, { password_sign_in: false })
      const cases: Array<[Record<string, string>, string]> = [
        [{ email: `nobody_${uniqueName()}@example.test` }, 'no_account'],
        [{ username: disabled.username }, 'disabled'],
        [{ email: ssoOnly.email }, 'password_sign_in_off']
      ]
      for (const [body, outcome] of cases) {
        const res = await requestReset(t, body)
        assert.equal(res.statusCode, 202)
        assert.equal(await outcomeOf(t, res.headers['x-request-id'] as string), outcome)
      }
      assert.equal(smtp.mailTo(disabled.email).length, 0)
      assert.equal(smtp.mailTo(ssoOnly.email).length, 0)
    })

    it('writes every request as one sealed outbox row, the same for a known and an unknown name, and leaves none behind a name that gets no mail', async () => {
      const queueOnly = await createTestApp(dialect, { ...mailSettings(smtp), mailDelivery: false })
      try {
        const user = await createUser(queueOnly)
        const unknown = `nobody_${uniqueName()}@example.test`
        for (const body of [{ email: user.email }, { email: unknown }]) assert.equal((await requestReset(queueOnly, body)).statusCode, 202)
        const rows = await queueOnly.app.db.selectFrom('mail_outbox').select(['template', 'user_id', 'status', 'attempts', 'payload']).execute()
        assert.deepEqual(rows.map(r => [r.template, r.user_id, r.status, r.attempts]), [['password_reset_request', null, 'pending', 0], ['password_reset_request', null, 'pending', 0]])
        for (const row of rows) assert.ok(!row.payload!.includes(user.username) && !row.payload!.includes('nobody_'), 'the name typed is sealed')
        assert.equal((await queueOnly.app.db.selectFrom('events').select('id').where('type', '=', 'user.password_reset_requested').execute()).length, 0, 'nothing is decided before a worker resolves it')
      } finally {
        await queueOnly.app.close()
      }
      const res = await requestReset(t, { username: uniqueName('ghost') })
      assert.equal(await outcomeOf(t, res.headers['x-request-id'] as string), 'no_account')
      const requests = await t.app.db.selectFrom('mail_outbox').select('id').where('template', '=', 'password_reset_request').execute()
      assert.equal(requests.length, 0, 'a resolved request leaves no row')
    })

    it('an admin\'s reset link is mailed to the user, not returned', async () => {
      const user = await createUser(t)
      const res = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/password-reset`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200, res.body)
      assert.deepEqual(Object.keys(res.json()).sort(), ['delivery', 'expires_at', 'mailed'])
      assert.equal(res.json().delivery, 'queued')
      assert.equal(res.json().mailed, true)
      const { link } = await resetMail(user.email)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: tokenOf(link), new_password: NEW_PASSWORD } })).statusCode, 204)
    })

    it('throttles requests per name, and an account gets at most PASSWORD_RESET_MAX_PER_HOUR mails', async () => {
      const user = await createUser(t)
      for (let i = 0; i < 5; i++) assert.equal((await requestReset(t, { username: user.username }, `198.51.100.${i + 1}`)).statusCode, 202)
      const sixth = await requestReset(t, { username: user.username }, '198.51.100.99')
      assert.equal(sixth.statusCode, 429)
      assert.ok(Number(sixth.headers['retry-after']) > 0)
      const unknown = uniqueName('ghost')
      for (let i = 0; i < 5; i++) await requestReset(t, { username: unknown }, `198.51.100.${i + 1}`)
      assert.equal((await requestReset(t, { username: unknown }, '198.51.100.99')).statusCode, 429, 'an unknown name is throttled the same')
      // The same account by its address: the name budget is another, the account's is spent.
      const byEmail = await requestReset(t, { email: user.email }, '198.51.100.100')
      assert.equal(byEmail.statusCode, 202)
      assert.equal(await outcomeOf(t, byEmail.headers['x-request-id'] as string), 'throttled')
    })
  })

  describe(`password reset without SMTP, and turned off (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const off = useTestApp(dialect, { passwordSignIn: false })

    it('records that no mail could be sent, and makes no link', async () => {
      const user = await createUser(t)
      const res = await requestReset(t, { email: user.email })
      assert.equal(res.statusCode, 202)
      assert.equal(await outcomeOf(t, res.headers['x-request-id'] as string), 'mail_unavailable')
      const tokens = await t.app.db.selectFrom('account_tokens').select('id').where('user_id', '=', user.id).execute()
      assert.equal(tokens.length, 0)
    })

    it('an admin gets a reset link to hand over (API, console, CLI), and the newest one works once', async () => {
      const user = await createUser(t)
      const viaApi = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/password-reset`, headers: auth(t.adminKey) })
      assert.equal(viaApi.statusCode, 200, viaApi.body)
      assert.equal(viaApi.json().mailed, false)
      assert.match(viaApi.json().code, /^[A-Z0-9]{4}-[A-Z0-9]{4}$/)
      const first = tokenOf(viaApi.json().url)

      const env = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
      const printed = await runCli(['users', 'reset-password', user.username], { env })
      assert.equal(printed.code, 0, printed.stderr)
      const second = tokenOf(/^(http\S+reset-password\?token=\S+)$/m.exec(printed.stdout)![1]!)
      assert.notEqual(second, first)

      const adminName = uniqueName('admin')
      await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: adminName, password: GOOD_PASSWORD, role: 'admin' } })
      const cookie = `gatehouse_session=${(await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: adminName, password: GOOD_PASSWORD } })).json().token}`
      const page = await t.app.inject({ method: 'POST', url: `/auth/admin/users/${user.id}/password-reset`, headers: { cookie, origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: '' })
      assert.equal(page.statusCode, 200, page.body)
      assert.match(page.body, /data-copy="reset-link"/)
      const third = tokenOf(/<code id="reset-link">([^<]+)<\/code>/.exec(page.body)![1]!.replace(/&#38;/g, '&'))

      for (const old of [first, second]) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: old, new_password: NEW_PASSWORD } })
        assert.equal(res.json().code, 'token_invalid', 'an earlier link ended')
      }
      const done = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token: third, new_password: NEW_PASSWORD } })
      assert.equal(done.statusCode, 204, done.body)
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: NEW_PASSWORD } })).statusCode, 200)
      const sso = await createUser(t, { password_sign_in: false })
      const refused = await t.app.inject({ method: 'POST', url: `/auth/api/users/${sso.id}/password-reset`, headers: auth(t.adminKey) })
      assert.equal(refused.statusCode, 409)
    })

    it('is 403 for everyone where PASSWORD_SIGN_IN=off, and the sign-in page offers no reset', async () => {
      const res = await requestReset(off, { email: 'anyone@example.test' })
      assert.equal(res.statusCode, 403)
      assert.equal(res.json().code, 'password_sign_in_disabled')
      assert.doesNotMatch((await off.app.inject({ method: 'GET', url: '/auth/login' })).body, /Forgot password/)
      assert.match((await t.app.inject({ method: 'GET', url: '/auth/login' })).body, /href="\/auth\/forgot-password">Forgot password\?/)
    })
  })
}

describe('password reset enumeration', () => {
  const ROUNDS = 40
  // Mail is queued, resolved and sent as in production; each request's resolution and send are awaited before the next, so none runs alongside a measurement.
  const t = useTestApp(dialects()[0]!, { ...mailSettings(smtp), passwordResetMaxPerHour: 100_000 })

  it('answers a known and an unknown address with the same status, body and headers, in the same time (medians within 15%)', async () => {
    const known = await createUser(t)
    const cases: Record<string, { email: string }> = {
      known: { email: known.email },
      unknown: { email: `nobody_${uniqueName()}@example.test` }
    }
    // Per request whatever its body: its id, and the client address's general rate limit (one less each time, and
    // the seconds left in its window, which tick on between two requests). Status, body and every other header must match.
    const variable = new Set(['x-request-id', 'date', 'ratelimit-remaining', 'ratelimit-reset'])
    const answers: Record<string, { status: number, body: string, headers: Record<string, unknown> }> = {}
    const times: Record<string, number[]> = { known: [], unknown: [] }
    for (let round = 0; round < ROUNDS + 3; round++) {
      for (const [name, body] of Object.entries(cases)) {
        const started = process.hrtime.bigint()
        const res = await requestReset(t, body)
        const ms = Number(process.hrtime.bigint() - started) / 1e6
        // The look-up (and the known account's send) run after the answer: awaited (not timed) so they cannot slow the next sample.
        const outcome = await outcomeOf(t, res.headers['x-request-id'] as string)
        assert.equal(outcome, name === 'known' ? 'mailed' : 'no_account')
        await waitFor('the outbox to be empty of pending mail', async () => (await pendingMail(t)) === 0, 10_000)
        if (round >= 3) times[name]!.push(ms)
        answers[name] = { status: res.statusCode, body: res.body, headers: Object.fromEntries(Object.entries(res.headers).filter(([h]) => !variable.has(h))) }
      }
    }
    assert.equal(answers.known!.status, 202)
    assert.deepEqual(answers.known, answers.unknown)
    const medians = { known: median(times.known!), unknown: median(times.unknown!) }
    const overall = (medians.known + medians.unknown) / 2
    for (const [name, value] of Object.entries(medians)) {
      assert.ok(Math.abs(value - overall) / overall < 0.15, `${name}: median ${value.toFixed(2)} ms vs ${overall.toFixed(2)} ms (${JSON.stringify(medians)})`)
    }
  })
})
