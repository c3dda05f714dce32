import assert from 'node:assert/strict'
import { before, describe, it } from 'node:test'
import fc from 'fast-check'
import { auth, dialects, useTestApp } from './helpers.ts'

const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'

/** A change to a user, as the REST API's merge patch says it; SCIM says the same in its own words. */
interface Change {
  username?: string
  first_name?: string | null
  last_name?: string | null
  email?: string | null
  disabled?: boolean
}

const token = fc.stringMatching(/^[a-z0-9]{1,12}$/)
const name = fc.string({ unit: 'grapheme', minLength: 1, maxLength: 30 })
const change: fc.Arbitrary<Change> = fc.record({
  username: token,
  first_name: fc.option(name, { nil: null }),
  last_name: fc.option(name, { nil: null }),
  email: fc.option(token, { nil: null }),
  disabled: fc.boolean()
}, { requiredKeys: [] }).filter(c => Object.keys(c).length > 0)

/** Each field in one of the forms Okta and Entra send it; `casing` and `pathless` pick among them. */
function scimOperations (change: Change, prefix: string, casing: (text: string) => string, pathless: boolean, booleanAsString: boolean): object[] {
  const ops: object[] = []
  const values: Record<string, unknown> = {}
  const set = (path: string, value: unknown): void => {
    if (pathless) values[path] = value
    else ops.push({ op: casing('replace'), path: casing(path), value })
  }
  if (change.username !== undefined) set('userName', `${prefix}${change.username}`)
  if (change.first_name !== undefined) {
    if (change.first_name === null) ops.push({ op: casing('remove'), path: 'name.givenName' })
    else set('name.givenName', change.first_name)
  }
  if (change.last_name !== undefined) {
    if (change.last_name === null) ops.push({ op: casing('remove'), path: 'name.familyName' })
    else set('name.familyName', change.last_name)
  }
  if (change.email !== undefined) {
    if (change.email === null) ops.push({ op: casing('remove'), path: 'emails' })
    else ops.push({ op: casing('replace'), path: 'emails', value: [{ value: `${prefix}${change.email}@example.org`, type: 'work', primary: true }] })
  }
  if (change.disabled !== undefined) set('active', booleanAsString ? (change.disabled ? 'False' : 'True') : !change.disabled)
  if (Object.keys(values).length > 0) ops.push({ op: casing('replace'), value: values })
  return ops
}

function mergePatch (change: Change, prefix: string): Record<string, unknown> {
  const body: Record<string, unknown> = {}
  if (change.username !== undefined) body.username = `${prefix}${change.username}`
  if (change.first_name !== undefined) body.first_name = change.first_name
  if (change.last_name !== undefined) body.last_name = change.last_name
  if (change.email !== undefined) body.email = change.email === null ? null : `${prefix}${change.email}@example.org`
  if (change.disabled !== undefined) body.disabled = change.disabled
  return body
}

/** The stored user as the REST API shows it, without what differs by construction: id, timestamps and the prefix of username and email. */
function comparable (user: Record<string, unknown>, prefix: string): Record<string, unknown> {
  const { id: _id, created_at: _c, updated_at: _u, last_login_at: _l, password_changed_at: _p, ...rest } = user
  return { ...rest, username: String(rest.username).slice(prefix.length), email: rest.email === null ? null : String(rest.email).slice(prefix.length) }
}

for (const dialect of dialects()) {
  describe(`SCIM PATCH and the REST API's merge patch (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    let scimKey = ''
    before(async () => {
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'scim', scopes: ['scim'] } })
      scimKey = made.json().key
    })

    it('store the same user for the same change, in every form the identity providers send it', async () => {
      let run = 0
      await fc.assert(fc.asyncProperty(
        fc.record({ first_name: fc.option(name, { nil: null }), last_name: fc.option(name, { nil: null }), email: fc.boolean(), disabled: fc.boolean() }),
        change,
        fc.constantFrom((s: string) => s, (s: string) => s.toUpperCase(), (s: string) => s[0]!.toUpperCase() + s.slice(1)),
        fc.boolean(),
        fc.boolean(),
        async (start, wanted, casing, pathless, booleanAsString) => {
          run += 1
          // Two users alike but for a prefix, which keeps usernames and addresses apart.
          const viaScim = `s${run}x`
          const viaRest = `r${run}x`
          const make = async (prefix: string): Promise<string> => {
            const res = await t.app.inject({
              method: 'POST',
              url: '/auth/api/users',
              headers: auth(t.adminKey),
              payload: { username: `${prefix}start`, first_name: start.first_name, last_name: start.last_name, email: start.email ? `${prefix}start@example.org` : null, disabled: start.disabled }
            })
            assert.equal(res.statusCode, 201, res.body)
            return res.json().id
          }
          const scimId = await make(viaScim)
          const restId = await make(viaRest)

          const scimRes = await t.app.inject({
            method: 'PATCH',
            url: `/auth/scim/v2/Users/${scimId}`,
            headers: { authorization: `Bearer ${scimKey}`, 'content-type': 'application/scim+json' },
            payload: JSON.stringify({ schemas: [PATCH_OP], Operations: scimOperations(wanted, viaScim, casing, pathless, booleanAsString) })
          })
          const restRes = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${restId}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify(mergePatch(wanted, viaRest)) })
          assert.equal(scimRes.statusCode, 200, scimRes.body)
          assert.equal(restRes.statusCode, 200, restRes.body)
          const read = async (id: string): Promise<Record<string, unknown>> => (await t.app.inject({ method: 'GET', url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })).json()
          assert.deepEqual(comparable(await read(scimId), viaScim), comparable(await read(restId), viaRest))
        }), { numRuns: 40 })
    })
  })
}
