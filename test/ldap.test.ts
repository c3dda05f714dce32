import assert from 'node:assert/strict'
import { randomBytes, randomInt } from 'node:crypto'
import { createServer, type Server, type Socket } from 'node:net'
import { after, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { ConfigError, loadConfig } from '../src/config.ts'
import type { LdapConfig } from '../src/sso/ldap.config.ts'
import { checkWithDirectory, fillFilter } from '../src/sso/ldap.service.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { directorySettings, GROUPS, PEOPLE, SEARCH_DN, slapdAvailable, startDirectory, type Directory } from './ldap-server.ts'
import { freePort } from './ports.ts'

const DIRECTORY_PASSWORD = 'directory pass phrase 42'
const ORIGIN = 'http://localhost:80'

/** Client addresses no other test uses, so budgets never meet across tests. */
function addresses (n: number): string[] {
  const net = `203.${randomInt(256)}.${randomInt(256)}`
  return Array.from({ length: n }, (_, i) => `${net}.${i + 1}`)
}

async function login (t: TestApp, username: string, password: string, from = '198.51.100.7'): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password }, remoteAddress: from })
}

async function eventsOf (t: TestApp, query: string): Promise<Array<{ type: string, target: { id: string } | null, data: Record<string, unknown> }>> {
  const res = await t.app.inject({ url: `/auth/api/events?${query}&limit=1000`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function createLocalUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string, password_sign_in: boolean }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('local'), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

/** A TCP server that accepts connections and never says a word: a directory that hangs. */
async function silentServer (): Promise<{ url: string, close: () => Promise<void> }> {
  const sockets = new Set<Socket>()
  const server: Server = createServer(socket => { sockets.add(socket); socket.on('close', () => sockets.delete(socket)) })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  return {
    url: `ldaps://127.0.0.1:${port}`,
    close: async () => {
      for (const s of sockets) s.destroy()
      await new Promise<void>(resolve => server.close(() => resolve()))
    }
  }
}

if (!slapdAvailable) {
  describe('LDAP sign-in', { skip: 'slapd and ldap-utils are not installed (apt-get install slapd ldap-utils; .ci/run does)' }, () => {})
} else {
  const directory: Directory = await startDirectory()
  after(async () => { await directory.stop() })
  const adminsDn = await directory.addGroup('gatehouse-admins', [])
  const analystsDn = await directory.addGroup('analysts', [])

  // The admins' DN spelt with spaces and capitals on purpose: DNs are compared normalised.
  const settings = (overrides: Partial<LdapConfig> = {}): LdapConfig =>
    directorySettings(directory, `${adminsDn.replace('cn=', 'CN = ')} => role:admin; ${analystsDn} => analysts`, overrides)

  async function directoryUser (fields: { mail?: string } = {}): Promise<{ uid: string, dn: string }> {
    const uid = uniqueName('dir')
    const dn = await directory.addUser(uid, DIRECTORY_PASSWORD, { givenName: 'Dora', sn: 'Directory', mail: fields.mail ?? `${uid}@example.org` })
    return { uid, dn }
  }

  describe('the LDAP filter and bind', () => {
    it('escapes the typed name in the filter, so filter syntax finds nothing', async () => {
      assert.equal(await fillFilter('(uid={username})', { username: '*)(uid=*' }), '(uid=\\2a\\29\\28uid=\\2a)')
      assert.equal(await fillFilter('(member={dn})', { dn: 'uid=a\\,b,ou=people' }), '(member=uid=a\\5c,b,ou=people)')
    })

    it('never binds with an empty password (the anonymous-bind trap)', async () => {
      const { uid } = await directoryUser()
      assert.deepEqual(await checkWithDirectory(settings(), uid, ''), { kind: 'wrong_password', dn: `uid=${uid},${PEOPLE}` })
    })
  })

  for (const dialect of dialects()) {
    describe(`LDAP sign-in (${dialect.name})`, () => {
      const t = useTestApp(dialect, { ldap: settings(), loginMaxFailuresPerAccount: 3, accountLockThreshold: 4 })

      it('creates a directory user at first sign-in, links the identity and records the events; the second sign-in finds them', async () => {
        const { uid, dn } = await directoryUser()
        await directory.setMembers(analystsDn, [dn])
        await directory.setMembers(adminsDn, [])
        const first = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(first.statusCode, 200, first.body)
        const user = first.json().user
        assert.equal(user.username, uid)
        assert.equal(user.email, `${uid}@example.org`)
        assert.deepEqual([user.first_name, user.last_name, user.role, user.groups, user.password_changed_at, user.password_sign_in], ['Dora', 'Directory', 'user', ['analysts'], null, true])

        const identity = await t.app.db.selectFrom('user_identities').selectAll().where('user_id', '=', user.id).execute()
        assert.deepEqual(identity.map(i => [i.provider, i.subject]), [['ldap', dn]])
        assert.notEqual(identity[0]!.last_sign_in_at, null)
        const row = await t.app.db.selectFrom('users').select('password_hash').where('id', '=', user.id).executeTakeFirstOrThrow()
        assert.equal(row.password_hash, null, 'no local password')

        const events = await eventsOf(t, `target_id=${user.id}`)
        const created = events.find(e => e.type === 'user.created')
        assert.equal(created?.data.source, 'ldap')
        assert.deepEqual(events.find(e => e.type === 'user.identity_linked')?.data, { identity_id: identity[0]!.id, provider: 'ldap', subject: dn, during: 'sign_in' })
        assert.equal(events.find(e => e.type === 'user.login_succeeded')?.data.via, 'ldap')

        const second = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(second.statusCode, 200, second.body)
        assert.equal(second.json().user.id, user.id)
        assert.equal((await eventsOf(t, `target_id=${user.id}&type=user.created`)).length, 1)
        // The session works like any other.
        const me = await t.app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${second.json().token}` } })
        assert.equal(me.json().id, user.id)
      })

      it('lists a directory sign-in\'s session as opened by ldap', async () => {
        const { uid } = await directoryUser()
        const res = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(res.statusCode, 200, res.body)
        const listed = await t.app.inject({ url: '/auth/api/me/sessions', headers: { authorization: `Bearer ${res.json().token}` } })
        assert.equal(listed.statusCode, 200, listed.body)
        assert.deepEqual(listed.json().map((s: { method: string, provider: string | null, current: boolean }) => [s.method, s.provider, s.current]), [['ldap', null, true]])
      })

      it('answers a wrong directory password like an unknown user, and counts it toward the budgets and the lock', async () => {
        const { uid } = await directoryUser()
        const [home, stranger1, stranger2, stranger3] = addresses(4)
        assert.equal((await login(t, uid, DIRECTORY_PASSWORD, home)).statusCode, 200)
        const userId = (await t.app.db.selectFrom('users').select('id').where('username_key', '=', uid.toLowerCase()).executeTakeFirstOrThrow()).id

        const wrong = await login(t, uid, 'not the directory password', stranger1)
        const unknown = await login(t, uniqueName('nobody'), 'not the directory password', stranger1)
        assert.equal(wrong.statusCode, 401)
        assert.equal(unknown.statusCode, 401)
        assert.deepEqual([wrong.json().code, wrong.json().detail], [unknown.json().code, unknown.json().detail])
        assert.equal((await login(t, uid, 'wrong again', stranger1)).statusCode, 401)
        assert.equal((await login(t, uid, 'and again', stranger1)).statusCode, 401)
        // The account's budget from this address (3) is spent: not even the right password is tried.
        const throttled = await login(t, uid, DIRECTORY_PASSWORD, stranger1)
        assert.equal(throttled.statusCode, 429)
        assert.ok(throttled.headers['retry-after'])

        // The fourth failure locks the account (ACCOUNT_LOCK_THRESHOLD=4) ...
        assert.equal((await login(t, uid, 'a fourth guess', stranger2)).statusCode, 401)
        const events = await eventsOf(t, `target_id=${userId}`)
        assert.equal(events.filter(e => e.type === 'user.login_failed' && e.data.reason === 'wrong_password' && e.data.via === 'ldap').length, 4)
        assert.equal(events.filter(e => e.type === 'user.locked').length, 1)
        // ... shutting out strangers even with the right password, but not the owner's known address.
        assert.equal((await login(t, uid, DIRECTORY_PASSWORD, stranger3)).statusCode, 401)
        assert.equal((await eventsOf(t, `target_id=${userId}&type=user.login_failed`)).some(e => e.data.reason === 'locked'), true)
        assert.equal((await login(t, uid, DIRECTORY_PASSWORD, home)).statusCode, 200)
      })

      it('refuses filter syntax in the username: no entry is found and nobody is signed in', async () => {
        const { uid } = await directoryUser()
        for (const typed of ['*)(uid=*', '*', `${uid.slice(0, -3)}*`, `${uid})(|(uid=*`]) {
          const res = await login(t, typed, DIRECTORY_PASSWORD, addresses(1)[0])
          assert.equal(res.statusCode, 401, `${typed}: ${res.body}`)
        }
        const failed = await eventsOf(t, 'type=user.login_failed')
        const injected = failed.filter(e => String(e.data.identifier).includes('*'))
        assert.ok(injected.length >= 4)
        // Escaped, each is a name no entry has; unescaped, they would have matched one entry or many.
        for (const e of injected) assert.equal(e.data.reason, 'unknown_user', JSON.stringify(e))
        assert.equal((await t.app.db.selectFrom('users').select('id').where('username_key', '=', uid.toLowerCase()).execute()).length, 0)
      })

      it('maps directory groups to the role and groups at each sign-in, recording the change', async () => {
        const { uid, dn } = await directoryUser()
        await directory.setMembers(adminsDn, [dn])
        await directory.setMembers(analystsDn, [dn])
        const first = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(first.statusCode, 200, first.body)
        assert.deepEqual([first.json().user.role, first.json().user.groups], ['admin', ['analysts']])
        const userId = first.json().user.id
        // Another enabled admin, so that this one is not the last.
        await createLocalUser(t, { role: 'admin' })

        await directory.setMembers(adminsDn, [])
        await directory.setMembers(analystsDn, [])
        const second = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(second.statusCode, 200, second.body)
        assert.deepEqual([second.json().user.role, second.json().user.groups], ['user', []])
        const updated = await eventsOf(t, `target_id=${userId}&type=user.updated`)
        assert.equal(updated.length, 1)
        assert.deepEqual(updated[0]!.data, { source: 'ldap', changes: { role: { from: 'admin', to: 'user' }, groups: { from: ['analysts'], to: [] } } })

        // Unchanged groups change nothing and record nothing.
        assert.equal((await login(t, uid, DIRECTORY_PASSWORD)).statusCode, 200)
        assert.equal((await eventsOf(t, `target_id=${userId}&type=user.updated`)).length, 1)
      })

      it('never demotes the last enabled admin: the sign-in goes ahead and the event says the role was kept', async () => {
        const { uid, dn } = await directoryUser()
        await directory.setMembers(adminsDn, [dn])
        const first = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(first.statusCode, 200, first.body)
        const userId = first.json().user.id
        // Every other admin user is disabled, so this one is the last.
        const others = await t.app.db.selectFrom('users').select('id').where('role', '=', 'admin').where('id', '!=', userId).execute()
        await t.app.db.updateTable('users').set({ disabled: true }).where('id', 'in', others.length > 0 ? others.map(o => o.id) : ['']).execute()
        try {
          await directory.setMembers(adminsDn, [])
          const second = await login(t, uid, DIRECTORY_PASSWORD)
          assert.equal(second.statusCode, 200, second.body)
          assert.equal(second.json().user.role, 'admin')
          // Nothing about the user changed, so no user.updated (as the API records none); the sign-in says why.
          const updated = await eventsOf(t, `target_id=${userId}&type=user.updated`)
          assert.deepEqual(updated.filter(e => (e.data.changes as Record<string, unknown>).role !== undefined), [])
          const signIns = await eventsOf(t, `target_id=${userId}&type=user.login_succeeded`)
          assert.equal(signIns.at(0)?.data.role_kept, 'last_admin')
          assert.equal(signIns.at(1)?.data.role_kept, undefined)
        } finally {
          if (others.length > 0) await t.app.db.updateTable('users').set({ disabled: false }).where('id', 'in', others.map(o => o.id)).execute()
        }
      })

      it('keeps local users on their local password, even when the directory has an entry of the same name', async () => {
        const { uid } = await directoryUser()
        const local = await createLocalUser(t, { username: uid })
        assert.equal((await login(t, uid, GOOD_PASSWORD)).statusCode, 200)
        const viaDirectory = await login(t, uid, DIRECTORY_PASSWORD)
        assert.equal(viaDirectory.statusCode, 401, 'the directory entry does not take over the local account')
        const failed = await eventsOf(t, `target_id=${local.id}&type=user.login_failed`)
        assert.equal(failed[0]!.data.via, undefined)
        assert.equal((await t.app.db.selectFrom('user_identities').select('id').where('user_id', '=', local.id).execute()).length, 0)
      })

      it('refuses password sign-in for a user whose password_sign_in is false, saying so only to the right password', async () => {
        const local = await createLocalUser(t, { password_sign_in: false })
        assert.equal(local.password_sign_in, false)
        const [from] = addresses(1)
        const wrong = await login(t, local.username, 'not the password', from)
        assert.equal(wrong.statusCode, 401)
        const right = await login(t, local.username, GOOD_PASSWORD, from)
        assert.equal(right.statusCode, 403, right.body)
        assert.equal(right.json().code, 'password_sign_in_disabled')
        assert.match(right.headers['content-type'] as string, /^application\/problem\+json/)
        assert.equal((await eventsOf(t, `target_id=${local.id}&type=user.login_failed`)).map(e => e.data.reason).sort().join(), 'password_sign_in_disabled,wrong_password')

        const listed = await t.app.inject({ url: `/auth/api/users?username=${local.username}`, headers: auth(t.adminKey) })
        assert.equal(listed.json()[0].password_sign_in, false)
        const patched = await t.app.inject({
          method: 'PATCH', url: `/auth/api/users/${local.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: { password_sign_in: true }
        })
        assert.equal(patched.statusCode, 200, patched.body)
        assert.equal(patched.json().password_sign_in, true)
        assert.deepEqual((await eventsOf(t, `target_id=${local.id}&type=user.updated`))[0]!.data.changes, { password_sign_in: { from: false, to: true } })
        assert.equal((await login(t, local.username, GOOD_PASSWORD, from)).statusCode, 200)
      })

      it('lets only an admin change password_sign_in: a user cannot turn it back on for themselves', async () => {
        const local = await createLocalUser(t)
        const token = (await login(t, local.username, GOOD_PASSWORD)).json().token
        const res = await t.app.inject({
          method: 'PATCH', url: `/auth/api/users/${local.id}`, headers: { authorization: `Bearer ${token}`, 'content-type': 'application/merge-patch+json' }, payload: { password_sign_in: false }
        })
        assert.equal(res.statusCode, 403, res.body)
      })
    })

    describe(`LDAP sign-in, other settings (${dialect.name})`, () => {
      it('signs in over StartTLS with the CA trusted, and refuses (503) a directory whose certificate is not trusted', async () => {
        const { uid } = await directoryUser()
        const startTls = await createTestApp(dialect, { ldap: settings({ url: directory.ldapUrl, startTls: true }) })
        const untrusted = await createTestApp(dialect, { ldap: settings({ ca: undefined }) })
        const untrustedStartTls = await createTestApp(dialect, { ldap: settings({ url: directory.ldapUrl, startTls: true, ca: undefined }) })
        try {
          assert.equal((await login(startTls, uid, DIRECTORY_PASSWORD)).statusCode, 200)
          for (const app of [untrusted, untrustedStartTls]) {
            const res = await login(app, uid, DIRECTORY_PASSWORD)
            assert.equal(res.statusCode, 503, res.body)
            assert.equal(res.json().code, 'directory_unavailable')
            assert.ok(res.headers['retry-after'])
            assert.equal((await app.app.db.selectFrom('users').select('id').where('username_key', '=', uid.toLowerCase()).execute()).length, 0)
          }
        } finally {
          await Promise.all([startTls.app.close(), untrusted.app.close(), untrustedStartTls.app.close()])
        }
      })

      it('answers 503 promptly when the directory is down or never answers, and local users still sign in', async () => {
        const silent = await silentServer()
        const down = await createTestApp(dialect, { ldap: settings({ url: `ldaps://127.0.0.1:${await freePort()}` }) })
        const hanging = await createTestApp(dialect, { ldap: settings({ url: silent.url, timeoutMs: 300 }) })
        try {
          for (const app of [down, hanging]) {
            const started = Date.now()
            const res = await login(app, uniqueName('someone'), DIRECTORY_PASSWORD)
            assert.equal(res.statusCode, 503, res.body)
            assert.equal(res.json().code, 'directory_unavailable')
            assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
            assert.ok(res.headers['retry-after'])
            // Bounded by LDAP_TIMEOUT_MS (twice it at most), far below this slack for a loaded machine.
            assert.ok(Date.now() - started < 15_000, `took ${Date.now() - started} ms`)
          }
          // The sign-in page says so too, with the form kept for another try.
          const page = await down.app.inject({
            method: 'POST',
            url: '/auth/login',
            headers: { 'content-type': 'application/x-www-form-urlencoded', origin: ORIGIN },
            payload: new URLSearchParams({ username: uniqueName('someone'), password: DIRECTORY_PASSWORD }).toString()
          })
          assert.equal(page.statusCode, 503)
          assert.ok(page.headers['retry-after'])
          assert.match(page.body, /directory \(LDAP\)/)
          assert.match(page.body, /name="password"/)
          // No failure was counted for a check that did not happen.
          assert.equal((await eventsOf(down, 'type=user.login_failed')).length, 0)
          const local = await createLocalUser(down)
          assert.equal((await login(down, local.username, GOOD_PASSWORD)).statusCode, 200)
        } finally {
          await Promise.all([down.app.close(), hanging.app.close()])
          await silent.close()
        }
      })

      it('refuses a sign-in whose filter matches more than one entry, whichever password is typed', async () => {
        const { uid } = await directoryUser()
        await directoryUser()
        const wide = await createTestApp(dialect, { ldap: settings({ userFilter: '(|(uid={username})(objectClass=inetOrgPerson))' }) })
        try {
          const res = await login(wide, uid, DIRECTORY_PASSWORD)
          assert.equal(res.statusCode, 401, res.body)
          assert.deepEqual((await eventsOf(wide, 'type=user.login_failed')).map(e => [e.data.reason, e.data.via]), [['directory_ambiguous', 'ldap']])
        } finally {
          await wide.app.close()
        }
      })

      it('with LDAP_JIT=off refuses a directory user no gatehouse user is linked to', async () => {
        const { uid } = await directoryUser()
        const noJit = await createTestApp(dialect, { ldap: settings({ jit: false }) })
        try {
          const res = await login(noJit, uid, DIRECTORY_PASSWORD)
          assert.equal(res.statusCode, 401, res.body)
          assert.equal(res.json().code, 'invalid_credentials')
          const failed = await eventsOf(noJit, 'type=user.login_failed')
          assert.deepEqual(failed.map(e => [e.data.reason, e.data.via, e.target]), [['not_provisioned', 'ldap', null]])
          assert.equal((await noJit.app.db.selectFrom('users').select('id').where('username_key', '=', uid.toLowerCase()).execute()).length, 0)
        } finally {
          await noJit.app.close()
        }
      })

      it('with PASSWORD_SIGN_IN=off refuses local passwords but signs directory users in; the admin API key still works', async () => {
        const { uid } = await directoryUser()
        const off = await createTestApp(dialect, { ldap: settings(), passwordSignIn: false })
        try {
          const local = await createLocalUser(off)
          const wrong = await login(off, local.username, 'not the password')
          assert.equal(wrong.statusCode, 401)
          const right = await login(off, local.username, GOOD_PASSWORD)
          assert.equal(right.statusCode, 403)
          assert.equal(right.json().code, 'password_sign_in_disabled')
          assert.equal((await login(off, uid, DIRECTORY_PASSWORD)).statusCode, 200)
          assert.equal((await off.app.inject({ url: '/auth/api/users', headers: auth(off.adminKey) })).statusCode, 200)
          // The sign-in page keeps its form, for the directory's users.
          assert.match((await off.app.inject({ url: '/auth/login' })).body, /name="password"/)
        } finally {
          await off.app.close()
        }
      })

      it('with PASSWORD_SIGN_IN=off and no directory refuses every password alike and drops the form from /auth/login', async () => {
        const off = await createTestApp(dialect, { passwordSignIn: false })
        try {
          const local = await createLocalUser(off)
          for (const [name, password] of [[local.username, GOOD_PASSWORD], [uniqueName('nobody'), 'whatever it is']] as const) {
            const res = await login(off, name, password)
            assert.equal(res.statusCode, 403, res.body)
            assert.equal(res.json().code, 'password_sign_in_disabled')
          }
          const page = await off.app.inject({ url: '/auth/login' })
          assert.equal(page.statusCode, 200)
          assert.doesNotMatch(page.body, /name="password"/)
          assert.match(page.body, /Sign in with a passkey/)
          const posted = await off.app.inject({
            method: 'POST',
            url: '/auth/login',
            headers: { 'content-type': 'application/x-www-form-urlencoded', origin: ORIGIN },
            payload: new URLSearchParams({ username: local.username, password: GOOD_PASSWORD }).toString()
          })
          assert.equal(posted.statusCode, 403)
          assert.match(posted.body, /turned off/)
          assert.equal((await off.app.inject({ url: '/auth/api/users', headers: auth(off.adminKey) })).statusCode, 200)
        } finally {
          await off.app.close()
        }
      })

      it('gives every spelling of a name the directory treats as one (case, surrounding and repeated spaces) one failure budget, for known and unknown names', async () => {
        const { uid } = await directoryUser()
        const [home, stranger, other] = addresses(3)
        const t = await createTestApp(dialect, { ldap: settings(), loginMaxFailuresPerAccount: 3 })
        try {
          assert.equal((await login(t, uid, DIRECTORY_PASSWORD, home)).statusCode, 200)
          // The directory ignores the spaces: this spelling signs in as the same user.
          const spaced = await login(t, `  ${uid.toUpperCase()} `, DIRECTORY_PASSWORD, home)
          assert.equal(spaced.statusCode, 200, spaced.body)
          assert.equal(spaced.json().user.username, uid)

          // LOGIN_MAX_FAILURES_PER_ACCOUNT=3 from one address, whichever way the name is written.
          for (const spelling of [` ${uid}`, `${uid} `, `  ${uid}`]) assert.equal((await login(t, spelling, 'a guess', stranger)).statusCode, 401, JSON.stringify(spelling))
          for (const spelling of [uid, ` ${uid} `, `${uid.toUpperCase()}  `]) assert.equal((await login(t, spelling, 'a guess', stranger)).statusCode, 429, JSON.stringify(spelling))

          const nobody = uniqueName('nobody')
          for (const spelling of [nobody, ` ${nobody}`, `${nobody} `]) assert.equal((await login(t, spelling, 'a guess', other)).statusCode, 401, JSON.stringify(spelling))
          for (const spelling of [`  ${nobody}`, ` ${nobody.toUpperCase()} `]) assert.equal((await login(t, spelling, 'a guess', other)).statusCode, 429, JSON.stringify(spelling))
        } finally {
          await t.app.close()
        }
      })

      it('under MFA_REQUIRED=admins, a promotion by the group map at a sign-in that stops at the second step gives the user\'s password-only sessions no admin rights; the session after the second step is admin', async () => {
        const { uid, dn } = await directoryUser()
        await directory.setMembers(adminsDn, [])
        const mfa = await createTestApp(dialect, { ldap: settings(), mfaRequired: 'admins', mfaEncryptionKey: randomBytes(32) })
        try {
          const first = await login(mfa, uid, DIRECTORY_PASSWORD)
          assert.equal(first.statusCode, 200, first.body)
          const passwordOnly = first.json().token as string

          await directory.setMembers(adminsDn, [dn])
          const promoting = await login(mfa, uid, DIRECTORY_PASSWORD)
          assert.equal(promoting.statusCode, 202, promoting.body)
          const stored = await mfa.app.db.selectFrom('users').select('role').where('username_key', '=', uid.toLowerCase()).executeTakeFirstOrThrow()
          assert.equal(stored.role, 'admin', 'the group map made them an admin')

          const attempts = async (token: string): Promise<unknown[]> => {
            const headers = { authorization: `Bearer ${token}` }
            const key = await mfa.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers, payload: { name: uniqueName('k') } })
            const admin = await mfa.app.inject({ method: 'POST', url: '/auth/api/users', headers, payload: { username: uniqueName('a'), password: GOOD_PASSWORD, role: 'admin' } })
            const verify = await mfa.app.inject({ url: '/auth/api/verify', headers })
            return [key.statusCode, admin.statusCode, verify.headers['x-auth-role'], verify.headers['x-auth-mfa']]
          }
          assert.deepEqual(await attempts(passwordOnly), [403, 403, 'user', 'false'])

          const challenge = promoting.json().challenge_token as string
          const setup = await mfa.app.inject({ method: 'POST', url: '/auth/api/login/mfa/totp', payload: { challenge_token: challenge } })
          assert.equal(setup.statusCode, 200, setup.body)
          const done = await mfa.app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: challenge, totp_code: await generate({ secret: setup.json().secret }) } })
          assert.equal(done.statusCode, 200, done.body)
          assert.deepEqual(await attempts(done.json().token), [201, 201, 'admin', 'true'])
          assert.deepEqual(await attempts(passwordOnly), [403, 403, 'user', 'false'], 'the password-only session stays as it was')
        } finally {
          await mfa.app.close()
          await directory.setMembers(adminsDn, [])
        }
      })

      it('asks a directory user the group map makes an admin for a second factor (MFA_REQUIRED=admins) and finishes with it', async () => {
        const { uid, dn } = await directoryUser()
        await directory.setMembers(adminsDn, [dn])
        const mfa = await createTestApp(dialect, { ldap: settings(), mfaRequired: 'admins', mfaEncryptionKey: randomBytes(32) })
        try {
          const res = await login(mfa, uid, DIRECTORY_PASSWORD)
          assert.equal(res.statusCode, 202, res.body)
          const challenge = res.json()
          assert.equal(challenge.enrolment_required, true)
          const user = await mfa.app.db.selectFrom('users').select(['id', 'role']).where('username_key', '=', uid.toLowerCase()).executeTakeFirstOrThrow()
          assert.equal(user.role, 'admin')
          assert.equal((await eventsOf(mfa, `target_id=${user.id}&type=user.mfa_challenged`)).length, 1)

          const setup = await mfa.app.inject({ method: 'POST', url: '/auth/api/login/mfa/totp', payload: { challenge_token: challenge.challenge_token } })
          assert.equal(setup.statusCode, 200, setup.body)
          const done = await mfa.app.inject({
            method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: challenge.challenge_token, totp_code: await generate({ secret: setup.json().secret }) }
          })
          assert.equal(done.statusCode, 200, done.body)
          assert.equal(done.json().user.id, user.id)
          // From now on the directory's password alone is not enough, and a wrong one is still a plain 401.
          assert.deepEqual((await login(mfa, uid, DIRECTORY_PASSWORD)).json().methods, ['totp', 'recovery_code'])
          assert.equal((await login(mfa, uid, 'not the directory password')).statusCode, 401)
        } finally {
          await mfa.app.close()
          await directory.setMembers(adminsDn, [])
        }
      })
    })
  }

  describe('LDAP settings from the environment', () => {
    const base = { LDAP_URL: 'ldaps://ldap.example.org', LDAP_USER_BASE: PEOPLE }

    it('reads LDAP_* into the LDAP settings, with TLS verification on and JIT on by default', () => {
      const config = loadConfig({ ...base, LDAP_BIND_DN: SEARCH_DN, LDAP_BIND_PASSWORD: 'x', LDAP_GROUP_MAP: `cn=Admins, ${GROUPS} => role:admin;cn=ops,${GROUPS}=>ops`, LDAP_TIMEOUT_MS: '2500' })
      assert.equal(config.ldap?.tlsVerify, true)
      assert.equal(config.ldap?.jit, true)
      assert.equal(config.ldap?.timeoutMs, 2500)
      assert.deepEqual(config.ldap?.groupMap, [{ dn: `cn=admins,${GROUPS}`, role: 'admin' }, { dn: `cn=ops,${GROUPS}`, group: 'ops' }])
      assert.equal(loadConfig({}).ldap, undefined)
      assert.equal(loadConfig({}).passwordSignIn, true)
      assert.equal(loadConfig({ PASSWORD_SIGN_IN: 'off' }).passwordSignIn, false)
    })

    it('refuses plain ldap:// without StartTLS, a filter without {username}, and a malformed group map', () => {
      assert.throws(() => loadConfig({ ...base, LDAP_URL: 'ldap://ldap.example.org' }), ConfigError)
      assert.equal(loadConfig({ ...base, LDAP_URL: 'ldap://ldap.example.org', LDAP_START_TLS: 'on' }).ldap?.startTls, true)
      assert.equal(loadConfig({ ...base, LDAP_URL: 'ldap://ldap.example.org', LDAP_ALLOW_PLAINTEXT: 'on' }).ldap?.startTls, false)
      assert.throws(() => loadConfig({ ...base, LDAP_USER_FILTER: '(uid=*)' }), /\{username\}/)
      assert.throws(() => loadConfig({ ...base, LDAP_GROUP_MAP: 'cn=admins admin' }), /LDAP_GROUP_MAP/)
      assert.throws(() => loadConfig({ ...base, LDAP_BIND_DN: SEARCH_DN }), /go together/)
      assert.throws(() => loadConfig({ LDAP_URL: 'ldaps://ldap.example.org' }), /LDAP_USER_BASE/)
    })
  })
}
