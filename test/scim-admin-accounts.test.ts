/**
 * Only an admin credential changes an admin account (users.lifecycle.ts,
 * assertMayChangeAccount), at every door: a `scim` key is an identity
 * provider's, not an admin's, so through SCIM an admin is neither changed,
 * disabled nor deleted, nor added to, removed from or renamed with a group;
 * a `users:write` key is refused the same through the REST API.
 */
import assert from 'node:assert/strict'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const GROUP = 'urn:ietf:params:scim:schemas:core:2.0:Group'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'
const ERROR = 'urn:ietf:params:scim:api:messages:2.0:Error'

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

for (const dialect of dialects()) {
  describe(`admin accounts are changed by admin credentials only, through SCIM as through REST (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let scimKey = ''
    let writerKey = ''
    const scim = async (method: Method, path: string, payload?: object): Promise<LightMyRequestResponse> =>
      await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${scimKey}`, 'content-type': 'application/scim+json' },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
    const api = async (key: string, method: Method, url: string, payload?: object): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method, url, headers: auth(key), ...(payload !== undefined ? { payload } : {}) })
    const patch = (...operations: object[]): object => ({ schemas: [PATCH_OP], Operations: operations })
    const user = async (id: string): Promise<Record<string, any>> => (await api(t.adminKey, 'GET', `/auth/api/users/${id}`)).json()

    const assertScimForbidden = (res: LightMyRequestResponse, username: string, what: string): void => {
      assert.equal(res.statusCode, 403, `${what}: ${res.body}`)
      assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
      assert.deepEqual(res.json(), { schemas: [ERROR], status: '403', detail: `Only an admin may change an admin account; ${username} is an admin.` }, what)
    }

    let admin: Record<string, any>
    let member: Record<string, any>
    let groupId = ''

    before(async () => {
      const scimMade = await api(t.adminKey, 'POST', '/auth/api/api-keys', { name: 'idp', scopes: ['scim'] })
      scimKey = scimMade.json().key
      const writerMade = await api(t.adminKey, 'POST', '/auth/api/api-keys', { name: 'writer', scopes: ['users:write'] })
      writerKey = writerMade.json().key
      const made = await api(t.adminKey, 'POST', '/auth/api/users', { username: uniqueName('boss'), first_name: 'Grace', last_name: 'Hopper', password: GOOD_PASSWORD, role: 'admin' })
      assert.equal(made.statusCode, 201, made.body)
      admin = made.json()
      member = (await api(t.adminKey, 'POST', '/auth/api/users', { username: uniqueName('staff') })).json()
      const group = await scim('POST', '/Groups', { schemas: [GROUP], displayName: uniqueName('team'), members: [{ value: member.id }] })
      assert.equal(group.statusCode, 201, group.body)
      groupId = group.json().id
    })

    it('refuses through SCIM to add an admin to a group (403), and the admin keeps their groups', async () => {
      const res = await scim('PATCH', `/Groups/${groupId}`, patch({ op: 'add', path: 'members', value: [{ value: admin.id }] }))
      assertScimForbidden(res, admin.username, 'add')
      assert.deepEqual((await user(admin.id)).groups, [])
      const put = await scim('PUT', `/Groups/${groupId}`, { schemas: [GROUP], displayName: (await scim('GET', `/Groups/${groupId}`)).json().displayName, members: [{ value: member.id }, { value: admin.id }] })
      assertScimForbidden(put, admin.username, 'PUT with the admin among the members')
      assert.deepEqual((await user(admin.id)).groups, [])
    })

    it('refuses through SCIM to remove an admin from a group or rename a group that holds one (403)', async () => {
      const joined = await api(t.adminKey, 'POST', `/auth/api/groups/${groupId}/members`, { user_ids: [admin.id] })
      assert.equal(joined.statusCode, 200, joined.body)
      const name = (await scim('GET', `/Groups/${groupId}`)).json().displayName as string
      assertScimForbidden(await scim('PATCH', `/Groups/${groupId}`, patch({ op: 'remove', path: `members[value eq "${admin.id as string}"]` })), admin.username, 'remove by filter')
      assertScimForbidden(await scim('PATCH', `/Groups/${groupId}`, patch({ op: 'remove', path: 'members', value: [{ value: admin.id }] })), admin.username, 'remove by value')
      assertScimForbidden(await scim('PATCH', `/Groups/${groupId}`, patch({ op: 'replace', path: 'members', value: [{ value: member.id }] })), admin.username, 'replace of the members')
      assertScimForbidden(await scim('PATCH', `/Groups/${groupId}`, patch({ op: 'replace', path: 'displayName', value: uniqueName('renamed') })), admin.username, 'rename by PATCH')
      assertScimForbidden(await scim('PUT', `/Groups/${groupId}`, { schemas: [GROUP], displayName: uniqueName('renamed'), members: [{ value: member.id }, { value: admin.id }] }), admin.username, 'rename by PUT')
      assertScimForbidden(await scim('DELETE', `/Groups/${groupId}`), admin.username, 'delete of the group')
      assert.deepEqual((await user(admin.id)).groups, [name])
      assert.equal((await scim('GET', `/Groups/${groupId}`)).json().displayName, name)
      // REST with a users:write key refuses the same, as it did.
      for (const [method, url, body] of [
        ['DELETE', `/auth/api/groups/${groupId}/members/${admin.id as string}`, undefined],
        ['PATCH', `/auth/api/groups/${groupId}`, { display_name: uniqueName('renamed') }],
        ['PUT', `/auth/api/groups/${groupId}/members`, { user_ids: [member.id] }]
      ] as const) {
        const res = await api(writerKey, method, url, body)
        assert.equal(res.statusCode, 403, `${method} ${url}: ${res.body}`)
        assert.equal(res.json().code, 'forbidden')
      }
      assert.deepEqual((await user(admin.id)).groups, [name])
    })

    it('refuses through SCIM a PUT of an admin with only userName (403), which would clear their names', async () => {
      const before = await user(admin.id)
      const res = await scim('PUT', `/Users/${admin.id as string}`, { schemas: [USER], userName: admin.username })
      assertScimForbidden(res, admin.username, 'PUT')
      const after = await user(admin.id)
      assert.deepEqual([after.first_name, after.last_name, after.updated_at], ['Grace', 'Hopper', before.updated_at])
    })

    it('refuses through SCIM any PATCH that changes an admin, a disable and a delete included (403); a PUT of the admin as they are changes nothing (200)', async () => {
      const before = await user(admin.id)
      for (const operation of [
        { op: 'replace', path: 'displayName', value: 'Boss' },
        { op: 'replace', path: 'userName', value: uniqueName('taken') },
        { op: 'replace', path: 'emails', value: [{ value: 'attacker@evil.example', primary: true }] },
        { op: 'replace', path: 'password', value: `${GOOD_PASSWORD} mine` },
        { op: 'replace', value: { active: false } }
      ]) {
        assertScimForbidden(await scim('PATCH', `/Users/${admin.id as string}`, patch(operation)), admin.username, JSON.stringify(operation))
      }
      assertScimForbidden(await scim('DELETE', `/Users/${admin.id as string}`), admin.username, 'DELETE')
      const read = (await scim('GET', `/Users/${admin.id as string}`)).json()
      const same = await scim('PUT', `/Users/${admin.id as string}`, { schemas: read.schemas, userName: read.userName, name: read.name, active: read.active })
      assert.equal(same.statusCode, 200, same.body)
      const after = await user(admin.id)
      assert.deepEqual([after.username, after.email, after.disabled, after.updated_at], [before.username, before.email, false, before.updated_at])
      // REST with a users:write key refuses a change of the admin, as it did.
      const rest = await api(writerKey, 'PATCH', `/auth/api/users/${admin.id as string}`, { first_name: 'Mallory' })
      assert.equal(rest.statusCode, 403, rest.body)
      assert.equal((await api(writerKey, 'DELETE', `/auth/api/users/${admin.id as string}`)).statusCode, 403)
    })

    it('still changes and re-groups a user who is no admin through SCIM', async () => {
      const named = await scim('PATCH', `/Users/${member.id as string}`, patch({ op: 'replace', path: 'displayName', value: 'Staff' }))
      assert.equal(named.statusCode, 200, named.body)
      const renamed = uniqueName('staff-team')
      const other = await scim('POST', '/Groups', { schemas: [GROUP], displayName: renamed, members: [{ value: member.id }] })
      assert.equal(other.statusCode, 201, other.body)
      const changed = await scim('PATCH', `/Groups/${other.json().id as string}`, patch({ op: 'replace', path: 'displayName', value: `${renamed}-2` }))
      assert.equal(changed.statusCode, 204, changed.body)
      assert.ok((await user(member.id)).groups.includes(`${renamed}-2`))
    })
  })
}
