import assert from 'node:assert/strict'
import { before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { CompiledQuery, sql } from 'kysely'
import { filterCondition, USERS } from '../src/scim/scim.repository.ts'
import { parseScimFilter } from '../src/lib/scim-filter.ts'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'

const USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const ENTERPRISE = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

function patch (...operations: object[]): object {
  return { schemas: [PATCH_OP], Operations: operations }
}

for (const dialect of dialects()) {
  describe(`SCIM's enterprise extension (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let key = ''

    const scim = async (method: Method, path: string, payload?: object): Promise<LightMyRequestResponse> =>
      await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/scim+json' },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
    const createUser = async (fields: Record<string, unknown> = {}): Promise<Record<string, any>> => {
      const res = await scim('POST', '/Users', { schemas: [USER, ENTERPRISE], userName: uniqueName('ent'), ...fields })
      assert.equal(res.statusCode, 201, res.body)
      return res.json()
    }
    const read = async (id: string, query = ''): Promise<Record<string, any>> => {
      const res = await scim('GET', `/Users/${id}${query}`)
      assert.equal(res.statusCode, 200, res.body)
      return res.json()
    }
    const patchUser = async (id: string, ...operations: object[]): Promise<Record<string, any>> => {
      const res = await scim('PATCH', `/Users/${id}`, patch(...operations))
      assert.equal(res.statusCode, 200, res.body)
      return res.json()
    }
    const filterIds = async (filter: string): Promise<string[]> => {
      const res = await scim('GET', `/Users?filter=${encodeURIComponent(filter)}&count=1000`)
      assert.equal(res.statusCode, 200, res.body)
      return (res.json().Resources as Array<{ id: string }>).map(r => r.id).sort()
    }
    const userEvents = async (id: string): Promise<[Record<string, any>, ...Array<Record<string, any>>]> =>
      (await t.app.inject({ method: 'GET', url: `/auth/api/events?type=user.updated&target_id=${id}`, headers: auth(t.adminKey) })).json()

    before(async () => {
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'entra', scopes: ['scim'] } })
      assert.equal(made.statusCode, 201, made.body)
      key = made.json().key
    })

    it('advertises the extension in /Schemas and in the User resource type', async () => {
      const schema = await scim('GET', `/Schemas/${ENTERPRISE}`)
      assert.equal(schema.statusCode, 200, schema.body)
      assert.deepEqual(schema.json().attributes.map((a: { name: string }) => a.name), ['employeeNumber', 'costCenter', 'organization', 'division', 'department', 'manager'])
      const listed = (await scim('GET', '/Schemas')).json().Resources.map((r: { id: string }) => r.id)
      assert.ok(listed.includes(ENTERPRISE))
      const type = (await scim('GET', '/ResourceTypes/User')).json()
      assert.deepEqual(type.schemaExtensions, [{ schema: ENTERPRISE, required: false }])
    })

    it('keeps every attribute of the extension on create and reads it back, with the manager\'s displayName from their user', async () => {
      const manager = await createUser({ displayName: 'Grace Hopper' })
      const created = await createUser({
        [ENTERPRISE]: { employeeNumber: 'E-701', costCenter: 'CC-4', organization: 'Corp', division: 'R&D', department: 'Compilers', manager: { value: manager.id } }
      })
      const expected = {
        employeeNumber: 'E-701',
        costCenter: 'CC-4',
        organization: 'Corp',
        division: 'R&D',
        department: 'Compilers',
        manager: { value: manager.id, $ref: `http://localhost:80/auth/scim/v2/Users/${manager.id as string}`, displayName: 'Grace Hopper' }
      }
      assert.deepEqual(created[ENTERPRISE], expected)
      assert.deepEqual(created.schemas, [USER, ENTERPRISE])
      const again = await read(created.id)
      assert.deepEqual(again[ENTERPRISE], expected)
      const listed = (await scim('GET', `/Users?filter=${encodeURIComponent(`id eq "${created.id as string}"`)}`)).json()
      assert.deepEqual(listed.Resources[0][ENTERPRISE], expected)
      const [event] = (await t.app.inject({ method: 'GET', url: `/auth/api/events?type=user.created&target_id=${created.id as string}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual([event.data.employee_number, event.data.department, event.data.manager_id], ['E-701', 'Compilers', manager.id])
    })

    it('falls back to the manager\'s userName, and lists only the core schema when nothing of the extension is set', async () => {
      const manager = await createUser()
      const report = await createUser({ [ENTERPRISE]: { manager: { value: manager.id } } })
      assert.equal(report[ENTERPRISE].manager.displayName, manager.userName)
      const plain = await createUser({ [ENTERPRISE]: { department: '' } })
      assert.deepEqual(plain.schemas, [USER])
      assert.equal(plain[ENTERPRISE], undefined)
    })

    it('passes over a manager that is no user here, as Microsoft\'s collection sends one', async () => {
      const created = await scim('POST', '/Users', { schemas: [ENTERPRISE, USER], userName: uniqueName('ms'), [ENTERPRISE]: { Department: 'bob', Manager: { Value: 'SuzzyQ' } } })
      assert.equal(created.statusCode, 201, created.body)
      assert.deepEqual(created.json()[ENTERPRISE], { department: 'bob' })
    })

    it('refuses a user as their own manager, and a value that is no string (400 invalidValue)', async () => {
      const user = await createUser()
      const self = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: `${ENTERPRISE}:manager`, value: user.id }))
      assert.equal(self.statusCode, 400, self.body)
      assert.equal(self.json().scimType, 'invalidValue')
      const number = await scim('PATCH', `/Users/${user.id as string}`, patch({ op: 'replace', path: `${ENTERPRISE}:department`, value: 7 }))
      assert.equal(number.statusCode, 400, number.body)
      assert.equal(number.json().scimType, 'invalidValue')
    })

    it('changes an attribute by the path Entra sends, the URN in any case, and leaves the others as they were', async () => {
      const user = await createUser({ [ENTERPRISE]: { employeeNumber: 'E-1', department: 'Sales' } })
      const changed = await patchUser(user.id, { op: 'Add', path: `${ENTERPRISE}:department`, value: 'Marketing' }, { op: 'Replace', path: `${ENTERPRISE.toLowerCase()}:COSTCENTER`, value: 'CC-9' })
      assert.deepEqual(changed[ENTERPRISE], { employeeNumber: 'E-1', costCenter: 'CC-9', department: 'Marketing' })
      const [event] = await userEvents(user.id)
      assert.deepEqual(event.data.changes.department, { from: 'Sales', to: 'Marketing' })
      assert.equal(event.data.source, 'scim')
      const removed = await patchUser(user.id, { op: 'Remove', path: `${ENTERPRISE}:employeeNumber` })
      assert.deepEqual(removed[ENTERPRISE], { costCenter: 'CC-9', department: 'Marketing' })
    })

    it('sets the manager from a value object, a bare id string or a list of one, and clears it by remove, null or an empty value', async () => {
      const [m1, m2, m3] = [await createUser({ displayName: 'One' }), await createUser({ displayName: 'Two' }), await createUser({ displayName: 'Three' })]
      const user = await createUser()
      const managerOf = (resource: Record<string, any>): string | undefined => resource[ENTERPRISE]?.manager?.value
      assert.equal(managerOf(await patchUser(user.id, { op: 'Add', path: `${ENTERPRISE}:manager`, value: { value: m1.id } })), m1.id)
      assert.equal(managerOf(await patchUser(user.id, { op: 'Add', path: `${ENTERPRISE}:manager`, value: m2.id })), m2.id)
      assert.equal(managerOf(await patchUser(user.id, { op: 'Replace', path: `${ENTERPRISE}:manager`, value: [{ value: m3.id }] })), m3.id)
      assert.equal((await read(user.id))[ENTERPRISE].manager.displayName, 'Three')
      const cleared = await patchUser(user.id, { op: 'Remove', path: `${ENTERPRISE}:manager` })
      assert.equal(cleared[ENTERPRISE], undefined)
      assert.deepEqual(cleared.schemas, [USER])
      for (const empty of [null, '', { value: '' }, { value: null }, []]) {
        await patchUser(user.id, { op: 'Replace', path: `${ENTERPRISE}:manager`, value: m1.id })
        const res = await patchUser(user.id, { op: 'Replace', path: `${ENTERPRISE}:manager`, value: empty })
        assert.equal(managerOf(res), undefined, JSON.stringify(empty))
      }
      await patchUser(user.id, { op: 'Replace', path: `${ENTERPRISE}:manager`, value: m1.id })
      const byValue = await patchUser(user.id, { op: 'Remove', path: `${ENTERPRISE}:manager`, value: [{ value: m1.id }] })
      assert.equal(managerOf(byValue), undefined)
    })

    it('takes the extension as an object in a path-less replace, as Okta sends it, changing only what it names', async () => {
      const manager = await createUser()
      const user = await createUser({ [ENTERPRISE]: { employeeNumber: 'E-2', division: 'North' } })
      const res = await patchUser(user.id, { op: 'replace', value: { active: true, [ENTERPRISE]: { department: 'Support', manager: { value: manager.id } } } })
      assert.deepEqual(res[ENTERPRISE], { employeeNumber: 'E-2', division: 'North', department: 'Support', manager: { value: manager.id, $ref: `http://localhost:80/auth/scim/v2/Users/${manager.id as string}`, displayName: manager.userName } })
      const paths = await patchUser(user.id, { op: 'replace', value: { [`${ENTERPRISE}:division`]: 'South', [`${ENTERPRISE}:manager`]: null } })
      assert.deepEqual(paths[ENTERPRISE], { employeeNumber: 'E-2', division: 'South', department: 'Support' })
      const whole = await patchUser(user.id, { op: 'replace', path: ENTERPRISE, value: { organization: 'Corp' } })
      assert.deepEqual(whole[ENTERPRISE], { employeeNumber: 'E-2', organization: 'Corp', division: 'South', department: 'Support' })
      const gone = await patchUser(user.id, { op: 'remove', path: ENTERPRISE })
      assert.equal(gone[ENTERPRISE], undefined)
    })

    it('replaces the extension on PUT: what the PUT leaves out is cleared', async () => {
      const manager = await createUser()
      const user = await createUser({ [ENTERPRISE]: { employeeNumber: 'E-3', department: 'Ops', manager: { value: manager.id } } })
      const put = await scim('PUT', `/Users/${user.id as string}`, { schemas: [USER, ENTERPRISE], userName: user.userName, [ENTERPRISE]: { costCenter: 'CC-1' } })
      assert.equal(put.statusCode, 200, put.body)
      assert.deepEqual(put.json()[ENTERPRISE], { costCenter: 'CC-1' })
      const bare = await scim('PUT', `/Users/${user.id as string}`, { schemas: [USER], userName: user.userName })
      assert.equal(bare.json()[ENTERPRISE], undefined)
      const [event] = await userEvents(user.id)
      assert.deepEqual(event.data.changes.cost_center, { from: 'CC-1', to: null })
    })

    it('clears the manager of every report when the manager\'s user is deleted, with a new version and an event each', async () => {
      const manager = await createUser()
      const [r1, r2] = [await createUser({ [ENTERPRISE]: { manager: { value: manager.id }, department: 'Ops' } }), await createUser({ [ENTERPRISE]: { manager: { value: manager.id } } })]
      assert.equal((await scim('DELETE', `/Users/${manager.id as string}`)).statusCode, 204)
      const after1 = await read(r1.id)
      assert.deepEqual(after1[ENTERPRISE], { department: 'Ops' })
      assert.equal(after1.meta.version, 'W/"2"')
      const after2 = await read(r2.id)
      assert.equal(after2[ENTERPRISE], undefined)
      assert.deepEqual(after2.schemas, [USER])
      const [event] = await userEvents(r2.id)
      assert.deepEqual([event.data.changes.manager_id, event.data.reason], [{ from: manager.id, to: null }, 'manager_deleted'])
      assert.deepEqual(await filterIds(`${ENTERPRISE}:manager.value eq "${manager.id as string}"`), [])
    })

    it('clears the reports of a manager deleted through the REST API too', async () => {
      const manager = await createUser()
      const report = await createUser({ [ENTERPRISE]: { manager: { value: manager.id } } })
      const res = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${manager.id as string}`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 204, res.body)
      assert.equal((await read(report.id))[ENTERPRISE], undefined)
    })

    it('shows the extension on the console\'s user page, the manager as a link to their page', async () => {
      const password = 'correct horse battery staple'
      const admin = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('console'), password, role: 'admin' } })
      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: admin.json().username, password } })
      const cookie = `gatehouse_session=${login.json().token as string}`
      const manager = await createUser()
      const report = await createUser({ [ENTERPRISE]: { employeeNumber: 'E-<9>', department: 'Ops', manager: { value: manager.id } } })
      const page = await t.app.inject({ method: 'GET', url: `/auth/admin/users/${report.id as string}`, headers: { cookie } })
      assert.equal(page.statusCode, 200, page.body)
      assert.ok(page.body.includes(`<dd id="enterprise">employee number <code>E-&#60;9&#62;</code>; department <code>Ops</code>; manager <a href="/auth/admin/users/${manager.id as string}">${manager.userName as string}</a> (from SCIM)</dd>`), 'the enterprise facts')
      const plain = await t.app.inject({ method: 'GET', url: `/auth/admin/users/${manager.id as string}`, headers: { cookie } })
      assert.equal(plain.statusCode, 200)
      assert.doesNotMatch(plain.body, /id="enterprise"/)
    })

    describe('filters', () => {
      const tag = uniqueName('d')
      let a: Record<string, any>
      let b: Record<string, any>
      let c: Record<string, any>
      before(async () => {
        a = await createUser({ [ENTERPRISE]: { employeeNumber: `${tag}-1`, department: `${tag} Sales`, costCenter: 'CC-A' } })
        b = await createUser({ [ENTERPRISE]: { employeeNumber: `${tag}-2`, department: `${tag} Sales`, manager: { value: a.id } } })
        c = await createUser({ [ENTERPRISE]: { employeeNumber: `${tag}-3`, department: `${tag} Support`, organization: 'Corp' } })
      })
      const ids = (...users: Array<Record<string, any>>): string[] => users.map(u => u.id as string).sort()

      it('finds a user by employeeNumber and department, the URN and the value in any case', async () => {
        assert.deepEqual(await filterIds(`${ENTERPRISE}:employeeNumber eq "${tag}-2"`), ids(b))
        assert.deepEqual(await filterIds(`${ENTERPRISE.toUpperCase()}:EMPLOYEENUMBER eq "${tag.toUpperCase()}-1"`), ids(a))
        assert.deepEqual(await filterIds(`${ENTERPRISE}:department eq "${tag} sales"`), ids(a, b))
        assert.deepEqual(await filterIds(`department eq "${tag} Support"`), ids(c))
      })

      it('runs employeeNumber eq, department eq and manager.value eq as index lookups', async () => {
        const db = t.app.db
        for (const [filter, index] of [
          [`${ENTERPRISE}:employeeNumber eq "${tag}-1"`, 'users_employee_number_idx'],
          [`${ENTERPRISE}:department eq "${tag} Sales"`, 'users_department_idx'],
          [`${ENTERPRISE}:manager.value eq "${a.id as string}"`, 'users_manager_id_idx']
        ] as const) {
          const query = db.selectFrom('users').select('id').where(filterCondition(db, USERS, parseScimFilter(filter))).compile()
          const plan = await db.connection().execute(async connection => {
            // A table of a few rows is read whole by PostgreSQL's planner whatever its indexes: this asks whether the index can serve.
            if (dialect.name === 'postgres') await sql`set enable_seqscan = off`.execute(connection)
            const explain = dialect.name === 'sqlite' ? 'explain query plan ' : 'explain '
            const rows = (await connection.executeQuery(CompiledQuery.raw(explain + query.sql, [...query.parameters]))).rows
            if (dialect.name === 'postgres') await sql`reset enable_seqscan`.execute(connection)
            return rows
          })
          assert.match(JSON.stringify(plan), new RegExp(index), `${filter}: ${JSON.stringify(plan)}`)
        }
      })

      it('takes the other operators and attributes of the extension, the manager by its value', async () => {
        assert.deepEqual(await filterIds(`${ENTERPRISE}:department sw "${tag} S" and not (${ENTERPRISE}:costCenter pr)`), ids(b, c))
        assert.deepEqual(await filterIds(`${ENTERPRISE}:department sw "${tag}" and ${ENTERPRISE}:organization eq "corp"`), ids(c))
        assert.deepEqual(await filterIds(`${ENTERPRISE}:manager.value eq "${a.id as string}"`), ids(b))
        assert.deepEqual(await filterIds(`${ENTERPRISE}:department sw "${tag}" and ${ENTERPRISE}:manager pr`), ids(b))
        assert.deepEqual(await filterIds(`${ENTERPRISE}:department sw "${tag}" and ${ENTERPRISE}:manager.value ne "${a.id as string}"`), ids(a, c))
      })

      it('answers 400 invalidFilter for what it cannot filter on', async () => {
        for (const filter of [`${ENTERPRISE}:manager.displayName eq "x"`, `${ENTERPRISE}:nickname eq "x"`, `${ENTERPRISE}:manager.value gt "x"`, `${ENTERPRISE}:department eq 7`]) {
          const res = await scim('GET', `/Users?filter=${encodeURIComponent(filter)}`)
          assert.equal(res.statusCode, 400, `${filter}: ${res.body}`)
          assert.equal(res.json().scimType, 'invalidFilter', filter)
        }
      })

      it('sorts by employeeNumber', async () => {
        const res = await scim('GET', `/Users?filter=${encodeURIComponent(`${ENTERPRISE}:department sw "${tag}"`)}&sortBy=${encodeURIComponent(`${ENTERPRISE}:employeeNumber`)}&sortOrder=descending`)
        assert.deepEqual(res.json().Resources.map((r: { id: string }) => r.id), [c.id, b.id, a.id])
      })

      it('honours attributes and excludedAttributes for the extension and its attributes', async () => {
        const only = await read(b.id, `?attributes=userName,${ENTERPRISE}:department`)
        assert.deepEqual(only, { schemas: [USER, ENTERPRISE], id: b.id, userName: b.userName, [ENTERPRISE]: { department: `${tag} Sales` } })
        const whole = await read(b.id, `?attributes=${ENTERPRISE}`)
        assert.deepEqual(Object.keys(whole).sort(), ['id', 'schemas', ENTERPRISE].sort())
        assert.equal(whole[ENTERPRISE].manager.value, a.id)
        const without = await read(b.id, `?excludedAttributes=${ENTERPRISE}:manager,meta`)
        assert.deepEqual(without[ENTERPRISE], { employeeNumber: `${tag}-2`, department: `${tag} Sales` })
        assert.equal(without.meta, undefined)
        const none = await read(b.id, `?excludedAttributes=${ENTERPRISE}`)
        assert.equal(none[ENTERPRISE], undefined)
        assert.equal(none.userName, b.userName)
      })
    })
  })
}
