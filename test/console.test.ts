import { strict as assert } from 'node:assert'
import { randomBytes } from 'node:crypto'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { generate } from 'otplib'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { SUPERUSER_PRIVILEGES_OPTION } from '../src/lib/pg-role-name.ts'

const ORIGIN = 'http://localhost:80'
const FORM = 'application/x-www-form-urlencoded'

interface Person { id: string, username: string, cookie: string }

async function createUser (t: TestApp, fields: Record<string, unknown>): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function signIn (t: TestApp, username: string, remoteAddress = '127.0.0.1'): Promise<string> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD }, remoteAddress })
  assert.equal(res.statusCode, 200, res.body)
  return `gatehouse_session=${(res.json() as { token: string }).token}`
}

async function person (t: TestApp, role: 'admin' | 'user'): Promise<Person> {
  const user = await createUser(t, { username: uniqueName(role), role })
  return { ...user, cookie: await signIn(t, user.username) }
}

function form (fields: Record<string, string | string[]>): string {
  const body = new URLSearchParams()
  for (const [name, value] of Object.entries(fields)) for (const v of [value].flat()) body.append(name, v)
  return body.toString()
}

async function post (t: TestApp, cookie: string, url: string, fields: Record<string, string | string[]>, headers: Record<string, string> = { origin: ORIGIN }): Promise<LightMyRequestResponse> {
  return await t.app.inject({ method: 'POST', url, headers: { cookie, 'content-type': FORM, ...headers }, payload: form(fields) })
}

async function get (t: TestApp, cookie: string, url: string): Promise<LightMyRequestResponse> {
  return await t.app.inject({ url, headers: { cookie } })
}

async function eventsOf (t: TestApp, query: string): Promise<Array<{ type: string, occurred_at: string, actor: { type: string, id: string | null }, data: Record<string, unknown> }>> {
  const res = await t.app.inject({ url: `/auth/api/events?${query}`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

for (const dialect of dialects()) {
  describe(`admin console over HTTP (${dialect.name})`, () => {
    // No known clients: every sign-in attempt here counts toward the lock.
    const t = useTestApp(dialect, { accountLockThreshold: 2, loginKnownClientDays: 0 })
    let admin: Person
    let plain: Person
    before(async () => {
      admin = await person(t, 'admin')
      plain = await person(t, 'user')
    })

    it('sends a visitor without a session to the sign-in page, with the way back', async () => {
      const res = await t.app.inject({ url: '/auth/admin/users?q=ada' })
      assert.equal(res.statusCode, 303)
      assert.equal(res.headers.location, '/auth/login?next=%2Fauth%2Fadmin%2Fusers%3Fq%3Dada')
    })

    it('sends a visitor without a session from a console address too long to come back to, to sign-in and then the console\'s start', async () => {
      // 12 KB of query string: copied into next and encoded again, the Location came to some 16 KB.
      const res = await t.app.inject({ url: `/auth/admin/events?${'a=1&'.repeat(3000)}` })
      assert.equal(res.statusCode, 303)
      assert.equal(res.headers.location, '/auth/login?next=%2Fauth%2Fadmin')
      const shorter = await t.app.inject({ url: `/auth/admin/events?${'a=1&'.repeat(400)}` })
      assert.equal(shorter.headers.location, `/auth/login?next=${encodeURIComponent(`/auth/admin/events?${'a=1&'.repeat(400)}`)}`, 'an address within the bound is kept')
    })

    it('answers an unknown console address and an unknown user with a 404 page', async () => {
      for (const url of ['/auth/admin/nothing/here', '/auth/admin/users/00000000-0000-7000-8000-000000000000']) {
        const res = await get(t, admin.cookie, url)
        assert.equal(res.statusCode, 404, url)
        assert.match(String(res.headers['content-type']), /^text\/html/)
        assert.match(res.body, /<h1>Not found<\/h1>/)
      }
      const bad = await get(t, admin.cookie, '/auth/admin/users/not-a-uuid')
      assert.equal(bad.statusCode, 422)
      assert.match(String(bad.headers['content-type']), /^text\/html/)
    })

    it('ignores API keys: the console is for the browser session only', async () => {
      const res = await t.app.inject({ url: '/auth/admin/users', headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 303)
    })

    it('refuses a signed-in non-admin with a 403 page that says why, for pages and for form posts', async () => {
      const page = await get(t, plain.cookie, '/auth/admin/users')
      assert.equal(page.statusCode, 403)
      assert.match(String(page.headers['content-type']), /^text\/html/)
      assert.match(page.body, /Admins only/)
      assert.match(page.body, new RegExp(`signed in as <strong>${plain.username}</strong>`))
      assert.doesNotMatch(page.body, new RegExp(admin.username), 'no user data on the refusal')
      const victim = await createUser(t, { username: uniqueName('victim') })
      const res = await post(t, plain.cookie, `/auth/admin/users/${victim.id}/disable`, {})
      assert.equal(res.statusCode, 403)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${victim.id}`, headers: auth(t.adminKey) })).json().disabled, false)
    })

    it('lists groups with member counts and shows each group\'s members; creates, renames, adds, removes and deletes through forms', async () => {
      const name = uniqueName('crew')
      const member = await createUser(t, { username: uniqueName('crewmate'), groups: ['<b>escaped</b>'] })
      const created = await post(t, admin.cookie, '/auth/admin/groups', { display_name: name })
      assert.equal(created.statusCode, 303, created.body)
      const groupUrl = String(created.headers.location).replace(/\?.*$/, '')
      assert.match(groupUrl, /^\/auth\/admin\/groups\/[0-9a-f-]{36}$/)
      const taken = await post(t, admin.cookie, '/auth/admin/groups', { display_name: name })
      assert.equal(taken.statusCode, 409)
      assert.match(taken.body, /is the name of another group/)
      const empty = await post(t, admin.cookie, '/auth/admin/groups', { display_name: '  ' })
      assert.equal(empty.statusCode, 422)
      assert.match(empty.body, /aria-invalid="true"/)

      const added = await post(t, admin.cookie, `${groupUrl}/members`, { username: member.username })
      assert.equal(added.statusCode, 303, added.body)
      const unknown = await post(t, admin.cookie, `${groupUrl}/members`, { username: uniqueName('nobody') })
      assert.equal(unknown.statusCode, 422)
      assert.match(unknown.body, /is not the username or id of a user/)
      const page = await get(t, admin.cookie, `${groupUrl}?done=member-added`)
      assert.equal(page.statusCode, 200)
      assert.match(page.body, /Member added\./)
      assert.match(page.body, new RegExp(`<a href="/auth/admin/users/${member.id}">${member.username}</a>`))
      const list = await get(t, admin.cookie, `/auth/admin/groups?q=${encodeURIComponent(name)}`)
      assert.match(list.body, new RegExp(`>${name}</a></td>\\s*<td data-label="Members">1</td>`))
      const all = await get(t, admin.cookie, '/auth/admin/groups')
      assert.match(all.body, /&#60;b&#62;escaped&#60;\/b&#62;/, 'a group made from a user\'s array is listed, escaped')
      assert.doesNotMatch(all.body, /<b>escaped<\/b>/)

      const version = /name="version" value="(\d+)"/.exec(page.body)![1]!
      const renamed = await post(t, admin.cookie, groupUrl, { display_name: `${name}-x`, version })
      assert.equal(renamed.statusCode, 303, renamed.body)
      const userAfter = await t.app.inject({ url: `/auth/api/users/${member.id}`, headers: auth(t.adminKey) })
      assert.deepEqual(userAfter.json().groups, ['<b>escaped</b>', `${name}-x`])
      const stale = await post(t, admin.cookie, groupUrl, { display_name: `${name}-y`, version })
      assert.equal(stale.statusCode, 409)
      assert.match(stale.body, /was changed by someone else meanwhile/)

      const removed = await post(t, admin.cookie, `${groupUrl}/members/${member.id}/remove`, {})
      assert.equal(removed.statusCode, 303)
      assert.deepEqual((await t.app.inject({ url: `/auth/api/users/${member.id}`, headers: auth(t.adminKey) })).json().groups, ['<b>escaped</b>'])
      const deleted = await post(t, admin.cookie, `${groupUrl}/delete`, {})
      assert.equal(deleted.statusCode, 303)
      assert.equal(deleted.headers.location, `/auth/admin/groups?done=group-deleted&name=${encodeURIComponent(`${name}-x`)}`)
      assert.equal((await get(t, admin.cookie, groupUrl)).statusCode, 404)
      const actors = await eventsOf(t, `type=group.deleted&actor_id=${admin.id}`)
      assert.equal(actors.length, 1, 'recorded with the signed-in admin as the actor')

      assert.equal((await get(t, plain.cookie, '/auth/admin/groups')).statusCode, 403)
      const csrf = await post(t, admin.cookie, '/auth/admin/groups', { display_name: uniqueName('csrf') }, { origin: 'https://evil.example' })
      assert.equal(csrf.statusCode, 403)
    })

    it('refuses a form post from another site (CSRF) and creates nothing', async () => {
      const username = uniqueName('csrf')
      for (const headers of [{ origin: 'https://evil.example' }, {}, { origin: 'null' }, { 'sec-fetch-site': 'cross-site' }] as Array<Record<string, string>>) {
        const res = await post(t, admin.cookie, '/auth/admin/users', { username }, headers)
        assert.equal(res.statusCode, 403, JSON.stringify(headers))
        assert.match(res.body, /own pages/)
      }
      const found = await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })
      assert.deepEqual(found.json(), [])
      const ok = await post(t, admin.cookie, '/auth/admin/users', { username }, { 'sec-fetch-site': 'same-origin' })
      assert.equal(ok.statusCode, 303, ok.body)
    })

    it('serves pages with a strict Content-Security-Policy and only local assets', async () => {
      const res = await get(t, admin.cookie, '/auth/admin/users')
      assert.equal(res.statusCode, 200)
      const csp = String(res.headers['content-security-policy'])
      assert.match(csp, /default-src 'none'/)
      assert.match(csp, /script-src 'self'/)
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/)
      assert.equal(res.headers['x-frame-options'], 'DENY')
      assert.doesNotMatch(res.body, /<script>|<style>| style="| on[a-z]+="/, 'no inline script, style or handler')
      for (const src of res.body.matchAll(/(?:src|href)="([^"]+)"/g)) {
        assert.ok(src[1]!.startsWith('/auth/') || src[1]!.startsWith('#'), `local link: ${src[1]!}`)
      }
      const css = await t.app.inject({ url: '/auth/admin/assets/console.css' })
      assert.equal(css.statusCode, 200)
      assert.match(String(css.headers['content-type']), /^text\/css/)
    })

    it('escapes user-supplied text everywhere it is shown', async () => {
      const evil = '<img src=x onerror=alert(1)>"\'&'
      const user = await createUser(t, { username: uniqueName('esc'), first_name: evil, last_name: '</td><script>alert(2)</script>', groups: ['<b>g</b>'] })
      const pages = [
        `/auth/admin/users?q=${encodeURIComponent(user.username)}`,
        `/auth/admin/users/${user.id}`,
        `/auth/admin/users/${user.id}/delete`,
        `/auth/admin/events?target_id=${user.id}`,
        `/auth/admin/users?q=${encodeURIComponent(evil)}&group=${encodeURIComponent('"><script>alert(3)</script>')}`
      ]
      for (const url of pages) {
        const res = await get(t, admin.cookie, url)
        assert.equal(res.statusCode, 200, `${url}: ${res.body}`)
        assert.doesNotMatch(res.body, /<img|<script>|<b>g/, url)
      }
      const detail = await get(t, admin.cookie, `/auth/admin/users/${user.id}`)
      assert.match(detail.body, /&#60;img src=x onerror=alert\(1\)&#62;&#34;&#39;&#38;/)
    })

    it('creates a user from the form, with or without a password, and shows the database-user command', async () => {
      const withPassword = uniqueName('made')
      const res = await post(t, admin.cookie, '/auth/admin/users', { username: withPassword, email: `${withPassword}@example.com`, groups: 'analysts, ops', role: 'user', password: GOOD_PASSWORD })
      assert.equal(res.statusCode, 303, res.body)
      const id = /\/auth\/admin\/users\/([0-9a-f-]{36})\?done=created$/.exec(String(res.headers.location))?.[1]
      assert.ok(id !== undefined, String(res.headers.location))
      const stored = (await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(stored.groups, ['analysts', 'ops'])
      assert.notEqual(stored.password_changed_at, null)
      await signIn(t, withPassword)
      const page = await get(t, admin.cookie, String(res.headers.location))
      assert.match(page.body, new RegExp(`npx gatehouse db-user create ${withPassword}`))
      assert.ok(page.body.includes(`the role always has LOGIN); for a superuser add ${SUPERUSER_PRIVILEGES_OPTION}.`), 'the hint spells the superuser step as the CLI help does')

      const without = uniqueName('nopw')
      const res2 = await post(t, admin.cookie, '/auth/admin/users', { username: without, role: 'user' })
      assert.equal(res2.statusCode, 303, res2.body)
      const [made] = (await t.app.inject({ url: `/auth/api/users?username=${without}`, headers: auth(t.adminKey) })).json()
      assert.equal(made.password_changed_at, null)
    })

    it('shows what is wrong with a form next to the field, and keeps what was typed', async () => {
      const res = await post(t, admin.cookie, '/auth/admin/users', { username: 'no spaces', email: 'not-an-address', first_name: 'Kept', password: 'short' })
      assert.equal(res.statusCode, 422)
      assert.match(res.body, /id="username"[^>]*aria-invalid="true"/)
      assert.match(res.body, /id="email"[^>]*aria-invalid="true"/)
      assert.match(res.body, /value="Kept"/)
      assert.doesNotMatch(res.body, /value="short"/, 'a typed password is never sent back')
      // The password's rule is shown with the other problems, not only once they are fixed.
      assert.match(res.body, /id="password"[^>]*aria-invalid="true"/)
      assert.match(res.body, /The password must have at least 8 characters/)
      const taken = await post(t, admin.cookie, '/auth/admin/users', { username: admin.username.toUpperCase() })
      assert.equal(taken.statusCode, 409)
      assert.match(taken.body, /already exists/)
    })

    it('finds users by search, role, group and status, pages through them with keyset links, and sorts', async () => {
      const stem = uniqueName('page').replace(/[^a-z0-9]/g, '')
      const users = Array.from({ length: 60 }, (_, i) => ({ username: `${stem}_${String(i).padStart(2, '0')}`, groups: [stem], disabled: i % 10 === 0 }))
      const imported = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users } })
      assert.equal(imported.statusCode, 200, imported.body)
      const rowsOf = (body: string): string[] => [...body.matchAll(/<td data-label="Username"><a href="\/auth\/admin\/users\/[0-9a-f-]{36}">([^<]+)<\/a><\/td>/g)].map(m => m[1]!)

      const first = await get(t, admin.cookie, `/auth/admin/users?q=${stem}&sort=username`)
      assert.equal(rowsOf(first.body).length, 50)
      assert.equal(rowsOf(first.body)[0], `${stem}_00`)
      const next = /href="([^"]+)" rel="next"/.exec(first.body)?.[1]?.replace(/&#38;/g, '&')
      assert.ok(next !== undefined)
      const second = await get(t, admin.cookie, next)
      assert.deepEqual(rowsOf(second.body), users.slice(50).map(u => u.username))
      assert.doesNotMatch(second.body, /rel="next"/)

      const disabled = await get(t, admin.cookie, `/auth/admin/users?group=${stem}&disabled=true&sort=-username&role=`)
      assert.deepEqual(rowsOf(disabled.body), ['50', '40', '30', '20', '10', '00'].map(n => `${stem}_${n}`))
      const admins = await get(t, admin.cookie, '/auth/admin/users?role=admin')
      assert.ok(rowsOf(admins.body).includes(admin.username))
      assert.ok(!rowsOf(admins.body).includes(plain.username))
      const bad = await get(t, admin.cookie, '/auth/admin/users?sort=password')
      assert.equal(bad.statusCode, 422)
      assert.match(bad.body, /filters are not valid/)
    })

    it('edits a user with the version it read, and shows a conflict instead of overwriting a concurrent change', async () => {
      const user = await createUser(t, { username: uniqueName('edit'), first_name: 'Ada' })
      const page = await get(t, admin.cookie, `/auth/admin/users/${user.id}`)
      const version = /name="version" value="(\d+)"/.exec(page.body)?.[1]
      assert.equal(version, '1')
      // Someone else changes the user after the page was read.
      const other = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { last_name: 'Byron' } })
      assert.equal(other.statusCode, 200)
      const opened = { was_username: user.username, was_email: '', was_first_name: 'Ada', was_last_name: '', was_role: 'user', was_groups: '', was_disabled: 'false' }
      const res = await post(t, admin.cookie, `/auth/admin/users/${user.id}`, { ...opened, version: version!, username: user.username, first_name: 'Augusta', role: 'user', groups: '' })
      assert.equal(res.statusCode, 409)
      assert.match(res.body, /was changed by someone else/)
      const table = res.body.replace(/ data-label="[^"]*"/g, '')
      assert.match(table, /<th scope="row">First name<\/th><td>Ada<\/td><td>Augusta<\/td><td>Ada<\/td><td>you changed<\/td>/, 'every version of first name')
      assert.match(table, /<th scope="row">Last name<\/th><td>—<\/td><td>—<\/td><td>Byron<\/td><td>they changed<\/td>/, 'every version of last name')
      const after = (await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(after.first_name, 'Ada', 'nothing was overwritten')
      assert.equal(after.last_name, 'Byron')
      // "Apply my changes" posts the conflict page's form: my change on top of the current version.
      const applied = Object.fromEntries([...res.body.matchAll(/<input type="hidden" name="([a-z_]+)" value="([^"]*)">/g)].map(m => [m[1]!, m[2]!]))
      assert.equal(applied.version, '2')
      assert.equal(applied.first_name, 'Augusta')
      assert.equal(applied.last_name, 'Byron')
      const saved = await post(t, admin.cookie, `/auth/admin/users/${user.id}`, applied)
      assert.equal(saved.statusCode, 303, saved.body)
      const merged = (await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual([merged.first_name, merged.last_name], ['Augusta', 'Byron'])
      const missing = await post(t, admin.cookie, `/auth/admin/users/${user.id}`, { username: user.username, role: 'user' })
      assert.equal(missing.statusCode, 422, 'an edit without the version it read is refused')
    })

    it('explains the last-admin rule when it blocks disabling, demoting or deleting', async () => {
      // A fresh deployment's only admin is `admin` (the bootstrap key has no user): make it the last one.
      const others = (await t.app.inject({ url: '/auth/api/users?role=admin&disabled=false', headers: auth(t.adminKey) })).json() as Array<{ id: string }>
      assert.deepEqual(others.map(u => u.id), [admin.id])
      const page = await get(t, admin.cookie, `/auth/admin/users/${admin.id}`)
      assert.match(page.body, /The last enabled admin/)
      for (const res of [
        await post(t, admin.cookie, `/auth/admin/users/${admin.id}/disable`, {}),
        await post(t, admin.cookie, `/auth/admin/users/${admin.id}`, { version: /name="version" value="(\d+)"/.exec(page.body)![1]!, username: admin.username, role: 'user', groups: '' }),
        await post(t, admin.cookie, `/auth/admin/users/${admin.id}/delete`, { version: /name="version" value="(\d+)"/.exec(page.body)![1]! })
      ]) {
        assert.equal(res.statusCode, 409, res.body)
        assert.match(res.body, /is the last enabled admin\. gatehouse always keeps at least one enabled admin/)
        assert.match(res.body, /Make another user an admin first/)
      }
      const still = (await t.app.inject({ url: `/auth/api/users/${admin.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(still.role, 'admin')
      assert.equal(still.disabled, false)
    })

    it('disables and enables a user, ends their sessions, and deletes them after a confirmation naming them', async () => {
      const user = await createUser(t, { username: uniqueName('life') })
      const session = await signIn(t, user.username)
      const me = async (): Promise<number> => (await t.app.inject({ url: '/auth/api/me', headers: { cookie: session } })).statusCode
      assert.equal(await me(), 200)
      assert.equal((await post(t, admin.cookie, `/auth/admin/users/${user.id}/end-sessions`, {})).headers.location, `/auth/admin/users/${user.id}?done=sessions-ended`)
      assert.equal(await me(), 401)
      const ended = await eventsOf(t, `type=session.ended&actor_id=${admin.id}`)
      assert.ok(ended.some(e => e.data.user_id === user.id && e.data.reason === 'ended_by_admin'))

      assert.equal((await post(t, admin.cookie, `/auth/admin/users/${user.id}/disable`, {})).statusCode, 303)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).json().disabled, true)
      assert.equal((await post(t, admin.cookie, `/auth/admin/users/${user.id}/enable`, {})).statusCode, 303)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).json().disabled, false)

      const confirm = await get(t, admin.cookie, `/auth/admin/users/${user.id}/delete`)
      assert.match(confirm.body, new RegExp(`Delete ${user.username}\\?`))
      assert.match(confirm.body, new RegExp(user.id))
      const version = /name="version" value="(\d+)"/.exec(confirm.body)![1]!
      const res = await post(t, admin.cookie, `/auth/admin/users/${user.id}/delete`, { version })
      assert.equal(res.statusCode, 303)
      assert.equal(res.headers.location, `/auth/admin/users?done=deleted&username=${user.username}`)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).statusCode, 404)
      const list = await get(t, admin.cookie, String(res.headers.location))
      assert.match(list.body, new RegExp(`Deleted ${user.username}`))
      assert.match(list.body, new RegExp(`npx gatehouse db-user drop ${user.username}`))
    })

    it('refuses a delete confirmed against an older version of the user', async () => {
      const user = await createUser(t, { username: uniqueName('stale') })
      await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { first_name: 'Changed' } })
      const res = await post(t, admin.cookie, `/auth/admin/users/${user.id}/delete`, { version: '1' })
      assert.equal(res.statusCode, 409)
      assert.match(res.body, /changed after this page was opened/)
      assert.equal((await t.app.inject({ url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).statusCode, 200)
    })

    it('resets a sign-in lock from the console and through POST /api/users/{user_id}/unlock, with a user.unlocked event', async () => {
      const user = await createUser(t, { username: uniqueName('lock') })
      const attempt = async (password: string): Promise<number> => (await t.app.inject({
        method: 'POST', url: '/auth/api/login', payload: { username: user.username, password }, remoteAddress: '203.0.113.9'
      })).statusCode
      const lock = async (): Promise<void> => {
        assert.equal(await attempt('wrong password 1'), 401)
        assert.equal(await attempt('wrong password 2'), 401)
        assert.equal(await attempt(GOOD_PASSWORD), 401, 'locked: the right password is refused too')
      }
      await lock()
      const page = await get(t, admin.cookie, `/auth/admin/users/${user.id}`)
      assert.match(page.body, /sign-in locked/)
      const res = await post(t, admin.cookie, `/auth/admin/users/${user.id}/unlock`, {})
      assert.equal(res.headers.location, `/auth/admin/users/${user.id}?done=unlocked`)
      assert.equal(await attempt(GOOD_PASSWORD), 200)

      await lock()
      const denied = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/unlock`, headers: { cookie: plain.cookie, origin: ORIGIN } })
      assert.equal(denied.statusCode, 403)
      const api = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/unlock`, headers: auth(t.adminKey) })
      assert.equal(api.statusCode, 204, api.body)
      assert.equal(await attempt(GOOD_PASSWORD), 200)
      const again = await t.app.inject({ method: 'POST', url: `/auth/api/users/${user.id}/unlock`, headers: auth(t.adminKey) })
      assert.equal(again.statusCode, 204)
      const unlocked = await eventsOf(t, `type=user.unlocked&target_id=${user.id}`)
      assert.equal(unlocked.length, 2, 'one event per reset that cleared something')
      assert.equal(unlocked[0]!.data.failed_logins, 2)
      assert.equal(typeof unlocked[0]!.data.locked_until, 'string')
      const none = await t.app.inject({ method: 'POST', url: '/auth/api/users/00000000-0000-7000-8000-000000000000/unlock', headers: auth(t.adminKey) })
      assert.equal(none.statusCode, 404)
      const doc = (await t.app.inject({ url: '/auth/openapi.json' })).json() as { paths: Record<string, Record<string, { operationId: string }>> }
      assert.equal(doc.paths['/auth/api/users/{user_id}/unlock']?.post?.operationId, 'unlock_user')
      assert.ok(!Object.keys(doc.paths).some(p => p.startsWith('/auth/admin')), 'the console is not part of the API document')
    })

    it('creates a key whose secret is shown once, and rotates and revokes keys', async () => {
      const res = await post(t, admin.cookie, '/auth/admin/api-keys', { name: 'nightly <export>', scopes: ['users:read', 'events:read'], expires_at: '2099-01-02T03:04' })
      assert.equal(res.statusCode, 201, res.body)
      const secret = /<code id="secret">(gatehouse_[A-Za-z0-9]+)<\/code>/.exec(res.body)?.[1]
      assert.ok(secret !== undefined)
      assert.match(res.body, /nightly &#60;export&#62;/)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 200)
      const keys = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json() as Array<{ id: string, name: string, scopes: string[], expires_at: string, user_id: string }>
      const key = keys.find(k => k.name === 'nightly <export>')!
      assert.deepEqual(key.scopes, ['users:read', 'events:read'])
      assert.equal(key.expires_at, '2099-01-02T03:04:00.000Z')
      assert.equal(key.user_id, admin.id)
      const list = await get(t, admin.cookie, '/auth/admin/api-keys')
      assert.ok(!list.body.includes(secret), 'the list never shows a secret')

      const rotated = await post(t, admin.cookie, `/auth/admin/api-keys/${key.id}/rotate`, {})
      assert.equal(rotated.statusCode, 200)
      const newSecret = /<code id="secret">(gatehouse_[A-Za-z0-9]+)<\/code>/.exec(rotated.body)![1]!
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 401)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(newSecret) })).statusCode, 200)

      const revoked = await post(t, admin.cookie, `/auth/admin/api-keys/${key.id}/revoke`, {})
      assert.equal(revoked.headers.location, '/auth/admin/api-keys?done=revoked')
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(newSecret) })).statusCode, 401)

      const past = await post(t, admin.cookie, '/auth/admin/api-keys', { name: 'old', expires_at: '2001-01-01T00:00' })
      assert.equal(past.statusCode, 422)
      assert.match(past.body, /id="expires_at"[^>]*aria-invalid="true"/)
    })

    it('lists events filtered by type, actor and target', async () => {
      const user = await createUser(t, { username: uniqueName('ev') })
      const res = await get(t, admin.cookie, `/auth/admin/events?type=user.created&target_id=${user.id}&actor_id=`)
      assert.equal(res.statusCode, 200)
      assert.equal([...res.body.matchAll(/<td data-label="Event"><code>user\.created<\/code><\/td>/g)].length, 1)
      const none = await get(t, admin.cookie, `/auth/admin/events?type=user.deleted&target_id=${user.id}`)
      assert.match(none.body, /No events\./)
      const mine = await get(t, admin.cookie, `/auth/admin/events?actor_id=${admin.id}`)
      const rows = [...mine.body.matchAll(/<td data-label="Actor">(.*?)<\/td>/g)].map(m => m[1]!)
      assert.ok(rows.length > 0)
      assert.ok(rows.every(cell => cell.startsWith(`<a href="/auth/admin/users/${admin.id}">${admin.username}</a>`)), rows.join('\n'))
    })

    /** The cells of each row of an events table: event type, actor, target and details as HTML. */
    const eventRows = (body: string): Array<{ type: string, actor: string, target: string, details: string }> =>
      [...body.matchAll(/<td data-label="Event"><code>([^<]+)<\/code><\/td><td data-label="Actor">(.*?)<\/td>\s*<td data-label="Target">(.*?)<\/td>\s*<td data-label="Details" class="data">(.*?)<\/td>/gs)]
        .map(m => ({ type: m[1]!, actor: m[2]!, target: m[3]!, details: m[4]! }))

    it('shows events with usernames and key names linking to their pages, the ids under them, and changes as "field: old → new" lines', async () => {
      const username = uniqueName('named')
      const made = await post(t, admin.cookie, '/auth/admin/users', { username, password: GOOD_PASSWORD })
      assert.equal(made.statusCode, 303, made.body)
      const user = (await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })).json()[0] as { id: string }
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { first_name: 'Ada', groups: ['analysts', 'ops'], password: 'another long passphrase' } })
      assert.equal(patched.statusCode, 200, patched.body)
      const [updated] = await eventsOf(t, `type=user.updated&target_id=${user.id}`)
      const key = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json().find((k: { id: string }) => k.id === updated!.actor.id) as { name: string }

      const res = await get(t, admin.cookie, `/auth/admin/events?target=${username}`)
      assert.equal(res.statusCode, 200)
      const rows = eventRows(res.body)
      assert.deepEqual(rows.map(r => r.type), ['user.updated', 'user.created'])
      const userLink = `<a href="/auth/admin/users/${user.id}">${username}</a><br><span class="id muted">${user.id}</span>`
      assert.ok(rows.every(r => r.target === userLink), rows.map(r => r.target).join('\n'))
      assert.equal(rows[1]!.actor, `<a href="/auth/admin/users/${admin.id}">${admin.username}</a><br><span class="id muted">${admin.id}</span>`)
      assert.equal(rows[0]!.actor, `API key <a href="/auth/admin/api-keys?include_revoked=true#key-${updated!.actor.id}">${key.name}</a><br><span class="id muted">${updated!.actor.id}</span>`)
      const lines = [...rows[0]!.details.matchAll(/<li>(.*?)<\/li>/g)].map(m => m[1])
      assert.deepEqual(lines.sort(), ['first_name: — → Ada', 'groups: (none) → analysts, ops', 'password: [redacted]'])
      assert.match(rows[1]!.details, new RegExp(`<li>username: ${username}</li>`))
      assert.doesNotMatch(res.body, /\{&#34;|another long passphrase/, 'no raw JSON, no secret')
      // The key's row on the keys page is where the link points.
      assert.match((await get(t, admin.cookie, '/auth/admin/api-keys?include_revoked=true')).body, new RegExp(`<tr id="key-${updated!.actor.id}">`))

      // A deleted user keeps their events; the name comes from the deletion's record.
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).statusCode, 204)
      const after = eventRows((await get(t, admin.cookie, `/auth/admin/events?target=${user.id}`)).body)
      assert.deepEqual(after.map(r => r.type), ['user.deleted', 'user.updated', 'user.created'])
      assert.equal(after[0]!.target, `deleted user ${username}<br><span class="id muted">${user.id}</span>`)
    })

    it('narrows events by actor and target username, ignoring case, and says so when no user has the username', async () => {
      const username = uniqueName('who')
      assert.equal((await post(t, admin.cookie, '/auth/admin/users', { username })).statusCode, 303)
      const user = (await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })).json()[0] as { id: string }
      assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { last_name: 'Who' } })).statusCode, 200)

      const both = eventRows((await get(t, admin.cookie, `/auth/admin/events?target=${username.toUpperCase()}`)).body)
      assert.deepEqual(both.map(r => r.type), ['user.updated', 'user.created'])
      const byAdmin = eventRows((await get(t, admin.cookie, `/auth/admin/events?actor=${admin.username}&target=${username}`)).body)
      assert.deepEqual(byAdmin.map(r => r.type), ['user.created'])
      const page = await get(t, admin.cookie, `/auth/admin/events?actor=${admin.username}`)
      assert.ok(eventRows(page.body).every(r => r.actor.includes(`>${admin.username}</a>`)))
      assert.match(page.body, new RegExp(`id="actor" name="actor" type="text" value="${admin.username}"`), 'the filter shows what was typed')

      // A username that looks like an id (`cli` is the command line's actor id) is a username first.
      const cli = await createUser(t, { username: 'cli' })
      assert.deepEqual(eventRows((await get(t, admin.cookie, '/auth/admin/events?target=CLI')).body).map(r => r.target.split('<br>')[0]), [`<a href="/auth/admin/users/${cli.id}">cli</a>`])

      const unknown = await get(t, admin.cookie, '/auth/admin/events?actor=nobody_by_this_name')
      assert.equal(unknown.statusCode, 200)
      assert.match(unknown.body, /<div class="warning" role="status" id="unmatched"><strong>No events listed\.<\/strong> No user is named “nobody_by_this_name” \(the actor filter\)\./)
      assert.deepEqual(eventRows(unknown.body), [])
    })

    it('narrows events to a UTC time range (from included, to not), and shows a bad range next to its field', async () => {
      const username = uniqueName('when')
      const user = await createUser(t, { username })
      const [created] = await eventsOf(t, `target_id=${user.id}`)
      // The next whole second after the first event; the second event is made once the clock has passed it.
      const boundary = new Date(Math.floor(Date.parse(created!.occurred_at) / 1000) * 1000 + 1000)
      const deadline = Date.now() + 5000
      while (Date.now() < boundary.getTime()) {
        assert.ok(Date.now() < deadline, 'the clock reached the boundary')
        await new Promise(resolve => setImmediate(resolve))
      }
      assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { first_name: 'Later' } })).statusCode, 200)
      const local = boundary.toISOString().slice(0, 19)
      const minute = boundary.toISOString().slice(0, 16)

      const types = async (query: string): Promise<string[]> => eventRows((await get(t, admin.cookie, `/auth/admin/events?target=${username}&${query}`)).body).map(r => r.type)
      assert.deepEqual(await types(`to=${local}`), ['user.created'])
      assert.deepEqual(await types(`from=${local}`), ['user.updated'])
      // Minutes, as the browser's datetime-local field sends them.
      assert.deepEqual(await types(`from=${created!.occurred_at.slice(0, 16)}&to=${new Date(boundary.getTime() + 120_000).toISOString().slice(0, 16)}`), ['user.updated', 'user.created'])
      assert.deepEqual(await types('from=2999-01-01T00:00'), [])

      const page = await get(t, admin.cookie, `/auth/admin/events?target=${username}&from=${minute}`)
      assert.match(page.body, new RegExp(`id="from" name="from" type="datetime-local" value="${minute}"`))
      assert.match(page.body, /<label for="from">From \(UTC\)/)

      const backwards = await get(t, admin.cookie, '/auth/admin/events?from=2026-02-01T00:00&to=2026-01-01T00:00')
      assert.equal(backwards.statusCode, 422)
      assert.match(backwards.body, /id="to" name="to" type="datetime-local" value="2026-01-01T00:00"[^>]*aria-invalid="true"/)
      assert.match(backwards.body, /To \(UTC\) must be later than From\./)
      const garbage = await get(t, admin.cookie, '/auth/admin/events?from=yesterday')
      assert.equal(garbage.statusCode, 422)
      assert.match(garbage.body, /From \(UTC\) is not a date and time\./)
    })

    it('pages through filtered events with the filters kept in the link', async () => {
      const username = uniqueName('pages')
      const user = await createUser(t, { username })
      for (let i = 0; i < 50; i++) {
        assert.equal((await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { first_name: `N${i}` } })).statusCode, 200)
      }
      const first = await get(t, admin.cookie, `/auth/admin/events?target=${username}&from=2000-01-01T00:00`)
      assert.equal(eventRows(first.body).length, 50)
      const next = /<a href="([^"]+)" rel="next">Older events<\/a>/.exec(first.body)
      assert.ok(next !== null, 'a link to the older events')
      const url = next[1]!.replace(/&#38;/g, '&')
      assert.match(url, new RegExp(`target=${username}&from=2000-01-01T00%3A00&cursor=`))
      const second = eventRows((await get(t, admin.cookie, url)).body)
      assert.deepEqual(second.map(r => r.type), ['user.created'])
    })
  })
}

for (const dialect of dialects()) {
  describe(`admin console: second factors over HTTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, { mfaEncryptionKey: randomBytes(32) })
    let admin: Person
    before(async () => { admin = await person(t, 'admin') })

    /** A user with an authenticator app and ten recovery codes, enrolled through the API with their own session. */
    async function userWithTotp (): Promise<{ id: string, username: string }> {
      const user = await createUser(t, { username: uniqueName('mfa') })
      const token = /^gatehouse_session=(.*)$/.exec(await signIn(t, user.username))![1]!
      const headers = { authorization: `Bearer ${token}` }
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers })
      assert.equal(setup.statusCode, 200, setup.body)
      const code = await generate({ secret: setup.json().secret })
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers, payload: { code } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      return user
    }

    const factorsOf = async (id: string): Promise<{ totp: { enrolled: boolean }, passkeys: unknown[], recovery_codes_remaining: number }> =>
      (await t.app.inject({ url: `/auth/api/users/${id}/mfa`, headers: auth(t.adminKey) })).json()

    it('links every page to the signed-in admin\'s own account security page', async () => {
      const res = await get(t, admin.cookie, '/auth/admin/users')
      assert.match(res.body, /<div class="who">[^]*<a href="\/auth\/account">Account security<\/a>/)
    })

    it('shows a user\'s second factors and resets them after a confirmation, as the API\'s reset does, with a user.mfa_reset event', async () => {
      const user = await userWithTotp()
      const page = await get(t, admin.cookie, `/auth/admin/users/${user.id}`)
      assert.equal(page.statusCode, 200)
      assert.match(page.body, /<dt>Authenticator app<\/dt><dd>yes<\/dd>\s*<dt>Passkeys<\/dt><dd>0<\/dd>\s*<dt>Recovery codes left<\/dt><dd>10 of 10<\/dd>/)
      assert.match(page.body, new RegExp(`<a class="button danger" href="/auth/admin/users/${user.id}/mfa-reset">Reset second factor…</a>`))

      const confirm = await get(t, admin.cookie, `/auth/admin/users/${user.id}/mfa-reset`)
      assert.equal(confirm.statusCode, 200)
      assert.match(confirm.body, new RegExp(`<h1>Reset the second factor of ${user.username}\\?</h1>`))
      assert.match(confirm.body, new RegExp(`<form method="post" action="/auth/admin/users/${user.id}/mfa-reset"`))
      assert.equal((await factorsOf(user.id)).totp.enrolled, true, 'opening the confirmation changes nothing')

      const done = await post(t, admin.cookie, `/auth/admin/users/${user.id}/mfa-reset`, {})
      assert.equal(done.statusCode, 303, done.body)
      assert.equal(done.headers.location, `/auth/admin/users/${user.id}?done=mfa-reset`)
      const factors = await factorsOf(user.id)
      assert.deepEqual({ totp: factors.totp.enrolled, passkeys: factors.passkeys.length, codes: factors.recovery_codes_remaining }, { totp: false, passkeys: 0, codes: 0 })
      const [event, ...more] = await eventsOf(t, `type=user.mfa_reset&target_id=${user.id}`)
      assert.equal(more.length, 0)
      assert.deepEqual(event!.actor, { type: 'user', id: admin.id })
      assert.deepEqual(event!.data, { totp: true, passkeys: 0, recovery_codes: 10 })
      // The password alone signs them in again.
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: user.username, password: GOOD_PASSWORD } })).statusCode, 200)

      const after = await get(t, admin.cookie, `/auth/admin/users/${user.id}?done=mfa-reset`)
      assert.match(after.body, /role="status">Second factor reset: the authenticator app, passkeys and recovery codes are removed\.</)
      assert.match(after.body, /<dt>Authenticator app<\/dt><dd>no<\/dd>/)
      assert.match(after.body, /Nothing enrolled, so nothing to reset\./)
      assert.doesNotMatch(after.body, /mfa-reset"/)
    })

    it('refuses a second-factor reset posted from another site (CSRF) or by a non-admin, and removes nothing', async () => {
      const user = await userWithTotp()
      for (const headers of [{ origin: 'https://evil.example' }, {}] as Array<Record<string, string>>) {
        const res = await post(t, admin.cookie, `/auth/admin/users/${user.id}/mfa-reset`, {}, headers)
        assert.equal(res.statusCode, 403, JSON.stringify(headers))
      }
      const plain = await person(t, 'user')
      assert.equal((await post(t, plain.cookie, `/auth/admin/users/${user.id}/mfa-reset`, {})).statusCode, 403)
      assert.equal((await factorsOf(user.id)).totp.enrolled, true)
      assert.deepEqual(await eventsOf(t, `type=user.mfa_reset&target_id=${user.id}`), [])
    })
  })
}

for (const dialect of dialects()) {
  // No delivery worker: nothing is ever sent to these endpoints' public addresses. The SSRF guard is on.
  describe(`admin console: webhooks over HTTP (${dialect.name})`, () => {
    const t = useTestApp(dialect, { webhookDelivery: false, webhookAllowPrivate: false })
    let admin: Person
    let plain: Person
    before(async () => {
      admin = await person(t, 'admin')
      plain = await person(t, 'user')
    })

    const hooks = async (): Promise<Array<{ id: string, url: string, enabled: boolean, description: string | null, event_types: string[] }>> =>
      (await t.app.inject({ url: '/auth/api/webhooks', headers: auth(t.adminKey) })).json()
    const secretOf = (body: string): string | undefined => /<code id="secret">(whsec_[A-Za-z0-9+/=]+)<\/code>/.exec(body)?.[1]

    it('adds an endpoint from the form, shows its secret once with a Copy button, and lists it', async () => {
      const url = `https://93.184.215.14/${uniqueName('hook')}`
      const res = await post(t, admin.cookie, '/auth/admin/webhooks', { url, event_types: 'user.*, api_key.revoked', description: 'pipeline sync' })
      assert.equal(res.statusCode, 201, res.body)
      const secret = secretOf(res.body)
      assert.ok(secret !== undefined, 'the secret is on the page')
      assert.match(res.body, /<button type="button" data-copy="secret" hidden>Copy<\/button>/)
      const stored = (await hooks()).find(h => h.url === url)
      assert.ok(stored !== undefined)
      assert.deepEqual(stored.event_types, ['user.*', 'api_key.revoked'])
      assert.equal(stored.description, 'pipeline sync')
      const created = await eventsOf(t, `type=webhook.created&target_id=${stored.id}`)
      assert.equal(created.length, 1, 'the same event as the API records')

      const list = await get(t, admin.cookie, '/auth/admin/webhooks')
      assert.equal(list.statusCode, 200)
      assert.match(list.body, /<a href="\/auth\/admin\/webhooks" aria-current="page">Webhooks<\/a>/)
      assert.ok(list.body.includes(`<a href="/auth/admin/webhooks/${stored.id}">${url}</a>`))
      assert.match(list.body, /<code>user\.\*<\/code>, <code>api_key\.revoked<\/code>/)
      assert.match(list.body, /pipeline sync/)
      assert.ok(!list.body.includes(secret), 'the list never shows a secret')
      const page = await get(t, admin.cookie, `/auth/admin/webhooks/${stored.id}`)
      assert.equal(page.statusCode, 200)
      assert.ok(!page.body.includes(secret), 'the endpoint page never shows a secret')
      assert.match(page.body, /No deliveries\./)
      assert.match(page.body, /No attempts yet\./)
    })

    it('shows an internal address, a bad URL and an unknown event type as form errors, keeping what was typed', async () => {
      const before = (await hooks()).length
      const ssrf = await post(t, admin.cookie, '/auth/admin/webhooks', { url: 'http://127.0.0.1:6379/', description: 'kept text' })
      assert.equal(ssrf.statusCode, 422)
      assert.match(ssrf.body, /id="url"[^>]*aria-invalid="true"/)
      assert.match(ssrf.body, /<p class="field-error" id="url-error">URL leads to an internal address[^<]*WEBHOOK_ALLOW_PRIVATE/)
      assert.match(ssrf.body, /value="kept text"/)
      const scheme = await post(t, admin.cookie, '/auth/admin/webhooks', { url: 'ftp://93.184.215.14/x' })
      assert.equal(scheme.statusCode, 422)
      assert.match(scheme.body, /URL must be an http:\/\/ or https:\/\/ URL/)
      const unknown = await post(t, admin.cookie, '/auth/admin/webhooks', { url: 'https://93.184.215.14/x', event_types: 'user.created, user.exploded' })
      assert.equal(unknown.statusCode, 422)
      assert.match(unknown.body, /id="event_types"[^>]*aria-invalid="true"/)
      assert.match(unknown.body, /Event types is not an event type/)
      const malformed = await post(t, admin.cookie, '/auth/admin/webhooks', { url: 'https://93.184.215.14/x', event_types: 'USER!' })
      assert.equal(malformed.statusCode, 422)
      assert.match(malformed.body, /id="event_types"[^>]*aria-invalid="true"/)
      assert.equal((await hooks()).length, before, 'nothing was created')
    })

    it('disables and enables an endpoint, rotates its secret (shown once) and deletes it after a confirmation naming the URL', async () => {
      const url = `https://93.184.215.14/${uniqueName('life')}`
      const made = await post(t, admin.cookie, '/auth/admin/webhooks', { url })
      const first = secretOf(made.body)!
      const { id } = (await hooks()).find(h => h.url === url)!
      const page = `/auth/admin/webhooks/${id}`

      const disabled = await post(t, admin.cookie, `${page}/disable`, {})
      assert.equal(disabled.statusCode, 303)
      assert.equal(disabled.headers.location, `${page}?done=webhook-disabled`)
      assert.equal((await hooks()).find(h => h.id === id)!.enabled, false)
      const shown = await get(t, admin.cookie, String(disabled.headers.location))
      assert.match(shown.body, /Endpoint disabled/)
      assert.match(shown.body, /disabled by an admin/)
      assert.match(shown.body, new RegExp(`action="${page}/enable"`))
      assert.equal((await post(t, admin.cookie, `${page}/enable`, {})).statusCode, 303)
      assert.equal((await hooks()).find(h => h.id === id)!.enabled, true)

      const rotated = await post(t, admin.cookie, `${page}/rotate`, {})
      assert.equal(rotated.statusCode, 200)
      const second = secretOf(rotated.body)
      assert.ok(second !== undefined && second !== first, 'a new secret, shown on the answer')
      assert.match(rotated.body, /also signed with the previous secret until/)
      assert.equal((await eventsOf(t, `type=webhook.secret_rotated&target_id=${id}`)).length, 1)
      assert.ok(!(await get(t, admin.cookie, page)).body.includes(second))

      const confirm = await get(t, admin.cookie, `${page}/delete`)
      assert.equal(confirm.statusCode, 200)
      assert.ok(confirm.body.includes(`Delete the endpoint ${url}?`), 'the confirmation names the URL')
      assert.equal((await hooks()).some(h => h.id === id), true, 'opening the confirmation deletes nothing')
      const deleted = await post(t, admin.cookie, `${page}/delete`, {})
      assert.equal(deleted.statusCode, 303)
      assert.equal(deleted.headers.location, `/auth/admin/webhooks?done=deleted&url=${encodeURIComponent(url)}`)
      assert.equal((await hooks()).some(h => h.id === id), false)
      assert.match((await get(t, admin.cookie, String(deleted.headers.location))).body, new RegExp(`Deleted the endpoint ${url}`))
      assert.equal((await get(t, admin.cookie, page)).statusCode, 404)
    })

    it('refuses webhook form posts from another site (CSRF) and from a non-admin, changing nothing', async () => {
      const url = `https://93.184.215.14/${uniqueName('csrf')}`
      for (const headers of [{ origin: 'https://evil.example' }, {}, { 'sec-fetch-site': 'cross-site' }] as Array<Record<string, string>>) {
        const res = await post(t, admin.cookie, '/auth/admin/webhooks', { url }, headers)
        assert.equal(res.statusCode, 403, JSON.stringify(headers))
      }
      assert.equal((await hooks()).some(h => h.url === url), false)
      assert.equal((await post(t, admin.cookie, '/auth/admin/webhooks', { url })).statusCode, 201)
      const { id } = (await hooks()).find(h => h.url === url)!
      for (const action of ['disable', 'rotate', 'delete', 'ping']) {
        assert.equal((await post(t, admin.cookie, `/auth/admin/webhooks/${id}/${action}`, {}, { origin: 'https://evil.example' })).statusCode, 403, action)
        assert.equal((await post(t, plain.cookie, `/auth/admin/webhooks/${id}/${action}`, {})).statusCode, 403, action)
      }
      assert.equal((await get(t, plain.cookie, `/auth/admin/webhooks/${id}`)).statusCode, 403)
      assert.equal((await hooks()).find(h => h.id === id)!.enabled, true)
      assert.equal((await eventsOf(t, `type=webhook.secret_rotated&target_id=${id}`)).length, 0)
    })

    it('escapes the URL and description everywhere they are shown', async () => {
      // The API's URL format admits & and ' but no < > or "; a typed URL with those comes back on the refused form.
      const url = `https://93.184.215.14/${uniqueName('esc')}?a=1&b='x'`
      const description = '<b>bold</b> "quoted" </td><script>alert(3)</script>'
      const made = await post(t, admin.cookie, '/auth/admin/webhooks', { url, description })
      assert.equal(made.statusCode, 201, made.body)
      const { id } = (await hooks()).find(h => h.description === description)!
      const pages = [made.body]
      for (const path of ['/auth/admin/webhooks', `/auth/admin/webhooks/${id}`, `/auth/admin/webhooks/${id}/delete`]) {
        const res = await get(t, admin.cookie, path)
        assert.equal(res.statusCode, 200, path)
        pages.push(res.body)
      }
      pages.push((await post(t, admin.cookie, `/auth/admin/webhooks/${id}/rotate`, {})).body)
      const refused = await post(t, admin.cookie, '/auth/admin/webhooks', { url: 'http://127.0.0.1/"><script>alert(4)</script>', description })
      assert.equal(refused.statusCode, 422)
      pages.push(refused.body)
      for (const body of pages) {
        assert.doesNotMatch(body, /<script>|<img|<b>bold/)
        assert.ok(body.includes('&#60;b&#62;bold&#60;/b&#62;'), 'the description is shown, escaped')
      }
      for (const body of pages.slice(0, -1)) {
        assert.ok(body.includes('?a=1&#38;b=&#39;x&#39;'), 'the URL is shown, escaped')
        assert.ok(!body.includes('?a=1&b=\'x\''), 'never raw')
      }
      assert.ok(refused.body.includes('value="http://127.0.0.1/&#34;&#62;&#60;script&#62;alert(4)&#60;/script&#62;"'), 'the typed URL, escaped')
      const deleted = await post(t, admin.cookie, `/auth/admin/webhooks/${id}/delete`, {})
      const notice = await get(t, admin.cookie, String(deleted.headers.location))
      assert.doesNotMatch(notice.body, /<script>|<img/)
      assert.match(notice.body, /Deleted the endpoint https:\/\/93\.184\.215\.14/)
    })
  })
}
