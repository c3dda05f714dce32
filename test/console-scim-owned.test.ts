import { strict as assert } from 'node:assert'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const ORIGIN = 'http://localhost:80'
const FORM = 'application/x-www-form-urlencoded'
const USER = 'urn:ietf:params:scim:schemas:core:2.0:User'

/** The hidden and visible fields of the console's edit form, as a browser would send them unchanged. */
function formFieldsOf (page: string): Record<string, string> {
  const form = /<form method="post" action="[^"]*\/admin\/users\/[^"/]+" novalidate>([\s\S]*?)<\/form>/.exec(page)
  assert.ok(form !== null, 'the page has the edit form')
  const fields: Record<string, string> = {}
  for (const match of form[1]!.matchAll(/<input ([^>]*)>/g)) {
    const attributes = match[1]!
    const name = /name="([^"]*)"/.exec(attributes)?.[1]
    if (name === undefined || /(^|\s)disabled(\s|$)/.test(attributes)) continue
    if (/type="checkbox"/.test(attributes) && !/\bchecked\b/.test(attributes)) continue
    fields[name] = (/value="([^"]*)"/.exec(attributes)?.[1] ?? '').replaceAll('&amp;', '&').replaceAll('&#39;', '\'').replaceAll('&quot;', '"').replaceAll('&lt;', '<').replaceAll('&gt;', '>')
  }
  const role = /<select id="role" name="role">[\s\S]*?<option value="([^"]*)" selected>/.exec(form[1]!)
  if (role !== null) fields.role = role[1]!
  return fields
}

for (const dialect of dialects()) {
  describe(`the console and a user an identity provider provisions through SCIM (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let cookie = ''
    let scimToken = ''
    let provisionedId = ''
    let localId = ''

    const post = async (url: string, fields: Record<string, string>): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method: 'POST', url, headers: { cookie, origin: ORIGIN, 'content-type': FORM }, payload: new URLSearchParams(fields).toString() })
    const page = async (id: string): Promise<string> => {
      const res = await t.app.inject({ url: `/auth/admin/users/${id}`, headers: { cookie } })
      assert.equal(res.statusCode, 200, res.body)
      return res.body
    }
    const restUser = async (id: string): Promise<Record<string, any>> => (await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()

    before(async () => {
      const admin = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('admin'), role: 'admin', password: GOOD_PASSWORD } })
      assert.equal(admin.statusCode, 201, admin.body)
      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: admin.json().username, password: GOOD_PASSWORD } })
      assert.equal(login.statusCode, 200, login.body)
      cookie = `gatehouse_session=${login.json().token as string}`
      const key = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'Okta provisioning', scopes: ['scim'] } })
      assert.equal(key.statusCode, 201, key.body)
      scimToken = key.json().key
      const made = await t.app.inject({
        method: 'POST',
        url: '/auth/scim/v2/Users',
        headers: { authorization: `Bearer ${scimToken}`, 'content-type': 'application/scim+json' },
        payload: JSON.stringify({ schemas: [USER], userName: uniqueName('okta.user'), externalId: '00u1abcd', name: { givenName: 'Ada', familyName: 'Lovelace' }, emails: [{ value: 'ada@example.com', primary: true }], active: true })
      })
      assert.equal(made.statusCode, 201, made.body)
      provisionedId = made.json().id
      const local = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('local'), email: 'local@example.com' } })
      assert.equal(local.statusCode, 201, local.body)
      localId = local.json().id
    })

    it('shows the fields the IdP keeps read-only, with a line naming the IdP (its SCIM key), and no Disable button', async () => {
      const html = await page(provisionedId)
      assert.match(html, /<p id="idp-owned">Okta provisioning provisions \S+ through SCIM and keeps their username, email, names and whether the account is disabled/)
      for (const name of ['username', 'email', 'first_name', 'last_name']) {
        assert.match(html, new RegExp(`<input id="${name}" name="${name}" [^>]*\\breadonly\\b`), `${name} is read-only`)
      }
      assert.match(html, /<input type="checkbox" value="true" disabled/)
      assert.doesNotMatch(html, /action="[^"]*\/disable"/)
      assert.doesNotMatch(html, /<select id="role" name="role" disabled/, 'the role stays editable')
      assert.match(html, /managed by Okta provisioning through SCIM; externalId <code>00u1abcd<\/code>/)
    })

    it('keeps every field editable for a user no IdP provisions', async () => {
      const html = await page(localId)
      assert.doesNotMatch(html, /\breadonly\b/)
      assert.doesNotMatch(html, /id="idp-owned"/)
      assert.match(html, /action="[^"]*\/disable"/)
    })

    it('saves a role change made in the form as the browser sends it, and leaves the IdP\'s fields alone', async () => {
      const fields = { ...formFieldsOf(await page(provisionedId)), role: 'admin' }
      const res = await post(`/auth/admin/users/${provisionedId}`, fields)
      assert.equal(res.statusCode, 303, res.body)
      const user = await restUser(provisionedId)
      assert.equal(user.role, 'admin')
      assert.equal(user.email, 'ada@example.com')
      assert.equal(user.first_name, 'Ada')
      const back = await post(`/auth/admin/users/${provisionedId}`, { ...formFieldsOf(await page(provisionedId)), role: 'user' })
      assert.equal(back.statusCode, 303, back.body)
    })

    it('refuses a form that changes a field the IdP keeps (409, nothing written), naming the field and the IdP', async () => {
      const before = await restUser(provisionedId)
      const fields = { ...formFieldsOf(await page(provisionedId)), email: 'changed@example.com', last_name: 'Byron', role: 'admin' }
      const res = await post(`/auth/admin/users/${provisionedId}`, fields)
      assert.equal(res.statusCode, 409)
      assert.match(res.body, /The email, the last name are kept by Okta provisioning, which provisions this user through SCIM: change it there/)
      assert.deepEqual(await restUser(provisionedId), before)
    })

    it('refuses the same change without the form\'s original values, and accepts such a form when the IdP\'s fields are as stored', async () => {
      const { was_username: _u, was_email: _e, was_first_name: _f, was_last_name: _l, was_role: _r, was_groups: _g, was_disabled: _d, ...plain } = formFieldsOf(await page(provisionedId))
      const refused = await post(`/auth/admin/users/${provisionedId}`, { ...plain, username: 'someone.else' })
      assert.equal(refused.statusCode, 409)
      assert.match(refused.body, /The username is kept by Okta provisioning/)
      const saved = await post(`/auth/admin/users/${provisionedId}`, plain)
      assert.equal(saved.statusCode, 303, saved.body)
    })

    it('refuses the Disable action for a provisioned user, and takes the IdP\'s own deactivation', async () => {
      const refused = await post(`/auth/admin/users/${provisionedId}/disable`, {})
      assert.equal(refused.statusCode, 409)
      assert.match(refused.body, /Whether the account is disabled is kept by Okta provisioning/)
      assert.equal((await restUser(provisionedId)).disabled, false)
      const deactivated = await t.app.inject({
        method: 'PATCH',
        url: `/auth/scim/v2/Users/${provisionedId}`,
        headers: { authorization: `Bearer ${scimToken}`, 'content-type': 'application/scim+json' },
        payload: JSON.stringify({ schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', path: 'active', value: false }] })
      })
      assert.equal(deactivated.statusCode, 200, deactivated.body)
      const html = await page(provisionedId)
      assert.match(html, /<input type="checkbox" value="true" disabled aria-describedby="disabled-hint" checked>/)
      assert.match(html, /<input type="hidden" name="disabled" value="true">/)
      const saved = await post(`/auth/admin/users/${provisionedId}`, { ...formFieldsOf(html), groups: '' })
      assert.equal(saved.statusCode, 303, saved.body)
      assert.equal((await restUser(provisionedId)).disabled, true, 'the unchanged form keeps the account disabled')
    })
  })
}
