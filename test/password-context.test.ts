/**
 * ASVS 6.1.2 / 6.2.11 (security-checks A7★): a password may not contain the
 * words an attacker who knows the account tries first: the username, the
 * e-mail address's name part, and the service's own names
 * (PASSWORD_CONTEXT_WORDS). Every door that sets a password applies the rule
 * against the username and address the user will have once the request is
 * done.
 */
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import { loadConfig, ConfigError } from '../src/config.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const SCIM_USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'

/** An address whose local part is "mary.shelley.<hex>": "shelley" is a piece long enough to be refused. */
function shelleyAddress (): string {
  return `mary.shelley.${randomBytes(3).toString('hex')}@example.test`
}

function assertRefused (res: LightMyRequestResponse, code: string, pointer = '/password'): void {
  assert.equal(res.statusCode, 422, res.body)
  assert.equal(res.json().code, code)
  assert.equal(res.json().errors[0].pointer, pointer)
}

describe('PASSWORD_CONTEXT_WORDS', () => {
  it('defaults to the service\'s names, takes a comma-separated list, and none turns the rule off', () => {
    assert.deepEqual(loadConfig({}).passwordContextWords, ['gatehouse', 'pipeline', 'workflow'])
    assert.deepEqual(loadConfig({ PASSWORD_CONTEXT_WORDS: ' Acme, rocket-sled ,' }).passwordContextWords, ['Acme', 'rocket-sled'])
    assert.deepEqual(loadConfig({ PASSWORD_CONTEXT_WORDS: 'none' }).passwordContextWords, [])
  })

  it('refuses a word shorter than 3 characters, which would rule out too many unrelated passwords', () => {
    assert.throws(() => loadConfig({ PASSWORD_CONTEXT_WORDS: 'acme,io' }), (error: unknown) => error instanceof ConfigError && /"io" must have 3 to 64 characters/.test(error.message))
  })
})

for (const dialect of dialects()) {
  describe(`passwords refuse the account's and the service's words at every door (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const api = async (method: 'POST' | 'PATCH' | 'PUT', url: string, payload: object, headers = auth(t.adminKey)): Promise<LightMyRequestResponse> =>
      await t.app.inject({ method, url: `/auth${url}`, headers, payload })
    const createUser = async (fields: Record<string, unknown>): Promise<{ id: string, username: string, email: string | null }> => {
      const res = await api('POST', '/api/users', { username: uniqueName('pc'), password: GOOD_PASSWORD, ...fields })
      assert.equal(res.statusCode, 201, res.body)
      return res.json()
    }

    it('a new user\'s password may not contain their address\'s name part or a piece of it, ignoring case', async () => {
      const email = shelleyAddress()
      const local = email.split('@')[0]!
      for (const password of [`my ${local.toUpperCase()} secret`, 'Frankenstein by SHELLEY 1818']) {
        const res = await api('POST', '/api/users', { username: uniqueName('pc'), email, password })
        assertRefused(res, 'password_contains_email')
        assert.equal(res.json().errors[0].detail, 'contains the e-mail address\'s name part')
      }
      assert.equal((await api('POST', '/api/users', { username: uniqueName('pc'), email, password: 'Frankenstein by Godwin 1818' })).statusCode, 201)
    })

    it('does not refuse a password for a short piece of the address inside a longer word ("ada" in "Canada")', async () => {
      const res = await api('POST', '/api/users', { username: uniqueName('pc'), email: `ada.k.${randomBytes(3).toString('hex')}@example.test`, password: 'Canada by night train' })
      assert.equal(res.statusCode, 201, res.body)
    })

    it('checks a username of three or more characters, but not one of one or two, which would refuse every password holding those letters', async () => {
      const created = await api('POST', '/api/users', { username: 'jo', password: 'a JOurney to the jolly fjords' })
      assert.equal(created.statusCode, 201, created.body)
      assertRefused(await api('POST', '/api/users', { username: 'kit', password: 'tea at KITchen table four' }), 'password_contains_username')
      // Renamed to a short username in the same request as a password holding it: taken too.
      const renamed = await api('PATCH', `/api/users/${created.json().id as string}`, { username: 'qa', password: 'quality AQAbas of the sea' })
      assert.equal(renamed.statusCode, 200, renamed.body)
    })

    it('refuses the service\'s names, saying which word it found', async () => {
      for (const [password, word] of [['my data PIPELINE key', 'pipeline'], ['Gatehouse forever and ever', 'gatehouse'], ['daily workflows at nine', 'workflow']] as const) {
        const res = await api('POST', '/api/users', { username: uniqueName('pc'), password })
        assertRefused(res, 'password_contains_context_word')
        assert.equal(res.json().errors[0].detail, `contains "${word}"`)
        assert.match(res.json().detail, new RegExp(`"${word}"`))
      }
    })

    it('an update checks the password against the address the user will have: the one sent with it, else the stored one', async () => {
      const user = await createUser({ email: shelleyAddress() })
      assertRefused(await api('PATCH', `/api/users/${user.id}`, { password: 'shelley wrote this one' }), 'password_contains_email')
      const newAddress = `percy.bysshe.${randomBytes(3).toString('hex')}@example.test`
      assertRefused(await api('PATCH', `/api/users/${user.id}`, { email: newAddress, password: 'the bysshe passphrase' }), 'password_contains_email')
      const moved = await api('PATCH', `/api/users/${user.id}`, { email: newAddress, password: 'shelley wrote this one' })
      assert.equal(moved.statusCode, 200, moved.body)
      assert.equal((await api('POST', '/api/login', { username: user.username, password: 'shelley wrote this one' }, {})).statusCode, 200)
    })

    it('an import refuses the item and names the rule', async () => {
      const res = await api('POST', '/api/users/import', {
        atomic: false,
        users: [
          { username: uniqueName('pc'), email: shelleyAddress(), password: 'Shelley and the modern Prometheus' },
          { username: uniqueName('pc'), password: 'a pipeline of our own' },
          { username: uniqueName('pc'), email: shelleyAddress(), password: GOOD_PASSWORD }
        ]
      })
      assert.equal(res.statusCode, 200, res.body)
      assert.deepEqual(res.json().results.map((r: { status: string, code?: string }) => r.code ?? r.status), ['password_contains_email', 'password_contains_context_word', 'created'])
    })

    it('the user\'s own change, a reset link and an invitation refuse it too, and the link stays usable', async () => {
      const user = await createUser({ email: shelleyAddress() })
      const signedIn = await api('POST', '/api/login', { username: user.username, password: GOOD_PASSWORD }, {})
      const bearer = { authorization: `Bearer ${signedIn.json().token as string}` }
      assertRefused(await api('PUT', '/api/me/password', { current_password: GOOD_PASSWORD, new_password: 'Mary Shelley in Geneva' }, bearer), 'password_contains_email', '/new_password')
      assertRefused(await api('PUT', '/api/me/password', { current_password: GOOD_PASSWORD, new_password: 'one workflow to rule' }, bearer), 'password_contains_context_word', '/new_password')

      const link = await api('POST', `/api/users/${user.id}/password-reset`, {})
      assert.equal(link.statusCode, 200, link.body)
      const token = new URL(link.json().url as string).searchParams.get('token')!
      assertRefused(await api('POST', '/api/password-resets/complete', { token, new_password: 'shelley in the Alps' }, {}), 'password_contains_email', '/new_password')
      assert.equal((await api('POST', '/api/password-resets/complete', { token, new_password: 'a summer by the lake' }, {})).statusCode, 204)

      const invited = await api('POST', '/api/users', { username: uniqueName('pc'), email: shelleyAddress(), invite: true })
      assert.equal(invited.statusCode, 201, invited.body)
      const invitation = new URL(invited.json().invitation.url as string).searchParams.get('token')!
      assertRefused(await api('POST', '/api/invitations/accept', { token: invitation, password: 'Shelley joins the team' }, {}), 'password_contains_email')
      assert.equal((await api('POST', '/api/invitations/accept', { token: invitation, password: 'a summer by the lake' }, {})).statusCode, 200)
    })

    it('SCIM refuses it as 400 invalidValue, checking a PATCH against the addresses it sets', async () => {
      const made = await api('POST', '/api/api-keys', { name: uniqueName('okta'), scopes: ['scim'] })
      const scim = async (method: 'POST' | 'PATCH', path: string, payload: object): Promise<LightMyRequestResponse> =>
        await t.app.inject({ method, url: `/auth/scim/v2${path}`, headers: { authorization: `Bearer ${made.json().key as string}`, 'content-type': 'application/scim+json' }, payload: JSON.stringify(payload) })
      const assertInvalid = (res: LightMyRequestResponse, code: string): void => {
        assert.equal(res.statusCode, 400, res.body)
        assert.equal(res.json().scimType, 'invalidValue')
        assert.match(res.json().detail, code === 'password_contains_email' ? /e-mail address/ : /"pipeline"/)
      }
      const userName = uniqueName('pc')
      const emails = [{ value: shelleyAddress(), type: 'work', primary: true }]
      assertInvalid(await scim('POST', '/Users', { schemas: [SCIM_USER], userName, emails, password: 'Shelley from Okta' }), 'password_contains_email')
      const created = await scim('POST', '/Users', { schemas: [SCIM_USER], userName, emails, password: GOOD_PASSWORD })
      assert.equal(created.statusCode, 201, created.body)
      const id = created.json().id as string
      const patch = async (...operations: object[]): Promise<LightMyRequestResponse> => await scim('PATCH', `/Users/${id}`, { schemas: [PATCH_OP], Operations: operations })
      assertInvalid(await patch({ op: 'replace', path: 'password', value: 'the pipeline password' }), 'password_contains_context_word')
      assertInvalid(await patch({ op: 'replace', path: 'password', value: 'shelley once more' }), 'password_contains_email')
      const newAddress = `percy.bysshe.${randomBytes(3).toString('hex')}@example.test`
      assertInvalid(await patch({ op: 'replace', path: 'emails', value: [{ value: newAddress, type: 'work', primary: true }] }, { op: 'replace', path: 'password', value: 'bysshe from Okta' }), 'password_contains_email')
      const moved = await patch({ op: 'replace', path: 'emails', value: [{ value: newAddress, type: 'work', primary: true }] }, { op: 'replace', path: 'password', value: 'shelley once more' })
      assert.equal(moved.statusCode, 200, moved.body)
    })
  })

  describe(`PASSWORD_CONTEXT_WORDS set by the operator (${dialect.name})`, () => {
    it('refuses the operator\'s words instead of the defaults, and none of them with an empty list', async () => {
      const custom = await createTestApp(dialect, { passwordContextWords: ['Acme'] })
      try {
        const create = async (password: string): Promise<LightMyRequestResponse> =>
          await custom.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(custom.adminKey), payload: { username: uniqueName('pc'), password } })
        assertRefused(await create('ACME rocket sled'), 'password_contains_context_word')
        assert.equal((await create('my data pipeline key')).statusCode, 201)
      } finally {
        await custom.app.close()
      }
      const off = await createTestApp(dialect, { passwordContextWords: [] })
      try {
        const res = await off.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(off.adminKey), payload: { username: uniqueName('pc'), password: 'my data pipeline key' } })
        assert.equal(res.statusCode, 201, res.body)
      } finally {
        await off.app.close()
      }
    })
  })
}
