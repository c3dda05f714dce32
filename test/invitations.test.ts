import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { mailedCode, mailSettings, PUBLIC_URL, smtpForThisFile } from './mail-flows.ts'
import { listen, runCli } from './cli-helpers.ts'

const smtp = await smtpForThisFile()

interface Invited { id: string, username: string, email: string | null, invitation_pending: boolean, invitation?: { mailed: boolean, expires_at: string, url?: string, code?: string } }

async function invite (t: TestApp, fields: Record<string, unknown> = {}): Promise<Invited> {
  const username = uniqueName('inv')
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, email: `${username}@example.test`, invite: true, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

/** The token of an invitation link, and the path under the app that the link opens. */
function linkParts (url: string): { token: string, path: string } {
  const parsed = new URL(url)
  return { token: parsed.searchParams.get('token')!, path: `/auth${parsed.pathname.slice('/auth'.length)}${parsed.search}` }
}

async function accept (t: TestApp, body: Record<string, unknown>) {
  return await t.app.inject({ method: 'POST', url: '/auth/api/invitations/accept', payload: body })
}

async function login (t: TestApp, username: string, password: string) {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password } })
}

for (const dialect of dialects()) {
  describe(`invitations without SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, { publicUrl: PUBLIC_URL })

    it('creates a pending user and gives the admin the link and code, built from PUBLIC_URL', async () => {
      const user = await invite(t)
      assert.equal(user.invitation_pending, true)
      assert.equal(user.invitation?.mailed, false)
      assert.match(user.invitation!.url!, /^https:\/\/pipelines\.example\.test\/auth\/invitation\?token=ght_[0-9A-Za-z]{43}$/)
      assert.match(user.invitation!.code!, /^[A-Z0-9]{4}-[A-Z0-9]{4}$/)
      const read = await t.app.inject({ method: 'GET', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
      assert.equal(read.json().invitation_pending, true)
      assert.equal(read.json().invitation, undefined, 'the link is shown once, at creation')
      const events = (await t.app.inject({ method: 'GET', url: `/auth/api/events?target_id=${user.id}&type=user.invited`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, 1)
      assert.doesNotMatch(JSON.stringify(events), /ght_/, 'the event holds no token')
    })

    it('refuses invite together with a password', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), invite: true, password: GOOD_PASSWORD } })
      assert.equal(res.statusCode, 422)
    })

    it('a GET and a HEAD of the link show the page and use nothing; accepting sets the password and signs in, once', async () => {
      const user = await invite(t)
      const { token, path } = linkParts(user.invitation!.url!)
      for (const method of ['HEAD', 'GET', 'GET'] as const) {
        const page = await t.app.inject({ method, url: path })
        assert.equal(page.statusCode, 200)
        assert.equal(page.headers['referrer-policy'], 'no-referrer')
        if (method === 'GET') assert.match(page.body, new RegExp(`<strong id="username">${user.username}</strong>`))
      }
      assert.equal((await login(t, user.username, GOOD_PASSWORD)).statusCode, 401, 'a pending user has no password to sign in with')
      const accepted = await accept(t, { token, password: GOOD_PASSWORD })
      assert.equal(accepted.statusCode, 200, accepted.body)
      assert.equal(accepted.json().user.invitation_pending, false)
      assert.match(accepted.json().token, /^gatehouse_session_/)
      const me = await t.app.inject({ method: 'GET', url: '/auth/api/me', headers: { authorization: `Bearer ${accepted.json().token}` } })
      assert.equal(me.json().username, user.username)
      assert.equal((await login(t, user.username, GOOD_PASSWORD)).statusCode, 200)
      const twice = await accept(t, { token, password: `${GOOD_PASSWORD} again` })
      assert.equal(twice.statusCode, 400)
      assert.equal(twice.json().code, 'token_invalid')
      const gone = await t.app.inject({ method: 'GET', url: path })
      assert.equal(gone.statusCode, 400, 'the used link\'s page says it does not work')
      const events = (await t.app.inject({ method: 'GET', url: `/auth/api/events?target_id=${user.id}&type=user.invitation_accepted`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, 1)
    })

    it('applies the password rules before using the invitation', async () => {
      const user = await invite(t)
      const { token } = linkParts(user.invitation!.url!)
      const weak = await accept(t, { token, password: 'short' })
      assert.equal(weak.statusCode, 422)
      assert.equal((await accept(t, { token, password: GOOD_PASSWORD })).statusCode, 200, 'the refused attempt did not use the token')
    })

    it('resending ends the earlier link and code; revoking ends the current one and keeps the user pending', async () => {
      const user = await invite(t)
      const first = linkParts(user.invitation!.url!)
      const resent = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/invitation`, headers: auth(t.adminKey) })
      assert.equal(resent.statusCode, 200, resent.body)
      assert.equal(resent.json().mailed, false)
      const second = linkParts(resent.json().url)
      assert.notEqual(second.token, first.token)
      assert.equal((await accept(t, { token: first.token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      assert.equal((await accept(t, { login: user.username, code: user.invitation!.code!, password: GOOD_PASSWORD })).json().code, 'token_invalid', 'the earlier code ended too')
      const revoked = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}/invitation`, headers: auth(t.adminKey) })
      assert.equal(revoked.statusCode, 204)
      assert.equal((await accept(t, { token: second.token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      const read = await t.app.inject({ method: 'GET', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })
      assert.equal(read.json().invitation_pending, true)
      const third = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/invitation`, headers: auth(t.adminKey) })
      assert.equal((await accept(t, { token: linkParts(third.json().url).token, password: GOOD_PASSWORD })).statusCode, 200)
      const notPending = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/invitation`, headers: auth(t.adminKey) })
      assert.equal(notPending.statusCode, 409)
      assert.equal(notPending.json().code, 'invitation_not_pending')
    })

    it('refuses an expired invitation, and a token of another purpose', async () => {
      const user = await invite(t)
      const { token } = linkParts(user.invitation!.url!)
      const reset = await t.app.inject({ method: 'POST', url: '/auth/api/password-resets/complete', payload: { token, new_password: GOOD_PASSWORD } })
      assert.equal(reset.statusCode, 400, 'an invitation token does not reset a password')
      const confirm = await t.app.inject({ method: 'POST', url: '/auth/api/email-verifications/confirm', payload: { token } })
      assert.equal(confirm.statusCode, 400, 'nor confirm an address')
      await t.app.db.updateTable('account_tokens').set({ expires_at: new Date(Date.now() - 1000).toISOString() }).where('user_id', '=', user.id).execute()
      assert.equal((await accept(t, { token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      assert.equal((await t.app.inject({ method: 'GET', url: linkParts(user.invitation!.url!).path })).statusCode, 400)
    })

    it('accepts the username and code instead of the link; five wrong codes end the invitation', async () => {
      const byCode = await invite(t)
      const lower = byCode.invitation!.code!.toLowerCase().replace('-', ' ')
      const ok = await accept(t, { login: byCode.username.toUpperCase(), code: lower, password: GOOD_PASSWORD })
      assert.equal(ok.statusCode, 200, ok.body)

      const guessed = await invite(t)
      const right = guessed.invitation!.code!
      const wrong = right.startsWith('A') ? 'BBBB-BBBB' : 'AAAA-AAAA'
      for (let i = 0; i < 5; i++) {
        const res = await accept(t, { login: guessed.username, code: wrong, password: GOOD_PASSWORD })
        assert.equal(res.json().code, 'token_invalid')
      }
      const late = await accept(t, { login: guessed.username, code: right, password: GOOD_PASSWORD })
      assert.equal(late.json().code, 'token_invalid', 'the right code no longer works after five wrong ones')
      assert.equal((await accept(t, { token: linkParts(guessed.invitation!.url!).token, password: GOOD_PASSWORD })).json().code, 'token_invalid', 'nor does the link')
    })

    it('stores the code only as an argon2id hash, and still takes a code stored as a SHA-256 digest before', async () => {
      const hashed = await invite(t)
      const row = await t.app.db.selectFrom('account_tokens').select(['id', 'code_digest']).where('user_id', '=', hashed.id).executeTakeFirstOrThrow()
      assert.match(row.code_digest, /^\$argon2id\$v=19\$m=\d+,t=\d+,p=\d+\$/)
      const ok = await accept(t, { login: hashed.username, code: hashed.invitation!.code!, password: GOOD_PASSWORD })
      assert.equal(ok.statusCode, 200, ok.body)

      // A token as earlier builds stored it: the SHA-256 of `<token id>:<code>`, hex.
      const legacy = await invite(t)
      const token = await t.app.db.selectFrom('account_tokens').select('id').where('user_id', '=', legacy.id).executeTakeFirstOrThrow()
      const code = legacy.invitation!.code!
      await t.app.db.updateTable('account_tokens').set({ code_digest: createHash('sha256').update(`${token.id}:${code.replace('-', '')}`).digest('hex') }).where('id', '=', token.id).execute()
      const wrong = code.startsWith('A') ? 'BBBB-BBBB' : 'AAAA-AAAA'
      assert.equal((await accept(t, { login: legacy.username, code: wrong, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      const old = await accept(t, { login: legacy.username, code, password: GOOD_PASSWORD })
      assert.equal(old.statusCode, 200, old.body)
    })

    it('a retry with the same Idempotency-Key gets the user and invitation without the link, which is stored nowhere', async () => {
      const username = uniqueName('idem')
      const send = async () => await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: { ...auth(t.adminKey), 'idempotency-key': `invite-${username}` }, payload: { username, invite: true } })
      const first = await send()
      assert.equal(first.statusCode, 201, first.body)
      const { token } = linkParts(first.json().invitation.url)
      const retry = await send()
      assert.equal(retry.statusCode, 201)
      assert.equal(retry.headers['idempotent-replayed'], 'true')
      assert.equal(retry.json().id, first.json().id)
      assert.deepEqual(retry.json().invitation, { delivery: 'not_sent', mailed: false, expires_at: first.json().invitation.expires_at })
      const stored = await t.app.db.selectFrom('idempotency_keys').select('response_body').where('key', '=', `invite-${username}`).executeTakeFirstOrThrow()
      assert.ok(!Buffer.from(stored.response_body!).toString('utf8').includes(token), 'the token is not in the stored answer')
      assert.equal((await accept(t, { token, password: GOOD_PASSWORD })).statusCode, 200, 'the link handed out first still works')
    })

    it('an admin setting a password ends the invitation; an import cannot invite', async () => {
      const user = await invite(t)
      const set = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ password: GOOD_PASSWORD }) })
      assert.equal(set.statusCode, 200, set.body)
      assert.equal(set.json().invitation_pending, false)
      assert.equal((await accept(t, { token: linkParts(user.invitation!.url!).token, password: `${GOOD_PASSWORD} 2` })).json().code, 'token_invalid')
      assert.equal((await login(t, user.username, GOOD_PASSWORD)).statusCode, 200)
      const imported = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users: [{ username: uniqueName(), invite: true }] } })
      assert.equal(imported.statusCode, 422)
    })

    it('invites an existing user who has no password yet', async () => {
      const username = uniqueName()
      const created = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username } })).json()
      assert.equal(created.invitation_pending, false)
      const res = await t.app.inject({ method: 'POST', url: `/auth/api/users/${created.id}/invitation`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal((await t.app.inject({ method: 'GET', url: `/auth/api/users/${created.id}`, headers: auth(t.adminKey) })).json().invitation_pending, true)
      const withPassword = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD } })).json()
      assert.equal((await t.app.inject({ method: 'POST', url: `/auth/api/users/${withPassword.id}/invitation`, headers: auth(t.adminKey) })).statusCode, 409)
    })
  })

  describe(`invitations in the console without SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, { publicUrl: PUBLIC_URL })
    const consolePost = async (cookie: string, url: string, fields: Record<string, string>) =>
      await t.app.inject({ method: 'POST', url, headers: { cookie, origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: new URLSearchParams(fields).toString() })

    it('"Invite user" shows the link once with a copy button; Resend ends it and shows a new one; Revoke ends that', async () => {
      const adminName = uniqueName('admin')
      await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: adminName, password: GOOD_PASSWORD, role: 'admin' } })
      const cookie = `gatehouse_session=${(await login(t, adminName, GOOD_PASSWORD)).json().token}`
      const username = uniqueName('cons')
      const created = await consolePost(cookie, '/auth/admin/users', { username, email: `${username}@example.test`, role: 'user', invite: 'true' })
      assert.equal(created.statusCode, 201, created.body)
      const linkOf = (html: string): string => /<code id="invitation-link">([^<]+)<\/code>/.exec(html)![1]!.replace(/&#38;/g, '&')
      const first = linkOf(created.body)
      assert.ok(first.startsWith(`${PUBLIC_URL}/invitation?token=ght_`), first)
      assert.match(created.body, /data-copy="invitation-link"/)
      assert.match(created.body, /Invitation pending/)
      const id = /<code id="user-id">([^<]+)<\/code>/.exec(created.body)![1]!
      const page = await t.app.inject({ url: `/auth/admin/users/${id}`, headers: { cookie } })
      assert.doesNotMatch(page.body, /invitation-link/, 'the link is not shown again')
      const resent = await consolePost(cookie, `/auth/admin/users/${id}/invitation`, {})
      assert.equal(resent.statusCode, 200, resent.body)
      const second = linkOf(resent.body)
      assert.notEqual(second, first)
      assert.equal((await accept(t, { token: linkParts(first).token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      const revoked = await consolePost(cookie, `/auth/admin/users/${id}/invitation/revoke`, {})
      assert.equal(revoked.statusCode, 303)
      assert.equal((await accept(t, { token: linkParts(second).token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
    })
  })

  describe(`invitation tokens in the log (${dialect.name})`, () => {
    const lines: string[] = []
    const t = useTestApp(dialect, { publicUrl: PUBLIC_URL }, { write: (line: string) => { lines.push(line) } })

    it('the request log redacts the token of a link, and holds neither token nor code anywhere', async () => {
      const user = await invite(t)
      const { token, path } = linkParts(user.invitation!.url!)
      await t.app.inject({ method: 'GET', url: path })
      await t.app.inject({ method: 'POST', url: '/auth/invitation', headers: { origin: 'http://localhost:80', 'content-type': 'application/x-www-form-urlencoded' }, payload: `token=${token}&password=x&confirm=y` })
      await accept(t, { token, password: GOOD_PASSWORD })
      await accept(t, { token, password: GOOD_PASSWORD })
      const log = lines.join('')
      assert.match(log, /\/auth\/invitation\?token=\[redacted\]/)
      assert.ok(!log.includes(token), 'the token is never logged')
      assert.ok(!log.includes(user.invitation!.code!), 'nor the code')
    })
  })

  describe(`gatehouse users invite without SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, { publicUrl: PUBLIC_URL })

    it('prints the link and code to hand over; --resend prints a new one and ends the first; --revoke ends that', async () => {
      const env = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
      const username = uniqueName('cli')
      const invited = await runCli(['users', 'invite', username, '--email', `${username}@example.test`], { env })
      assert.equal(invited.code, 0, invited.stderr)
      assert.match(invited.stdout, new RegExp(`^Invited ${username} \\(`, 'm'))
      const first = /^(https:\/\/\S+)$/m.exec(invited.stdout)![1]!
      assert.ok(first.startsWith(`${PUBLIC_URL}/invitation?token=ght_`), invited.stdout)
      assert.match(invited.stdout, /the code [A-Z0-9]{4}-[A-Z0-9]{4} at the invitation page/)
      const resent = await runCli(['users', 'invite', username, '--resend', '--json'], { env })
      assert.equal(resent.code, 0, resent.stderr)
      const second = JSON.parse(resent.stdout).invitation.url as string
      assert.notEqual(second, first)
      assert.equal((await accept(t, { token: linkParts(first).token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
      const revoked = await runCli(['users', 'invite', username, '--revoke'], { env })
      assert.equal(revoked.code, 0, revoked.stderr)
      assert.equal((await accept(t, { token: linkParts(second).token, password: GOOD_PASSWORD })).json().code, 'token_invalid')
    })
  })

  describe(`typed codes from one address (${dialect.name})`, () => {
    const t = useTestApp(dialect, { loginMaxFailuresPerAddress: 3 })

    it('are throttled across accounts: past the address budget even a right code gets 429', async () => {
      const users = [await invite(t), await invite(t), await invite(t), await invite(t)]
      for (const user of users.slice(0, 3)) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/invitations/accept', payload: { login: user.username, code: 'ZZZZ-ZZZZ', password: GOOD_PASSWORD }, remoteAddress: '192.0.2.9' })
        assert.equal(res.json().code, 'token_invalid')
      }
      const last = users[3]!
      const blocked = await t.app.inject({ method: 'POST', url: '/auth/api/invitations/accept', payload: { login: last.username, code: last.invitation!.code!, password: GOOD_PASSWORD }, remoteAddress: '192.0.2.9' })
      assert.equal(blocked.statusCode, 429)
      assert.ok(Number(blocked.headers['retry-after']) > 0)
      const elsewhere = await t.app.inject({ method: 'POST', url: '/auth/api/invitations/accept', payload: { login: last.username, code: last.invitation!.code!, password: GOOD_PASSWORD }, remoteAddress: '192.0.2.10' })
      assert.equal(elsewhere.statusCode, 200, 'another address is not held back, and the code was not spent')
    })
  })

  describe(`invitations under MFA_REQUIRED=all (${dialect.name})`, () => {
    const t = useTestApp(dialect, { mfaRequired: 'all' })

    it('accepting asks the new user to enrol a second factor before the session', async () => {
      const user = await invite(t)
      const res = await accept(t, { token: linkParts(user.invitation!.url!).token, password: GOOD_PASSWORD })
      assert.equal(res.statusCode, 202, res.body)
      assert.equal(res.json().mfa_required, true)
      assert.equal(res.json().enrolment_required, true)
    })
  })

  describe(`invitations over SMTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, mailSettings(smtp))

    it('mails the link and code to the user, and the answer holds neither', async () => {
      const user = await invite(t)
      assert.equal(user.invitation?.mailed, true)
      assert.equal(user.invitation?.url, undefined)
      assert.equal(user.invitation?.code, undefined)
      const mail = await smtp.waitForMail(user.email!)
      assert.equal(mail.subject, 'Pipelines: you are invited')
      const link = mail.links.find(l => l.includes('/invitation?token='))
      assert.ok(link !== undefined, mail.text)
      assert.ok(link.startsWith(`${PUBLIC_URL}/invitation?token=ght_`))
      const code = mailedCode(mail.text)
      assert.ok(code !== undefined)
      const res = await accept(t, { login: user.email!, code, password: GOOD_PASSWORD })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().user.email_verified, true, 'accepting a mailed invitation proves the address')
      const events = await t.app.db.selectFrom('events').select('data').where('type', '=', 'user.updated').where('target_id', '=', user.id).execute()
      assert.equal(events.length, 1)
      const data = events[0]!.data
      assert.equal((typeof data === 'string' ? JSON.parse(data) : data).notices, false, 'the first password sends no "password changed" notice')
      const queued = await t.app.db.selectFrom('mail_outbox').select('template').where('user_id', '=', user.id).execute()
      assert.deepEqual(queued.map(m => m.template), ['invitation'], 'only the invitation was queued')
    })
  })
}
