/**
 * No name a client sends reaches a prototype: every spelling of one
 * (`__proto__`, `constructor`, `prototype`, `constructor.prototype`) in
 * JSON keys at any depth, form and multipart fields, query names, SCIM
 * PATCH paths and path-less values, SCIM filters and sort keys, and import
 * rows and CSV headers, sent to every operation that takes a body (the
 * OpenAPI document's, and SCIM's). Each is answered 4xx (400 where the body
 * is read), the service still answers, and no prototype in the process
 * gained a property.
 */
import assert from 'node:assert/strict'
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { listen, runCli } from './cli-helpers.ts'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'

const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'
const ENTERPRISE = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'
const PROTOTYPES = { Object: Object.prototype, Array: Array.prototype, Function: Function.prototype, String: String.prototype, Number: Number.prototype }

/** The own property names of each built-in prototype: what a write through a polluting key would add to. */
function prototypeNames (): Record<string, string[]> {
  return Object.fromEntries(Object.entries(PROTOTYPES).map(([name, proto]) => [name, Reflect.ownKeys(proto).map(String).sort()]))
}

/** JSON texts with a prototype's name as a key, at the top and nested; raw text, so `__proto__` stays a key. */
const JSON_BODIES = [
  '{"__proto__":{"polluted":1}}',
  '{"constructor":{"prototype":{"polluted":1}}}',
  '{"constructor":{"polluted":1}}',
  '{"prototype":{"polluted":1}}',
  '{"username":"x","nested":{"__proto__":{"polluted":1}}}',
  '{"username":"x","list":[{"constructor":{"prototype":{"polluted":1}}}]}',
  '{"username":"x","groups":[],"a":{"b":{"prototype":{"polluted":1}}}}'
]
// A form has no nesting (`a[b]=1` is the one name "a[b]"): the names themselves are what could reach a prototype.
const FORM_BODIES = ['__proto__=1', 'constructor=1', 'prototype=1', 'username=x&__proto__=1&__proto__=2', 'username=x&constructor=1']
const MULTIPART_NAMES = ['__proto__', 'constructor', 'prototype']

function multipart (name: string): { payload: string, type: string } {
  const boundary = 'gatehouse-boundary'
  return {
    payload: `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n1\r\n--${boundary}--\r\n`,
    type: `multipart/form-data; boundary=${boundary}`
  }
}

/** SCIM PATCH operations naming a prototype in a path, in a path-less value's keys, and nested in a value. */
const SCIM_USER_OPERATIONS: object[] = [
  { op: 'replace', path: 'constructor.prototype.polluted', value: 1 },
  { op: 'add', path: 'constructor.prototype.polluted', value: 1 },
  { op: 'replace', path: '__proto__', value: { polluted: 1 } },
  { op: 'replace', path: '__proto__.polluted', value: 1 },
  { op: 'replace', path: 'prototype.polluted', value: 1 },
  { op: 'add', path: 'constructor', value: { polluted: 1 } },
  { op: 'remove', path: 'constructor.prototype.toString' },
  { op: 'replace', path: 'name.__proto__.polluted', value: 1 },
  { op: 'replace', path: 'name.constructor.prototype.polluted', value: 1 },
  { op: 'replace', path: 'emails[type eq "work"].__proto__', value: { polluted: 1 } },
  { op: 'replace', path: 'emails[constructor eq "x"].value', value: 'a@b.example' },
  { op: 'replace', path: `${ENTERPRISE}:__proto__`, value: { polluted: 1 } },
  { op: 'replace', path: `${ENTERPRISE}:manager.__proto__`, value: { polluted: 1 } },
  { op: 'replace', path: `${ENTERPRISE}:constructor.prototype.polluted`, value: 1 },
  { op: 'replace', path: 'urn:example:custom:2.0:User:__proto__', value: { polluted: 1 } },
  { op: 'replace', value: { '__proto__.polluted': 1 } },
  { op: 'replace', value: { 'constructor.prototype.polluted': 1 } },
  { op: 'replace', value: { prototype: { polluted: 1 } } },
  { op: 'replace', value: { constructor: { polluted: 1 } } },
  { op: 'add', value: { [ENTERPRISE]: { constructor: { prototype: { polluted: 1 } } } } },
  { op: 'add', value: { [ENTERPRISE]: { '__proto__.polluted': 1 } } },
  { op: 'replace', path: 'name', value: { givenName: 'x', constructor: { polluted: 1 } } }
]
const SCIM_GROUP_OPERATIONS: object[] = [
  { op: 'replace', path: '__proto__', value: { polluted: 1 } },
  { op: 'replace', path: 'constructor.prototype.polluted', value: 1 },
  { op: 'replace', value: { '__proto__.polluted': 1 } },
  { op: 'add', path: 'members', value: [{ value: 'x', constructor: { prototype: { polluted: 1 } } }] }
]
const SCIM_QUERIES = ['filter=constructor eq "x"', 'filter=__proto__ eq "x"', 'filter=prototype pr', 'filter=constructor.prototype eq "x"',
  'filter=emails[constructor eq "x"]', 'sortBy=constructor', 'sortBy=__proto__', 'sortBy=prototype', 'attributes=constructor,__proto__.polluted',
  'attributes=emails[constructor eq 1]', 'excludedAttributes=__proto__', '__proto__=1', 'constructor[prototype][polluted]=1']

interface Operation { method: string, url: string, types: string[] }

for (const dialect of dialects()) {
  describe(`no client-supplied name reaches a prototype (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let scimKey = ''
    let userId = ''
    let groupId = ''
    let baseline: Record<string, string[]>

    const assertUnpolluted = (what: string): void => {
      assert.equal(({} as Record<string, unknown>).polluted, undefined, `${what}: ({}).polluted`)
      assert.equal(([] as unknown as Record<string, unknown>).polluted, undefined, `${what}: [].polluted`)
      assert.deepEqual(prototypeNames(), baseline, `${what}: a prototype's own properties changed`)
    }
    const assertStillAnswers = async (what: string): Promise<void> => {
      const res = await t.app.inject({ method: 'GET', url: '/auth/healthz' })
      assert.equal(res.statusCode, 200, `${what}: the service stopped answering`)
    }
    const assertRefused = async (res: LightMyRequestResponse, what: string, statuses: number[] = [400]): Promise<void> => {
      assert.ok(statuses.includes(res.statusCode), `${what}: ${res.statusCode} ${res.body.slice(0, 300)}`)
      assertUnpolluted(what)
      await assertStillAnswers(what)
    }
    const scim = async (method: 'GET' | 'POST' | 'PUT' | 'PATCH', path: string, payload?: string): Promise<LightMyRequestResponse> =>
      await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${scimKey}`, 'content-type': 'application/scim+json' },
        ...(payload !== undefined ? { payload } : {})
      })

    before(async () => {
      baseline = prototypeNames()
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'idp', scopes: ['scim'] } })
      scimKey = made.json().key
      const user = await scim('POST', '/Users', JSON.stringify({ userName: uniqueName('target'), emails: [{ value: `${uniqueName('t')}@corp.example`, type: 'work' }] }))
      assert.equal(user.statusCode, 201, user.body)
      userId = user.json().id
      const group = await scim('POST', '/Groups', JSON.stringify({ displayName: uniqueName('grp') }))
      assert.equal(group.statusCode, 201, group.body)
      groupId = group.json().id
    })

    it('refuses a prototype\'s name as a JSON key, form field or multipart field with 400 at every operation of the OpenAPI document that takes a body', async () => {
      const spec = (await t.app.inject({ method: 'GET', url: '/auth/openapi.json' })).json() as { paths: Record<string, Record<string, { requestBody?: { content: Record<string, unknown> } }>> }
      const operations: Operation[] = Object.entries(spec.paths).flatMap(([path, methods]) => Object.entries(methods)
        .filter(([, operation]) => operation.requestBody !== undefined)
        .map(([method, operation]) => ({ method: method.toUpperCase(), url: `${path.replace(/\{[^}]+\}/g, userId)}`, types: Object.keys(operation.requestBody!.content) })))
      assert.ok(operations.length >= 20, `the document lists ${operations.length} operations with a body`)
      for (const operation of operations) {
        const send = async (payload: string, type: string): Promise<LightMyRequestResponse> =>
          await t.app.inject({ method: operation.method as 'POST', url: operation.url, headers: { ...auth(t.adminKey), 'content-type': type }, payload })
        // A refusal of the credential (a session-only operation) comes before the body is read: no 2xx, no 5xx.
        const refused = [400, 401, 403]
        for (const type of operation.types) {
          if (type.includes('json')) {
            for (const body of JSON_BODIES) await assertRefused(await send(body, type), `${operation.method} ${operation.url} ${type} ${body}`, refused)
          } else if (type === 'application/x-www-form-urlencoded') {
            for (const body of FORM_BODIES) await assertRefused(await send(body, type), `${operation.method} ${operation.url} form ${body}`, refused)
          } else if (type === 'multipart/form-data') {
            for (const name of MULTIPART_NAMES) {
              const { payload, type: withBoundary } = multipart(name)
              await assertRefused(await send(payload, withBoundary), `${operation.method} ${operation.url} multipart ${name}`, refused)
            }
          }
        }
      }
      // The same names in a query are refused too.
      await assertRefused(await t.app.inject({ method: 'GET', url: '/auth/api/users?__proto__=1', headers: auth(t.adminKey) }), 'query __proto__')
      await assertRefused(await t.app.inject({ method: 'GET', url: '/auth/api/users?constructor=1', headers: auth(t.adminKey) }), 'query constructor')
    })

    it('refuses a prototype\'s name in a user import row with 400, and creates nobody', async () => {
      for (const row of ['{"username":"imp1","constructor":{"polluted":1}}', '{"username":"imp2","prototype":1}', '{"username":"imp3","__proto__":{"polluted":1}}']) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: { ...auth(t.adminKey), 'content-type': 'application/json' }, payload: `{"users":[${row}]}` })
        await assertRefused(res, `import ${row}`)
      }
      const found = await t.app.inject({ method: 'GET', url: '/auth/api/users?q=imp', headers: auth(t.adminKey) })
      assert.deepEqual(found.json(), [])
    })

    it('refuses a prototype\'s name in a SCIM User PATCH path, path-less value or nested value with 400, and changes nothing', async () => {
      const before = (await scim('GET', `/Users/${userId}`)).json()
      for (const operation of SCIM_USER_OPERATIONS) {
        const res = await scim('PATCH', `/Users/${userId}`, JSON.stringify({ schemas: [PATCH_OP], Operations: [operation] }))
        await assertRefused(res, `PATCH /Users ${JSON.stringify(operation)}`)
        assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
        assert.ok(['invalidPath', 'invalidSyntax', 'invalidValue'].includes(res.json().scimType), `${JSON.stringify(operation)}: ${res.body}`)
      }
      assert.deepEqual((await scim('GET', `/Users/${userId}`)).json(), before)
    })

    it('refuses a prototype\'s name in SCIM PUT and POST bodies and Group PATCH with 400', async () => {
      for (const body of JSON_BODIES) {
        await assertRefused(await scim('PUT', `/Users/${userId}`, body), `PUT /Users ${body}`)
        await assertRefused(await scim('POST', '/Users', body), `POST /Users ${body}`)
        await assertRefused(await scim('PUT', `/Groups/${groupId}`, body), `PUT /Groups ${body}`)
        await assertRefused(await scim('POST', '/Groups', body), `POST /Groups ${body}`)
      }
      for (const operation of SCIM_GROUP_OPERATIONS) {
        await assertRefused(await scim('PATCH', `/Groups/${groupId}`, JSON.stringify({ schemas: [PATCH_OP], Operations: [operation] })), `PATCH /Groups ${JSON.stringify(operation)}`)
      }
    })

    it('answers a prototype\'s name in a SCIM filter, sortBy or attributes without an error of its own (400 or an empty projection)', async () => {
      for (const resource of ['Users', 'Groups']) {
        for (const query of SCIM_QUERIES) {
          const res = await scim('GET', `/${resource}?${query.split('&').map(part => part.split('=').map(encodeURIComponent).join('=')).join('&')}`)
          // attributes= of a name no resource has is answered with what is there (RFC 7644 §3.4.2.5), and no more;
          // a query string has no nesting, so `constructor[prototype][polluted]` is one name no operation reads.
          const allowed = /^(attributes|excludedAttributes|constructor\[)/.test(query) ? [200, 400] : [400]
          await assertRefused(res, `GET /${resource}?${query}`, allowed)
          if (res.statusCode === 200) {
            for (const item of res.json().Resources as Array<Record<string, unknown>>) assert.ok(!Object.hasOwn(item, 'constructor') && !Object.hasOwn(item, '__proto__'), `${query}: ${JSON.stringify(item)}`)
          }
        }
      }
    })

    describe('the CLI import', () => {
      let dir = ''
      before(async () => { dir = await mkdtemp(join(tmpdir(), 'gatehouse-proto-')) })
      after(async () => { await rm(dir, { recursive: true, force: true }) })

      it('refuses a CSV header that names a prototype, and a JSON-lines row with one, before sending anything', async () => {
        const url = await listen(t.app)
        const env = { GATEHOUSE_URL: url, GATEHOUSE_API_KEY: t.adminKey }
        const csv = join(dir, 'users.csv')
        await writeFile(csv, 'username,__proto__\nproto1,x\n')
        const header = await runCli(['users', 'import', csv], { env })
        assert.equal(header.code, 2, header.stderr)
        assert.match(header.stderr, /__proto__/)
        const jsonl = join(dir, 'users.jsonl')
        await writeFile(jsonl, '{"username":"proto2","__proto__":{"polluted":1}}\n{"username":"proto3","constructor":{"prototype":{"polluted":1}}}\n')
        const rows = await runCli(['users', 'import', jsonl], { env })
        assert.notEqual(rows.code, 0, rows.stdout)
        assert.match(rows.stdout + rows.stderr, /__proto__/)
        const found = await t.app.inject({ method: 'GET', url: '/auth/api/users?q=proto', headers: auth(t.adminKey) })
        assert.deepEqual((found.json() as Array<{ username: string }>).map(u => u.username), [])
        assertUnpolluted('CLI import')
      })
    })
  })
}
