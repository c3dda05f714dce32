import assert from 'node:assert/strict'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const GROUP = 'urn:ietf:params:scim:schemas:core:2.0:Group'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'
const ERROR = 'urn:ietf:params:scim:api:messages:2.0:Error'

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

function patch (...operations: object[]): object {
  return { schemas: [PATCH_OP], Operations: operations }
}

for (const dialect of dialects()) {
  describe(`SCIM 2.0 at /auth/scim/v2 (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let key = ''
    let keyId = ''

    const scim = async (method: Method, path: string, payload?: object, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> =>
      await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/scim+json', ...headers },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
    const api = async (method: Method, url: string, payload?: object): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method, url, headers: auth(t.adminKey), ...(payload !== undefined ? { payload } : {}) })
    const createUser = async (fields: Record<string, unknown> = {}): Promise<Record<string, any>> => {
      const userName = uniqueName('scim')
      const res = await scim('POST', '/Users', { schemas: [USER], userName, name: { givenName: 'Ada', familyName: 'Lovelace' }, emails: [{ value: `${userName}@corp.example`, type: 'work', primary: true }], active: true, ...fields })
      assert.equal(res.statusCode, 201, res.body)
      return res.json()
    }
    const list = async (query: string): Promise<Record<string, any>> => {
      const res = await scim('GET', `/Users?${query}`)
      assert.equal(res.statusCode, 200, res.body)
      return res.json()
    }
    const filterIds = async (filter: string): Promise<string[]> =>
      ((await list(`filter=${encodeURIComponent(filter)}&count=1000`)).Resources as Array<{ id: string }>).map(r => r.id).sort()

    before(async () => {
      const made = await api('POST', '/auth/api/api-keys', { name: 'okta', scopes: ['scim'] })
      assert.equal(made.statusCode, 201, made.body)
      key = made.json().key
      keyId = made.json().id
    })

    describe('who reaches it', () => {
      it('answers a request without a credential 401 with a SCIM error body and a challenge', async () => {
        const res = await t.app.inject({ method: 'GET', url: '/auth/scim/v2/Users' })
        assert.equal(res.statusCode, 401)
        assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
        assert.match(String(res.headers['www-authenticate']), /Bearer/)
        assert.deepEqual(Object.keys(res.json()).sort(), ['detail', 'schemas', 'status'])
        assert.deepEqual(res.json().schemas, [ERROR])
        assert.equal(res.json().status, '401')
      })

      it('refuses every other key, an admin key included (403)', async () => {
        const writer = await api('POST', '/auth/api/api-keys', { name: 'writer', scopes: ['users:read', 'users:write'] })
        for (const other of [t.adminKey, writer.json().key as string]) {
          const res = await t.app.inject({ method: 'GET', url: '/auth/scim/v2/Users', headers: { authorization: `Bearer ${other}` } })
          assert.equal(res.statusCode, 403, res.body)
          assert.equal(res.json().status, '403')
        }
      })

      it('lets a scim key reach nothing else, not even what any credential may call', async () => {
        for (const url of ['/auth/api/users', '/auth/api/events', '/auth/api/me', '/auth/api/api-keys']) {
          const res = await t.app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${key}` } })
          assert.equal(res.statusCode, 403, `${url}: ${res.body}`)
          assert.equal(res.json().code, 'forbidden')
        }
      })

      it('makes scim a scope of its own: a key cannot hold it with another (422)', async () => {
        const res = await api('POST', '/auth/api/api-keys', { name: 'both', scopes: ['scim', 'admin'] })
        assert.equal(res.statusCode, 422, res.body)
        assert.equal(res.json().errors[0].pointer, '/scopes')
      })
    })

    describe('discovery', () => {
      it('answers /ServiceProviderConfig and Microsoft\'s older /serviceConfiguration alike', async () => {
        const a = await scim('GET', '/ServiceProviderConfig')
        const b = await scim('GET', '/serviceConfiguration')
        assert.equal(a.statusCode, 200)
        assert.deepEqual(a.json(), b.json())
        const config = a.json()
        assert.equal(config.patch.supported, true)
        assert.equal(config.filter.supported, true)
        assert.equal(config.bulk.supported, false)
        assert.equal(config.etag.supported, true)
        assert.equal(config.changePassword.supported, true)
      })

      it('lists the User and Group resource types and schemas, with exactly the attributes a user returns', async () => {
        const types = (await scim('GET', '/ResourceTypes')).json()
        assert.deepEqual(types.Resources.map((r: { endpoint: string }) => r.endpoint), ['/Users', '/Groups'])
        const schemas = (await scim('GET', '/Schemas')).json()
        const user = schemas.Resources.find((s: { id: string }) => s.id === USER)
        const advertised = user.attributes.filter((a: { returned: string }) => a.returned !== 'never').map((a: { name: string }) => a.name).sort()
        const full = await createUser({ externalId: 'ext-1', displayName: 'Ada L', name: { givenName: 'Ada', familyName: 'Lovelace', formatted: 'Ada Lovelace' } })
        const group = await scim('POST', '/Groups', { schemas: [GROUP], displayName: uniqueName('g'), members: [{ value: full.id }] })
        assert.equal(group.statusCode, 201, group.body)
        const read = (await scim('GET', `/Users/${full.id}`)).json()
        const returned = Object.keys(read).filter(k => !['schemas', 'id', 'externalId', 'meta'].includes(k)).sort()
        assert.deepEqual(returned, advertised)
        assert.equal((await scim('GET', `/Schemas/${USER}`)).json().id, USER)
        assert.equal((await scim('GET', '/Schemas/urn:nope')).statusCode, 404)
      })

      it('routes endpoint names in any case, as Microsoft\'s collection sends them', async () => {
        assert.equal((await scim('GET', '/users?count=1')).statusCode, 200)
        assert.equal((await scim('GET', '/GROUPS?count=1')).statusCode, 200)
      })
    })

    describe('users', () => {
      it('creates a user as the mapping says: userName, names, primary email, externalId, active, meta', async () => {
        const created = await createUser({ externalId: 'okta-00u1', displayName: 'Ada', name: { givenName: 'Ada', familyName: 'Lovelace', formatted: 'Ada Lovelace' } })
        assert.equal(created.meta.resourceType, 'User')
        assert.equal(created.meta.version, 'W/"1"')
        assert.equal(created.meta.location, `http://localhost:80/auth/scim/v2/Users/${created.id}`)
        const user = (await api('GET', `/auth/api/users/${created.id}`)).json()
        assert.deepEqual(
          [user.username, user.first_name, user.last_name, user.email, user.disabled, user.role],
          [created.userName, 'Ada', 'Lovelace', `${created.userName as string}@corp.example`, false, 'user'])
        const [event] = (await api('GET', `/auth/api/events?type=user.created&target_id=${created.id as string}`)).json()
        assert.deepEqual(event.actor, { type: 'api_key', id: keyId })
        assert.equal(event.data.source, 'scim')
        assert.equal(event.data.external_id, 'okta-00u1')
      })

      it('answers in application/scim+json, takes application/json too, and refuses other media types (415)', async () => {
        const created = await createUser()
        const res = await scim('GET', `/Users/${created.id as string}`)
        assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
        assert.equal(res.headers.etag, 'W/"1"')
        const json = await scim('PATCH', `/Users/${created.id as string}`, patch({ op: 'replace', path: 'displayName', value: 'A' }), { 'content-type': 'application/json' })
        assert.equal(json.statusCode, 200, json.body)
        const text = await t.app.inject({ method: 'POST', url: '/auth/scim/v2/Users', headers: { authorization: `Bearer ${key}`, 'content-type': 'text/plain' }, payload: 'userName=x' })
        assert.equal(text.statusCode, 415)
        assert.deepEqual(text.json().schemas, [ERROR])
      })

      it('refuses a second user of the same userName in another case (409 uniqueness), and a missing userName (400 invalidValue)', async () => {
        const created = await createUser()
        const again = await scim('POST', '/Users', { schemas: [USER], userName: (created.userName as string).toUpperCase() })
        assert.equal(again.statusCode, 409)
        assert.equal(again.json().scimType, 'uniqueness')
        const nameless = await scim('POST', '/Users', { schemas: [USER], active: true })
        assert.equal(nameless.statusCode, 400)
        assert.equal(nameless.json().scimType, 'invalidValue')
        const malformed = await t.app.inject({ method: 'POST', url: '/auth/scim/v2/Users', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/scim+json' }, payload: '{"acve": tre' })
        assert.equal(malformed.statusCode, 400)
        assert.equal(malformed.json().scimType, 'invalidSyntax')
      })

      it('keeps an address another user holds in the SCIM emails, and leaves the user\'s email empty', async () => {
        const first = await createUser()
        const second = await createUser({ emails: [{ value: first.emails[0].value, type: 'work', primary: true }] })
        assert.deepEqual(second.emails, [{ value: first.emails[0].value, type: 'work', primary: true }])
        assert.equal((await api('GET', `/auth/api/users/${second.id as string}`)).json().email, null)
      })

      it('takes a password Okta syncs under the REST API\'s rules, never returns it, and a weak one is 400 invalidValue', async () => {
        const userName = uniqueName('pw')
        const res = await scim('POST', '/Users', { schemas: [USER], userName, password: GOOD_PASSWORD })
        assert.equal(res.statusCode, 201, res.body)
        assert.equal(JSON.stringify(res.json()).includes(GOOD_PASSWORD), false)
        const login = async (password: string): Promise<number> =>
          (await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: userName, password } })).statusCode
        assert.equal(await login(GOOD_PASSWORD), 200)
        const weak = await scim('PATCH', `/Users/${res.json().id as string}`, patch({ op: 'replace', path: 'password', value: 'short' }))
        assert.equal(weak.statusCode, 400)
        assert.equal(weak.json().scimType, 'invalidValue')
        const changed = await scim('PATCH', `/Users/${res.json().id as string}`, patch({ op: 'replace', value: { password: `${GOOD_PASSWORD} two`, displayName: 'P' } }))
        assert.equal(changed.statusCode, 200, changed.body)
        assert.equal(changed.json().displayName, 'P')
        assert.equal(await login(GOOD_PASSWORD), 401)
        assert.equal(await login(`${GOOD_PASSWORD} two`), 200)
      })

      it('applies a PATCH that sets a password once: one new version, one user.updated with the password and the other change, one session ended', async () => {
        const userName = uniqueName('pw1')
        const made = await scim('POST', '/Users', { schemas: [USER], userName, password: GOOD_PASSWORD })
        assert.equal(made.statusCode, 201, made.body)
        const id = made.json().id as string
        const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: userName, password: GOOD_PASSWORD } })
        assert.equal(login.statusCode, 200, login.body)
        const res = await scim('PATCH', `/Users/${id}`, patch({ op: 'add', path: 'emails[type eq "work"].value', value: `${userName}@work.example` }, { op: 'replace', path: 'password', value: `${GOOD_PASSWORD} once` }))
        assert.equal(res.statusCode, 200, res.body)
        assert.equal(res.json().meta.version, 'W/"2"')
        assert.deepEqual(res.json().emails, [{ value: `${userName}@work.example`, type: 'work' }])
        const updated = (await api('GET', `/auth/api/events?type=user.updated&target_id=${id}`)).json() as Array<{ data: { changes: Record<string, unknown> } }>
        assert.equal(updated.length, 1)
        assert.deepEqual(Object.keys(updated[0]!.data.changes).sort(), ['email', 'password', 'scim_emails'])
        const endedForUser = (await api('GET', '/auth/api/events?type=session.ended&limit=1000')).json() as Array<{ data: { user_id: string } }>
        assert.equal(endedForUser.filter(e => e.data.user_id === id).length, 1, 'one session.ended for the one session')
      })

      it('replays a create retried with the same Idempotency-Key, and makes one user', async () => {
        const body = { schemas: [USER], userName: uniqueName('idem') }
        const first = await scim('POST', '/Users', body, { 'idempotency-key': 'scim-retry-1' })
        const retry = await scim('POST', '/Users', body, { 'idempotency-key': 'scim-retry-1' })
        assert.equal(first.statusCode, 201)
        assert.equal(retry.statusCode, 201)
        assert.equal(retry.headers['idempotent-replayed'], 'true')
        assert.equal(retry.json().id, first.json().id)
        assert.equal((await filterIds(`userName eq "${body.userName}"`)).length, 1)
      })

      it('answers 404 with a SCIM body for an unknown or malformed id', async () => {
        for (const id of ['01a20efa-0000-7000-8000-000000000000', 'not-a-uuid']) {
          const res = await scim('GET', `/Users/${id}`)
          assert.equal(res.statusCode, 404)
          assert.equal(res.json().status, '404')
        }
      })
    })

    describe('the console', () => {
      it('shows on a user\'s page that SCIM manages them, their externalId and the last provisioning change', async () => {
        const admin = await api('POST', '/auth/api/users', { username: uniqueName('console'), password: GOOD_PASSWORD, role: 'admin' })
        const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: admin.json().username, password: GOOD_PASSWORD } })
        const cookie = `gatehouse_session=${login.json().token as string}`
        const user = await createUser({ externalId: 'okta-<00u9>' })
        const changed = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: 'displayName', value: 'Changed' }))
        const page = await t.app.inject({ method: 'GET', url: `/auth/admin/users/${user.id as string}`, headers: { cookie } })
        assert.equal(page.statusCode, 200, page.body)
        assert.match(page.body, /managed by .+ through SCIM; externalId <code>okta-&#60;00u9&#62;<\/code>/)
        assert.ok(page.body.includes(`last provisioning change <time datetime="${changed.json().meta.lastModified as string}">`), 'the time of the last SCIM change')
        const other = await api('POST', '/auth/api/users', { username: uniqueName('plain') })
        const plain = await t.app.inject({ method: 'GET', url: `/auth/admin/users/${other.json().id as string}`, headers: { cookie } })
        assert.equal(plain.statusCode, 200)
        assert.doesNotMatch(plain.body, /through SCIM/)
      })
    })

    describe('filters, paging and attributes', () => {
      let a: Record<string, any>
      let b: Record<string, any>
      let c: Record<string, any>
      const tag = uniqueName('f')
      before(async () => {
        a = await createUser({ userName: `${tag}.alice`, externalId: `${tag}-A`, displayName: 'Alice', name: { givenName: 'Alice', familyName: tag }, emails: [{ value: `alice@${tag}.example`, type: 'work', primary: true }, { value: `alice@home-${tag}.example`, type: 'home' }] })
        b = await createUser({ userName: `${tag}.bob`, externalId: `${tag}-B`, name: { givenName: 'Bob', familyName: tag }, emails: [{ value: `bob@${tag}.example`, type: 'work', primary: true }], active: false })
        c = await createUser({ userName: `${tag}.carol`, name: { givenName: 'Carol', familyName: tag }, emails: [{ value: `carol@home-${tag}.example`, type: 'home', primary: true }] })
      })
      const ids = (...users: Array<Record<string, any>>): string[] => users.map(u => u.id as string).sort()

      it('finds a userName ignoring case, and an externalId or id exactly', async () => {
        assert.deepEqual(await filterIds(`userName eq "${tag.toUpperCase()}.ALICE"`), ids(a))
        assert.deepEqual(await filterIds(`externalId eq "${tag}-A"`), ids(a))
        assert.deepEqual(await filterIds(`externalId eq "${tag}-a"`), [])
        assert.deepEqual(await filterIds(`id eq "${b.id as string}"`), ids(b))
        assert.deepEqual(await filterIds('id eq "not-a-uuid"'), [])
      })

      it('takes every operator, and, or, not and parentheses, with attribute names in any case', async () => {
        assert.deepEqual(await filterIds(`USERNAME sw "${tag}." and name.GIVENNAME co "o"`), ids(b, c))
        assert.deepEqual(await filterIds(`userName sw "${tag}." and userName ew "e"`), ids(a))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and not (active eq true)`), ids(b))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and (displayName pr or externalId eq "${tag}-B")`), ids(a, b))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and externalId ne "${tag}-A"`), ids(b, c))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and name.givenName gt "B"`), ids(b, c))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and name.givenName le "Bob"`), ids(a, b))
        assert.deepEqual(await filterIds(`name.familyName eq "${tag}" and meta.created ge "${a.meta.created as string}" and meta.lastModified lt "2999-01-01T00:00:00Z"`), ids(a, b, c))
      })

      it('reads a bare word where a quoted value belongs, as Microsoft\'s collection sends it', async () => {
        assert.deepEqual(await filterIds(`name.familyName eq ${tag} and userName sw ${tag}.c`), ids(c))
      })

      it('matches emails, also inside a value filter that binds type and value to the same address', async () => {
        assert.deepEqual(await filterIds(`emails co "home-${tag}"`), ids(a, c))
        assert.deepEqual(await filterIds(`emails[type eq "work" and value co "home-${tag}"]`), [])
        assert.deepEqual(await filterIds(`emails[type eq "home" and value co "home-${tag}"]`), ids(a, c))
        assert.deepEqual(await filterIds(`emails[primary eq true and value sw "carol@"] and name.familyName eq "${tag}"`), ids(c))
        assert.deepEqual(await filterIds(`emails.value eq "BOB@${tag}.EXAMPLE"`), ids(b))
      })

      it('refuses what it cannot filter on, and what is no filter, with 400 invalidFilter', async () => {
        for (const filter of ['title eq "x"', 'userName eq', 'userName xx "a"', 'active eq "yes"', 'groups[value eq "x"]']) {
          const res = await scim('GET', `/Users?filter=${encodeURIComponent(filter)}`)
          assert.equal(res.statusCode, 400, `${filter}: ${res.body}`)
          assert.equal(res.json().scimType, 'invalidFilter', filter)
        }
      })

      it('pages with startIndex and count, counting every match in totalResults', async () => {
        const filter = encodeURIComponent(`name.familyName eq "${tag}"`)
        const page1 = await list(`filter=${filter}&startIndex=1&count=2&sortBy=userName`)
        assert.deepEqual([page1.totalResults, page1.startIndex, page1.itemsPerPage], [3, 1, 2])
        assert.deepEqual(page1.Resources.map((r: { id: string }) => r.id), [a.id, b.id])
        const page2 = await list(`filter=${filter}&startIndex=3&count=2&sortBy=userName`)
        assert.deepEqual(page2.Resources.map((r: { id: string }) => r.id), [c.id])
        const none = await list(`filter=${filter}&count=0`)
        assert.deepEqual([none.totalResults, none.itemsPerPage, none.Resources], [3, 0, []])
        const down = await list(`filter=${filter}&sortBy=name.givenName&sortOrder=descending`)
        assert.deepEqual(down.Resources.map((r: { id: string }) => r.id), [c.id, b.id, a.id])
      })

      it('returns only the attributes asked for (id and schemas always), or all but the excluded ones', async () => {
        const only = await list(`filter=${encodeURIComponent(`userName eq "${a.userName as string}"`)}&attributes=userName,name.givenName,emails[type eq "home"]`)
        assert.deepEqual(only.Resources[0], { schemas: [USER], id: a.id, userName: a.userName, name: { givenName: 'Alice' }, emails: [{ value: `alice@home-${tag}.example`, type: 'home' }] })
        const res = await scim('GET', `/Users/${a.id as string}?excludedAttributes=emails,meta,name.familyName`)
        assert.deepEqual(Object.keys(res.json()).sort(), ['active', 'displayName', 'externalId', 'id', 'name', 'schemas', 'userName'])
        assert.deepEqual(res.json().name, { givenName: 'Alice' })
      })
    })

    describe('PATCH as Okta and Entra send it', () => {
      it('takes op names in any case and active as the strings "False" and "True"', async () => {
        const user = await createUser()
        const off = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'Replace', path: 'active', value: 'False' }))
        assert.equal(off.statusCode, 200, off.body)
        assert.equal(off.json().active, false)
        assert.equal((await api('GET', `/auth/api/users/${user.id as string}`)).json().disabled, true)
        const on = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'REPLACE', path: 'ACTIVE', value: 'True' }))
        assert.equal(on.json().active, true)
      })

      it('applies a path-less replace with an object, whose keys may be paths themselves', async () => {
        const user = await createUser()
        const res = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', value: { active: false, 'name.givenName': 'Augusta', DisplayName: 'Augusta Ada', externalId: 'entra-1' } }))
        assert.equal(res.statusCode, 200, res.body)
        assert.deepEqual([res.json().active, res.json().name.givenName, res.json().name.familyName, res.json().displayName, res.json().externalId], [false, 'Augusta', 'Lovelace', 'Augusta Ada', 'entra-1'])
      })

      it('creates the entry an add on emails[type eq "work"].value names, also for a user with no emails', async () => {
        const user = await createUser({ emails: [] })
        const res = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'add', path: 'emails[type eq "work"].value', value: `${user.userName as string}@work.example` }))
        assert.equal(res.statusCode, 200, res.body)
        assert.deepEqual(res.json().emails, [{ type: 'work', value: `${user.userName as string}@work.example` }])
        assert.equal((await api('GET', `/auth/api/users/${user.id as string}`)).json().email, `${user.userName as string}@work.example`)
        const changed = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: 'emails[type eq "work"].value', value: `${user.userName as string}@new.example` }))
        assert.deepEqual(changed.json().emails, [{ type: 'work', value: `${user.userName as string}@new.example` }])
      })

      it('removes an attribute, and refuses an unknown operation (400 invalidValue)', async () => {
        const user = await createUser()
        const res = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'remove', path: 'name.givenName' }))
        assert.equal(res.statusCode, 200, res.body)
        assert.deepEqual(res.json().name, { familyName: 'Lovelace' })
        const bad = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'move', path: 'userName', value: 'x' }))
        assert.equal(bad.statusCode, 400)
        assert.equal(bad.json().scimType, 'invalidValue')
      })

      it('honours If-Match with the version: a stale one is 412, the current one applies', async () => {
        const user = await createUser()
        const stale = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: 'displayName', value: 'x' }), { 'if-match': 'W/"7"' })
        assert.equal(stale.statusCode, 412)
        const fresh = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: 'displayName', value: 'x' }), { 'if-match': 'W/"1"' })
        assert.equal(fresh.statusCode, 200, fresh.body)
        assert.equal(fresh.headers.etag, 'W/"2"')
        const deleted = await scim('DELETE', `/Users/${user.id as string}`, undefined, { 'if-match': 'W/"1"' })
        assert.equal(deleted.statusCode, 412)
      })

      it('records a change that changes nothing as nothing: no new version, no event', async () => {
        const user = await createUser()
        const res = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: 'active', value: true }))
        assert.equal(res.json().meta.version, 'W/"1"')
        const events = (await api('GET', `/auth/api/events?type=user.updated&target_id=${user.id as string}`)).json()
        assert.deepEqual(events, [])
      })
    })

    describe('groups', () => {
      it('creates a group with members and shows it in each member\'s groups, by SCIM and the REST API', async () => {
        const [u1, u2] = [await createUser(), await createUser()]
        const name = uniqueName('eng')
        const res = await scim('POST', '/Groups', { schemas: [GROUP], displayName: name, externalId: 'grp-1', members: [{ value: u1.id }, { value: u2.id }] })
        assert.equal(res.statusCode, 201, res.body)
        assert.deepEqual(res.json().members.map((m: { value: string }) => m.value).sort(), [u1.id, u2.id].sort())
        assert.deepEqual((await scim('GET', `/Users/${u1.id as string}`)).json().groups, [{ value: res.json().id, display: name, $ref: `http://localhost:80/auth/scim/v2/Groups/${res.json().id as string}` }])
        assert.deepEqual((await api('GET', `/auth/api/users/${u2.id as string}`)).json().groups, [name])
        const found = (await scim('GET', `/Groups?filter=${encodeURIComponent(`displayName eq "${name}"`)}&excludedAttributes=members`)).json()
        assert.deepEqual([found.totalResults, found.Resources[0].members], [1, undefined])
      })

      it('removes only the member Entra names in a remove with a value, and all with a bare remove', async () => {
        const [u1, u2, u3] = [await createUser(), await createUser(), await createUser()]
        const group = (await scim('POST', '/Groups', { schemas: [GROUP], displayName: uniqueName('ops'), members: [{ value: u1.id }, { value: u2.id }, { value: u3.id }] })).json()
        const one = await scim('PATCH', `/Groups/${group.id as string}`, patch({ op: 'Remove', path: 'members', value: [{ value: u2.id }] }))
        assert.equal(one.statusCode, 204, one.body)
        let members = (await scim('GET', `/Groups/${group.id as string}`)).json().members.map((m: { value: string }) => m.value).sort()
        assert.deepEqual(members, [u1.id, u3.id].sort())
        await scim('PATCH', `/Groups/${group.id as string}`, patch({ op: 'remove', path: `members[value eq "${u1.id as string}"]` }))
        members = (await scim('GET', `/Groups/${group.id as string}`)).json().members.map((m: { value: string }) => m.value)
        assert.deepEqual(members, [u3.id])
        const member = await scim('GET', `/Groups?filter=${encodeURIComponent(`id eq "${group.id as string}" and members[value eq "${u3.id as string}"]`)}&excludedAttributes=members`)
        assert.equal(member.json().totalResults, 1)
        await scim('PATCH', `/Groups/${group.id as string}`, patch({ op: 'remove', path: 'members' }))
        assert.deepEqual((await scim('GET', `/Groups/${group.id as string}`)).json().members, [])
        assert.deepEqual((await api('GET', `/auth/api/users/${u3.id as string}`)).json().groups, [])
      })

      it('renames a group in every member\'s groups, and a delete takes it from them', async () => {
        const u1 = await createUser()
        const group = (await scim('POST', '/Groups', { schemas: [GROUP], displayName: uniqueName('old'), members: [{ value: u1.id }] })).json()
        const renamed = uniqueName('new')
        const res = await scim('PATCH', `/Groups/${group.id as string}`, patch({ op: 'replace', value: { displayName: renamed, externalId: 'x-1' } }))
        assert.equal(res.statusCode, 204, res.body)
        assert.deepEqual((await api('GET', `/auth/api/users/${u1.id as string}`)).json().groups, [renamed])
        assert.equal((await scim('DELETE', `/Groups/${group.id as string}`)).statusCode, 204)
        assert.deepEqual((await api('GET', `/auth/api/users/${u1.id as string}`)).json().groups, [])
        assert.equal((await scim('GET', `/Groups/${group.id as string}`)).statusCode, 404)
      })

      it('refuses a second group of the same name (409 uniqueness)', async () => {
        const name = uniqueName('dup')
        assert.equal((await scim('POST', '/Groups', { schemas: [GROUP], displayName: name })).statusCode, 201)
        const again = await scim('POST', '/Groups', { schemas: [GROUP], displayName: name })
        assert.equal(again.statusCode, 409)
        assert.equal(again.json().scimType, 'uniqueness')
      })
    })
  })
}
