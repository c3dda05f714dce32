import { strict as assert } from 'node:assert'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, it } from 'node:test'
import { Ajv } from 'ajv'
import addFormats from 'ajv-formats'
import openapiTS, { astToString, type OpenAPI3 } from 'openapi-typescript'
import ts from 'typescript'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'
import { listen } from './cli-helpers.ts'

type Doc = Record<string, any>

/** Type-checks `consumer` against the types openapi-typescript generates from `document`; returns the compiler's complaints. */
async function typecheckAgainstGeneratedClient (document: Doc, consumer: string): Promise<string[]> {
  const dir = mkdtempSync(join(tmpdir(), 'gatehouse-openapi-ts-'))
  try {
    writeFileSync(join(dir, 'api.ts'), astToString(await openapiTS(document as OpenAPI3)))
    writeFileSync(join(dir, 'consumer.ts'), consumer)
    const program = ts.createProgram([join(dir, 'consumer.ts')], {
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      types: [],
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      allowImportingTsExtensions: true
    })
    return ts.getPreEmitDiagnostics(program).map(d => ts.flattenDiagnosticMessageText(d.messageText, '\n'))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

function operations (document: Doc): Map<string, Doc> {
  const ops = new Map<string, Doc>()
  for (const item of Object.values<Doc>(document.paths)) {
    for (const op of Object.values<Doc>(item)) ops.set(op.operationId, op)
  }
  return ops
}

/** One request over a real socket, with the header names exactly as given (fetch would lower-case them). */
async function rawRequest (base: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<{ status: number, headers: Record<string, unknown>, body: string }> {
  return await new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${path}`, { method, headers }, (res) => {
      let text = ''
      res.setEncoding('utf8').on('data', (d: string) => { text += d }).on('end', () => { resolve({ status: res.statusCode!, headers: res.headers, body: text }) })
    })
    req.on('error', reject)
    req.end(body)
  })
}

/** A response's headers, with references to components.headers resolved. */
function headersOf (document: Doc, response: Doc): Record<string, Doc> {
  const out: Record<string, Doc> = {}
  for (const [name, header] of Object.entries<Doc>(response.headers ?? {})) {
    out[name] = typeof header.$ref === 'string' ? document.components.headers[header.$ref.split('/').pop()!] : header
  }
  return out
}

// The document is the same whatever the database; the responses are checked on every dialect.
const [sqlite] = dialects()

describe('the OpenAPI document as a typed client sees it', () => {
  const t = useTestApp(sqlite!)

  it('gives a client generated with openapi-typescript the Location, ETag and Link headers of Create, Get and List', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    // Each line only compiles if the header is declared with a string type: an undeclared one is `unknown`.
    const consumer = `
      import type { operations } from './api.ts'
      type H<Op extends keyof operations, S extends keyof operations[Op]['responses']> =
        operations[Op]['responses'][S] extends { headers: infer Headers } ? Headers : never
      declare const created: H<'create_user_users_post', 201>
      declare const legacyCreated: H<'legacy_create_user_users_post', 201>
      declare const read: H<'get_user_users__user_id__get', 200>
      declare const updated: H<'update_user_users__user_id__patch', 200>
      declare const listed: H<'list_users_users_get', 200>
      declare const events: H<'list_events', 200>
      declare const keyCreated: H<'create_api_key', 201>
      export const always: string[] = [created.Location, created.ETag, legacyCreated.Location, read.ETag, updated.ETag, keyCreated.Location]
      // Link is only there when another page follows.
      export const sometimes: Array<string | undefined> = [listed.Link, events.Link]
      export const next: string = listed.Link ?? ''
    `
    assert.deepEqual(await typecheckAgainstGeneratedClient(document, consumer), [])
    // And the check can fail: a header nobody declares does not type as a string.
    const undeclared = await typecheckAgainstGeneratedClient(document, `
      import type { operations } from './api.ts'
      declare const read: operations['get_user_users__user_id__get']['responses'][200]['headers']
      export const nope: string = read['X-Not-Declared']
    `)
    assert.equal(undeclared.length, 1, undeclared.join('\n'))
  })

  it('states the package\'s licence as info.license, by its SPDX identifier', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    const { license } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { license: string }
    assert.equal(license, 'Apache-2.0')
    assert.deepEqual(document.info.license, { name: license, identifier: license })
  })

  it('declares request headers as the docs spell them (If-Match, Idempotency-Key), which a generated client then accepts', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    const headerNames = new Set<string>()
    for (const op of operations(document).values()) {
      for (const parameter of op.parameters ?? []) if (parameter.in === 'header') headerNames.add(parameter.name)
    }
    assert.deepEqual([...headerNames].sort(), ['Idempotency-Key', 'If-Match'])
    const consumer = `
      import type { operations } from './api.ts'
      type Headers<Op extends keyof operations> = NonNullable<operations[Op]['parameters']['header']>
      export const update: Headers<'update_user_users__user_id__patch'> = { 'If-Match': '"3"' }
      export const remove: Headers<'delete_user_users__user_id__delete'> = { 'If-Match': '"3"' }
      export const create: Headers<'create_user_users_post'> = { 'Idempotency-Key': '"8e03978e-40d5-43e8-bc93-6894a57f9324"' }
    `
    assert.deepEqual(await typecheckAgainstGeneratedClient(document, consumer), [])
    // The lower-case spelling, which the document had before, is now refused as an unknown property.
    const lower = await typecheckAgainstGeneratedClient(document, `
      import type { operations } from './api.ts'
      export const update: NonNullable<operations['update_user_users__user_id__patch']['parameters']['header']> = { 'if-match': '"3"' }
    `)
    assert.equal(lower.length, 1, lower.join('\n'))
  })

  it('declares every error as application/problem+json (SCIM\'s as SCIM\'s error body), and the 429 with Retry-After and the RateLimit headers', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    for (const op of operations(document).values()) {
      for (const [status, response] of Object.entries<Doc>(op.responses)) {
        // Readiness answers 503 with its own Health body, for load balancers.
        if (!/^[45]/.test(status) || (op.operationId === 'readyz' && status === '503')) continue
        if (op.tags.includes('scim')) {
          // What is refused before routing (any other 4xx) is a problem on SCIM's paths too.
          assert.deepEqual(Object.keys(response.content), status === '4XX' ? ['application/scim+json', 'application/problem+json'] : ['application/scim+json'], `${op.operationId} ${status}`)
          assert.equal(response.content['application/scim+json'].schema.$ref, '#/components/schemas/ScimError')
          continue
        }
        assert.deepEqual(Object.keys(response.content), ['application/problem+json'], `${op.operationId} ${status}`)
        assert.equal(response.content['application/problem+json'].schema.$ref, '#/components/schemas/Problem')
      }
    }
    const list = operations(document).get('list_users_users_get')!
    assert.deepEqual(Object.keys(headersOf(document, list.responses['429'])).sort(),
      ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset', 'Retry-After', 'X-Request-Id'])
    // Probes are never throttled, so they document no 429.
    assert.equal(operations(document).get('healthz')!.responses['429'], undefined)
    assert.deepEqual(document.servers.map((s: Doc) => s.url), ['/'])
  })

  it('publishes SCIM under its own tag: every /scim/v2 operation, application/scim+json both ways, and the ScimBearer scheme only', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    assert.ok(document.tags.some((tag: Doc) => tag.name === 'scim'))
    assert.deepEqual(document.components.securitySchemes.ScimBearer, { type: 'http', scheme: 'bearer', description: document.components.securitySchemes.ScimBearer.description })
    const scim = [...operations(document).values()].filter(op => op.tags.includes('scim'))
    const paths = Object.entries<Doc>(document.paths).filter(([path]) => path.startsWith('/auth/scim/v2/'))
    assert.equal(scim.length, paths.reduce((n, [, item]) => n + Object.keys(item).length, 0), 'every operation under /auth/scim/v2 is tagged scim')
    assert.deepEqual(paths.map(([path]) => path).sort(), ['Groups', 'Groups/{id}', 'ResourceTypes', 'ResourceTypes/{id}', 'Schemas', 'Schemas/{id}', 'ServiceProviderConfig', 'Users', 'Users/{id}', 'serviceConfiguration'].map(p => `/auth/scim/v2/${p}`))
    assert.equal(scim.length, 18)
    for (const op of scim) {
      assert.deepEqual(op.security, [{ ScimBearer: [] }], op.operationId)
      assert.ok(op.responses['401'] && op.responses['403'], `${op.operationId} documents 401 and 403`)
      if (op.requestBody !== undefined) assert.deepEqual(Object.keys(op.requestBody.content), ['application/scim+json', 'application/json'], op.operationId)
      for (const [status, response] of Object.entries<Doc>(op.responses)) {
        if (/^2/.test(status) && response.content !== undefined) assert.deepEqual(Object.keys(response.content), ['application/scim+json'], `${op.operationId} ${status}`)
      }
    }
    // And no other operation takes the SCIM key.
    for (const op of operations(document).values()) if (!op.tags.includes('scim')) assert.ok(!(op.security ?? []).some((s: Doc) => 'ScimBearer' in s), op.operationId)
    assert.deepEqual(Object.keys(document.components.schemas.ScimError.properties), ['schemas', 'status', 'scimType', 'detail'])
    assert.equal(document.components.schemas.ScimError.properties.status.type, 'string')
  })

  it('says that form bodies repeat a field for each group, and offers an ordinary enabled user without a password as the Create User example', async () => {
    const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
    const body = operations(document).get('create_user_users_post')!.requestBody.content
    for (const type of ['application/x-www-form-urlencoded', 'multipart/form-data']) {
      assert.deepEqual(body[type].encoding, { groups: { style: 'form', explode: true } }, type)
    }
    assert.equal(body['application/json'].encoding, undefined)

    // The JSON body starts from the schema's example, form fields from each property's.
    const create = document.components.schemas.UserCreate
    const [example] = create.examples
    assert.equal(example.role, 'user')
    assert.equal(example.disabled, false)
    for (const [field, value] of Object.entries(example)) assert.deepEqual(create.properties[field].examples, [value], field)
    // No password is printed in the public document: not in the example, not as the field's own example.
    assert.equal('password' in example, false)
    assert.equal(create.properties.password.examples, undefined)
    const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { ...example, username: uniqueName('example'), email: null } })
    assert.equal(created.statusCode, 201, created.body)
    assert.equal(created.json().role, 'user')
    assert.equal(created.json().disabled, false)
    // Nor does Update User's example promote, disable or set a password.
    const [patch] = document.components.schemas.UserPatch.examples
    assert.deepEqual(Object.keys(patch).filter(field => ['role', 'disabled', 'password'].includes(field)), [])
  })
})

for (const dialect of dialects()) {
  describe(`responses send the headers the document marks required (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('on Create, Get, a paged List, a 3.6.1 path and a 401', async () => {
      const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
      const ops = operations(document)
      const expectDocumented = (operationId: string, response: { statusCode: number, headers: Record<string, unknown> }, alsoPresent: string[] = []): void => {
        const declared = ops.get(operationId)!.responses[String(response.statusCode)]
        assert.ok(declared, `${operationId} documents ${response.statusCode}`)
        const headers = headersOf(document, declared)
        for (const [name, header] of Object.entries(headers)) {
          if (header.required === true || alsoPresent.includes(name)) {
            assert.equal(typeof response.headers[name.toLowerCase()], 'string', `${operationId} ${response.statusCode} sends ${name}`)
          }
        }
        for (const name of alsoPresent) assert.ok(headers[name], `${operationId} ${response.statusCode} declares ${name}`)
      }

      for (let i = 0; i < 2; i++) {
        await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('contract'), password: GOOD_PASSWORD } })
      }
      const created = await t.app.inject({ method: 'POST', url: '/auth/users', headers: auth(t.adminKey), payload: { username: uniqueName('contract') } })
      expectDocumented('legacy_create_user_users_post', created, ['RateLimit-Limit'])
      const id = created.json().id as string
      expectDocumented('get_user_users__user_id__get', await t.app.inject({ url: `/auth/api/users/${id}`, headers: auth(t.adminKey) }))
      expectDocumented('list_users_users_get', await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(t.adminKey) }), ['Link'])
      const unauthenticated = await t.app.inject({ url: '/auth/api/users' })
      expectDocumented('list_users_users_get', unauthenticated)
      assert.match(unauthenticated.headers['content-type'] as string, /^application\/problem\+json/)
    })

    it('SCIM answers (users, groups, discovery, errors) validate against the document, with the headers it marks required', async () => {
      const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
      const ops = operations(document)
      const ajv = new Ajv({ strict: false, allErrors: true })
      addFormats.default(ajv)
      ajv.addSchema({ $id: 'openapi.json', components: document.components })
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: uniqueName('scim'), scopes: ['scim'] } })
      assert.equal(created.statusCode, 201, created.body)
      const scim = { authorization: `Bearer ${created.json().key as string}`, 'content-type': 'application/scim+json' }
      let checked = 0
      const expectValid = async (operationId: string, request: { method?: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', url: string, payload?: unknown }, status: number): Promise<Doc> => {
        const res = await t.app.inject({ method: request.method ?? 'GET', url: `/auth/scim/v2${request.url}`, headers: scim, ...(request.payload !== undefined ? { payload: JSON.stringify(request.payload) } : {}) })
        assert.equal(res.statusCode, status, `${operationId}: ${res.body}`)
        const declared = ops.get(operationId)!.responses[String(status)]
        assert.ok(declared, `${operationId} documents ${status}`)
        for (const [name, header] of Object.entries(headersOf(document, declared))) {
          if (header.required !== true) continue
          const value = res.headers[name.toLowerCase()]
          assert.equal(typeof value, 'string', `${operationId} ${status} sends ${name}`)
          if (typeof header.schema.pattern === 'string') assert.match(value as string, new RegExp(header.schema.pattern), `${operationId} ${status} ${name}`)
        }
        if (declared.content === undefined) return {}
        assert.match(String(res.headers['content-type']), /^application\/scim\+json/)
        const validate = ajv.compile({ $ref: `openapi.json${declared.content['application/scim+json'].schema.$ref as string}` })
        const body = res.json() as Doc
        assert.ok(validate(body), `${operationId} ${status}: ${ajv.errorsText(validate.errors)}\n${res.body}`)
        checked++
        return body
      }
      const enterprise = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'
      const manager = await expectValid('scim_create_user', { method: 'POST', url: '/Users', payload: { userName: uniqueName('mgr'), displayName: 'The Manager' } }, 201)
      const user = await expectValid('scim_create_user', {
        method: 'POST',
        url: '/Users',
        payload: {
          schemas: ['urn:ietf:params:scim:schemas:core:2.0:User', enterprise],
          userName: uniqueName('scim'),
          externalId: 'ext-1',
          name: { givenName: 'Ada', familyName: 'Lovelace', formatted: 'Ada Lovelace' },
          displayName: 'Ada',
          active: 'True',
          emails: [{ value: `${uniqueName('ada')}@example.com`, type: 'work', primary: true }, { value: 'ada@home.example', type: 'home' }],
          [enterprise]: { employeeNumber: '7', costCenter: 'c', organization: 'o', division: 'd', department: 'Research', manager: { value: manager.id } }
        }
      }, 201)
      assert.equal(user[enterprise].manager.displayName, 'The Manager')
      const group = await expectValid('scim_create_group', { method: 'POST', url: '/Groups', payload: { displayName: uniqueName('scim group'), externalId: 'g-1', members: [{ value: user.id }] } }, 201)
      await expectValid('scim_get_user', { url: `/Users/${user.id as string}` }, 200)
      await expectValid('scim_get_user', { url: `/Users/${user.id as string}?attributes=userName,emails[type eq "work"]` }, 200)
      await expectValid('scim_list_users', { url: `/Users?filter=${encodeURIComponent(`${enterprise}:department eq "Research"`)}&sortBy=userName&count=5` }, 200)
      await expectValid('scim_list_users', { url: '/Users?excludedAttributes=groups,meta' }, 200)
      await expectValid('scim_patch_user', { method: 'PATCH', url: `/Users/${user.id as string}`, payload: { Operations: [{ op: 'Replace', value: { active: false, 'name.givenName': 'Augusta' } }] } }, 200)
      await expectValid('scim_replace_user', { method: 'PUT', url: `/Users/${user.id as string}`, payload: { userName: user.userName, active: true } }, 200)
      await expectValid('scim_get_group', { url: `/Groups/${group.id as string}` }, 200)
      await expectValid('scim_list_groups', { url: `/Groups?filter=${encodeURIComponent(`members[value eq "${user.id as string}"]`)}` }, 200)
      await expectValid('scim_patch_group', { method: 'PATCH', url: `/Groups/${group.id as string}`, payload: { Operations: [{ op: 'add', path: 'members', value: [{ value: manager.id }] }] } }, 204)
      await expectValid('scim_replace_group', { method: 'PUT', url: `/Groups/${group.id as string}`, payload: { displayName: group.displayName, members: [] } }, 200)
      await expectValid('scim_get_service_provider_config', { url: '/ServiceProviderConfig' }, 200)
      await expectValid('scim_get_service_configuration', { url: '/serviceConfiguration' }, 200)
      await expectValid('scim_list_resource_types', { url: '/ResourceTypes' }, 200)
      await expectValid('scim_get_resource_type', { url: '/ResourceTypes/User' }, 200)
      await expectValid('scim_list_schemas', { url: '/Schemas' }, 200)
      await expectValid('scim_get_schema', { url: `/Schemas/${enterprise}` }, 200)
      // Errors, in SCIM's body: an unknown id, a filter that cannot be parsed, a name in use, a stale If-Match.
      await expectValid('scim_get_user', { url: '/Users/00000000-0000-7000-8000-000000000000' }, 404)
      const invalid = await expectValid('scim_list_users', { url: '/Users?filter=userName%20eq' }, 400)
      assert.equal(invalid.scimType, 'invalidFilter')
      await expectValid('scim_create_user', { method: 'POST', url: '/Users', payload: { userName: user.userName } }, 409)
      await expectValid('scim_create_user', { method: 'POST', url: '/Users', payload: { userName: 'not a user name' } }, 400)
      await expectValid('scim_delete_group', { method: 'DELETE', url: `/Groups/${group.id as string}` }, 204)
      await expectValid('scim_delete_user', { method: 'DELETE', url: `/Users/${user.id as string}` }, 204)
      assert.equal(checked, 22)

      // The check can fail: an answer missing what the schema requires does not validate.
      const validate = ajv.compile({ $ref: 'openapi.json#/components/schemas/ScimError' })
      assert.equal(validate({ schemas: ['urn:ietf:params:scim:api:messages:2.0:Error'], status: 404, detail: 'x' }), false)
    })

    it('takes If-Match and Idempotency-Key in any letter case over HTTP, as the document spells them or not', async () => {
      const base = await listen(t.app)
      const key = { 'X-API-Key': t.adminKey, 'Content-Type': 'application/json' }
      const body = JSON.stringify({ username: uniqueName('casing'), password: GOOD_PASSWORD })
      const first = await rawRequest(base, 'POST', '/api/users', { ...key, 'Idempotency-Key': '"casing-1"' }, body)
      assert.equal(first.status, 201, first.body)
      const again = await rawRequest(base, 'POST', '/api/users', { ...key, 'IDEMPOTENCY-KEY': '"casing-1"' }, body)
      assert.equal(again.status, 201, again.body)
      assert.equal(again.headers['idempotent-replayed'], 'true', 'the same key in capitals is the same key')
      const id = JSON.parse(first.body).id as string
      const patch = JSON.stringify({ first_name: 'Casing' })
      for (const name of ['If-Match', 'if-match', 'IF-MATCH']) {
        const stale = await rawRequest(base, 'PATCH', `/api/users/${id}`, { ...key, 'Content-Type': 'application/merge-patch+json', [name]: '"999"' }, patch)
        assert.equal(stale.status, 412, `${name}: ${stale.body}`)
      }
      const current = await rawRequest(base, 'PATCH', `/api/users/${id}`, { ...key, 'Content-Type': 'application/merge-patch+json', 'If-Match': String(first.headers.etag) }, patch)
      assert.equal(current.status, 200, current.body)
    })

    it('on a 429 from the address limit, which is refused before any other hook runs', async () => {
      const limited = await createTestApp(dialect, { rateLimitPerAddress: 1 })
      try {
        const document = (await limited.app.inject({ url: '/auth/openapi.json' })).json()
        const refused = await limited.app.inject({ url: '/auth/api/version' })
        assert.equal(refused.statusCode, 429)
        const declared = headersOf(document, operations(document).get('get_version')!.responses['429'])
        for (const name of ['X-Request-Id', 'Retry-After', 'RateLimit-Limit', 'RateLimit-Reset']) {
          assert.ok(declared[name], `the 429 declares ${name}`)
          assert.equal(typeof refused.headers[name.toLowerCase()], 'string', `the 429 sends ${name}`)
        }
        assert.equal(refused.headers['x-request-id'], refused.json().request_id)
      } finally {
        await limited.app.close()
      }
    })
  })
}
