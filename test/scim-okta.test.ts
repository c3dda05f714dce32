/**
 * Okta's provisioning, request by request as Okta's SCIM 2.0 guide
 * ("Okta and SCIM Version 2.0", developer.okta.com) shows them: the test of
 * the connection, the lookup by userName before a create, the create (with
 * the password Okta sends when "Sync Password" is on), profile updates by
 * PUT, deactivation and reactivation by PATCH (and by PUT, as integrations
 * without PATCH get them), and Group Push. Bodies are the guide's examples,
 * with names of this test's own.
 */
import assert from 'node:assert/strict'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const GROUP = 'urn:ietf:params:scim:schemas:core:2.0:Group'
const LIST = 'urn:ietf:params:scim:api:messages:2.0:ListResponse'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'

for (const dialect of dialects()) {
  describe(`Okta's provisioning sequence (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let token = ''
    const okta = async (method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', path: string, payload?: object): Promise<LightMyRequestResponse> =>
      await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        // What Okta sends: the token as a bearer header, JSON in SCIM's media type.
        headers: { authorization: `Bearer ${token}`, accept: 'application/scim+json', 'content-type': 'application/scim+json; charset=utf-8', 'user-agent': 'Okta SCIM Client 1.0.0' },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
    const restUser = async (id: string): Promise<Record<string, any>> => (await t.app.inject({ method: 'GET', url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()
    const userName = `${uniqueName('test.user')}@okta.local`
    let userId = ''

    before(async () => {
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'Okta provisioning', scopes: ['scim'] } })
      assert.equal(made.statusCode, 201, made.body)
      token = made.json().key
    })

    it('answers the test of the connection, GET /Users?startIndex=1&count=2, with a list response', async () => {
      const res = await okta('GET', '/Users?startIndex=1&count=2')
      assert.equal(res.statusCode, 200, res.body)
      assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
      const body = res.json()
      assert.deepEqual(body.schemas, [LIST])
      assert.equal(body.startIndex, 1)
      assert.ok(body.itemsPerPage <= 2)
      assert.equal(typeof body.totalResults, 'number')
      assert.ok(Array.isArray(body.Resources))
    })

    it('finds no user for the userName Okta looks up before creating one', async () => {
      const res = await okta('GET', `/Users?filter=${encodeURIComponent(`userName eq "${userName}"`)}&startIndex=1&count=100`)
      assert.equal(res.statusCode, 200)
      assert.deepEqual(res.json(), { schemas: [LIST], totalResults: 0, startIndex: 1, itemsPerPage: 0, Resources: [] })
    })

    it('creates the user Okta posts (201), with Okta\'s id as externalId, and finds it by userName afterwards', async () => {
      const res = await okta('POST', '/Users', {
        schemas: [USER],
        userName,
        name: { givenName: 'Test', familyName: 'User' },
        emails: [{ primary: true, value: userName, type: 'work' }],
        displayName: 'Test User',
        locale: 'en-US',
        externalId: '00ujl29u0le5T6Aj10h7',
        groups: [],
        password: GOOD_PASSWORD,
        active: true
      })
      assert.equal(res.statusCode, 201, res.body)
      const user = res.json()
      userId = user.id
      assert.equal(res.headers.location, user.meta.location)
      assert.deepEqual([user.userName, user.active, user.externalId, user.name.givenName, user.displayName], [userName, true, '00ujl29u0le5T6Aj10h7', 'Test', 'Test User'])
      assert.equal('password' in user, false)
      const found = await okta('GET', `/Users?filter=${encodeURIComponent(`userName eq "${userName}"`)}&startIndex=1&count=100`)
      assert.deepEqual(found.json().Resources.map((r: { id: string }) => r.id), [userId])
      assert.equal((await okta('GET', `/Users/${userId}`)).json().id, userId)
    })

    it('takes a profile update by PUT of the whole user', async () => {
      const current = (await okta('GET', `/Users/${userId}`)).json()
      const res = await okta('PUT', `/Users/${userId}`, { ...current, name: { givenName: 'Another', familyName: 'User' }, displayName: 'Another User' })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().name.givenName, 'Another')
      assert.equal((await restUser(userId)).first_name, 'Another')
    })

    it('deactivates with PATCH {"op":"replace","value":{"active":false}} (200 with the user), ending the user\'s sessions', async () => {
      const session = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: userName, password: GOOD_PASSWORD } })
      assert.equal(session.statusCode, 200, session.body)
      const res = await okta('PATCH', `/Users/${userId}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: false } }] })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().active, false)
      assert.equal((await restUser(userId)).disabled, true)
      const me = await t.app.inject({ method: 'GET', url: '/auth/api/me', headers: { authorization: `Bearer ${session.json().token as string}` } })
      assert.equal(me.statusCode, 401, 'the session ended with the deactivation')
    })

    it('reactivates with PATCH active true, and the user signs in again', async () => {
      const res = await okta('PATCH', `/Users/${userId}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: true } }] })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().active, true)
      const session = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: userName, password: GOOD_PASSWORD } })
      assert.equal(session.statusCode, 200, session.body)
    })

    it('deactivates and reactivates by PUT with active, as integrations without PATCH get it', async () => {
      const current = (await okta('GET', `/Users/${userId}`)).json()
      const off = await okta('PUT', `/Users/${userId}`, { ...current, active: false })
      assert.equal(off.statusCode, 200, off.body)
      assert.equal((await restUser(userId)).disabled, true)
      const on = await okta('PUT', `/Users/${userId}`, { ...current, active: true })
      assert.equal(on.json().active, true)
      assert.equal((await restUser(userId)).disabled, false)
    })

    it('pushes a group: creates it, renames it, adds and removes a member, and deletes it', async () => {
      const name = uniqueName('Test SCIMv2')
      const lookup = await okta('GET', `/Groups?filter=${encodeURIComponent(`displayName eq "${name}"`)}&startIndex=1&count=100`)
      assert.equal(lookup.json().totalResults, 0)
      const made = await okta('POST', '/Groups', { schemas: [GROUP], displayName: name, members: [] })
      assert.equal(made.statusCode, 201, made.body)
      const groupId = made.json().id as string

      const renamed = `${name} renamed`
      const rename = await okta('PATCH', `/Groups/${groupId}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { id: groupId, displayName: renamed } }] })
      assert.equal(rename.statusCode, 204, rename.body)

      const add = await okta('PATCH', `/Groups/${groupId}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: [{ value: userId, display: userName }] }] })
      assert.equal(add.statusCode, 204, add.body)
      assert.deepEqual((await restUser(userId)).groups, [renamed])
      const read = (await okta('GET', `/Groups/${groupId}?excludedAttributes=members`)).json()
      assert.deepEqual([read.displayName, read.members], [renamed, undefined])

      const remove = await okta('PATCH', `/Groups/${groupId}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: `members[value eq "${userId}"]` }] })
      assert.equal(remove.statusCode, 204, remove.body)
      assert.deepEqual((await restUser(userId)).groups, [])

      assert.equal((await okta('DELETE', `/Groups/${groupId}`)).statusCode, 204)
      assert.equal((await okta('GET', `/Groups/${groupId}`)).statusCode, 404)
    })

    it('deletes the user when Okta sends DELETE', async () => {
      assert.equal((await okta('DELETE', `/Users/${userId}`)).statusCode, 204)
      assert.equal((await okta('GET', `/Users/${userId}`)).statusCode, 404)
    })
  })
}
