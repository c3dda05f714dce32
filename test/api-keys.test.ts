import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

for (const dialect of dialects()) {
  describe(`API keys (${dialect.name})`, () => {
    const logLines: string[] = []
    const t = useTestApp(dialect, {}, { write: (line: string) => { logLines.push(line) } })

    const createKey = async (body: Record<string, unknown> = { name: 'test' }, key = t.adminKey) =>
      await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(key), payload: body })

    it('creates a key whose secret is shown once and stored only as a SHA-256 digest', async () => {
      const res = await createKey({ name: 'nightly export', scopes: ['users:read'] })
      assert.equal(res.statusCode, 201, res.body)
      const key = res.json()
      assert.match(key.key, /^gatehouse_[0-9A-Za-z]{43}$/)
      assert.equal(key.prefix, key.key.slice(0, 'gatehouse_'.length + 6))
      assert.deepEqual(key.scopes, ['users:read'])
      assert.equal(res.headers.location, `/auth/api/api-keys/${key.id}`)

      const listed = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json()
      const mine = listed.find((k: { id: string }) => k.id === key.id)
      assert.ok(mine)
      assert.ok(!('key' in mine) && !JSON.stringify(listed).includes(key.key))
      const got = (await t.app.inject({ url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })).json()
      assert.ok(!('key' in got))

      const rows = await t.app.db.selectFrom('api_keys').selectAll().execute()
      assert.ok(!JSON.stringify(rows).includes(key.key), 'no key material in the database')
      const row = rows.find(r => r.id === key.id)!
      assert.match(row.digest, /^[0-9a-f]{64}$/)
    })

    it('makes 1000 distinct secrets', async () => {
      const { generateApiKeySecret } = await import('../src/api-keys/api-keys.service.ts')
      const secrets = new Set(Array.from({ length: 1000 }, generateApiKeySecret))
      assert.equal(secrets.size, 1000)
    })

    it('accepts the key as ?API_KEY=, X-API-Key and Authorization: Bearer', async () => {
      const key = (await createKey()).json().key
      for (const request of [
        { url: `/auth/api/users?API_KEY=${key}` },
        { url: '/auth/api/users', headers: { 'x-api-key': key } },
        { url: '/auth/api/users', headers: { authorization: `Bearer ${key}` } }
      ]) {
        const res = await t.app.inject(request)
        assert.equal(res.statusCode, 200, JSON.stringify(request))
      }
    })

    it('answers 401 with WWW-Authenticate for missing, unknown, malformed and revoked keys', async () => {
      const key = (await createKey()).json()
      await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })
      for (const headers of [
        {},
        { 'x-api-key': 'gatehouse_' + 'x'.repeat(43) },
        { authorization: 'Basic dXNlcjpwYXNz' },
        { authorization: `Bearer ${key.key}` }
      ]) {
        const res = await t.app.inject({ url: '/auth/api/users', headers })
        assert.equal(res.statusCode, 401, JSON.stringify(headers))
        assert.equal(res.json().code, 'unauthenticated')
        assert.match(res.headers['www-authenticate'] as string, /Bearer/)
        assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
      }
    })

    it('refuses a revoked key on the very next request', async () => {
      const key = (await createKey()).json()
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 200)
      const revoke = await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })
      assert.equal(revoke.statusCode, 204)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 401)
      const again = await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })
      assert.equal(again.statusCode, 204, 'revoking twice is not an error')
      const listed = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json()
      assert.ok(!listed.some((k: { id: string }) => k.id === key.id), 'revoked keys are hidden by default')
      const all = (await t.app.inject({ url: '/auth/api/api-keys?include_revoked=true', headers: auth(t.adminKey) })).json()
      assert.ok(all.find((k: { id: string }) => k.id === key.id).revoked_at)
    })

    it('refuses an expired key with 401 and a past expiry at creation with 422', async () => {
      const past = await createKey({ name: 'x', expires_at: '2020-01-01T00:00:00Z' })
      assert.equal(past.statusCode, 422)
      const key = (await createKey({ name: 'short-lived', expires_at: new Date(Date.now() + 1500).toISOString() })).json()
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 200)
      await new Promise(resolve => setTimeout(resolve, 1600))
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 401)
    })

    it('rotates: a new secret for the same key, and the old one stops working at once', async () => {
      const key = (await createKey({ name: 'rotating', scopes: ['users:read'] })).json()
      const res = await t.app.inject({ method: 'POST', url: `/auth/api/api-keys/${key.id}/rotate`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200)
      const rotated = res.json()
      assert.equal(rotated.id, key.id)
      assert.deepEqual(rotated.scopes, ['users:read'])
      assert.notEqual(rotated.key, key.key)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(key.key) })).statusCode, 401)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(rotated.key) })).statusCode, 200)
      await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${key.id}`, headers: auth(t.adminKey) })
      const revoked = await t.app.inject({ method: 'POST', url: `/auth/api/api-keys/${key.id}/rotate`, headers: auth(t.adminKey) })
      assert.equal(revoked.statusCode, 409)
    })

    it('answers 403 when the key lacks the scope, and leaves nothing changed', async () => {
      const reader = (await createKey({ name: 'reader', scopes: ['users:read'] })).json().key
      const writer = (await createKey({ name: 'writer', scopes: ['users:write'] })).json().key
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(reader) })).statusCode, 200)
      const username = uniqueName()
      const denied = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(reader), payload: { username } })
      assert.equal(denied.statusCode, 403)
      assert.equal(denied.json().code, 'forbidden')
      assert.deepEqual((await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })).json(), [])
      assert.equal((await t.app.inject({ url: '/auth/api/events', headers: auth(reader) })).statusCode, 403)
      assert.equal((await t.app.inject({ url: '/auth/api/api-keys', headers: auth(reader) })).statusCode, 403)
      assert.equal((await t.app.inject({ url: '/auth/api/users', headers: auth(writer) })).statusCode, 403)
    })

    it('lets a users:write key manage plain users but not roles or admin accounts', async () => {
      const writer = (await createKey({ name: 'writer', scopes: ['users:write'] })).json().key
      const plain = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(writer), payload: { username: uniqueName() } })
      assert.equal(plain.statusCode, 201)
      const asAdmin = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(writer), payload: { username: uniqueName(), role: 'admin' } })
      assert.equal(asAdmin.statusCode, 403)
      const admin = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), role: 'admin' } })).json()
      const resetAdmin = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${admin.id}`, headers: auth(writer), payload: { password: GOOD_PASSWORD } })
      assert.equal(resetAdmin.statusCode, 403)
      const deleteAdmin = await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${admin.id}`, headers: auth(writer) })
      assert.equal(deleteAdmin.statusCode, 403)
      const promote = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${plain.json().id}`, headers: auth(writer), payload: { role: 'admin' } })
      assert.equal(promote.statusCode, 403)
    })

    it('rejects unknown scopes and fields when creating a key', async () => {
      assert.equal((await createKey({ name: 'x', scopes: ['root'] })).statusCode, 422)
      assert.equal((await createKey({ name: 'x', digest: 'abc' })).statusCode, 422)
      assert.equal((await createKey({})).statusCode, 422)
    })

    it('never writes a key into a log line, an error body or an event', async () => {
      const sentinel = (await createKey({ name: 'sentinel' })).json()
      const revokedSentinel = (await createKey({ name: 'sentinel2' })).json()
      await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${revokedSentinel.id}`, headers: auth(t.adminKey) })
      const bodies: string[] = []
      for (const request of [
        { url: `/auth/api/users?limit=1&API_KEY=${sentinel.key}` },
        { url: `/auth/api/users?API_KEY=${revokedSentinel.key}` },
        { url: `/auth/api/nowhere?API_KEY=${sentinel.key}` },
        { url: `/auth/api/users?limit=0&API_KEY=${sentinel.key}` },
        // The same parameter, percent-encoded: the query parser decodes the name, so it authenticates.
        { url: `/auth/api/users?limit=1&API%5FKEY=${sentinel.key}` },
        { url: `/auth/api/users?%41PI_KEY=${sentinel.key}&limit=1` },
        { url: `/auth/api/nowhere?%41PI%5FKEY=${revokedSentinel.key}` },
        { url: '/auth/api/users', headers: { authorization: `Bearer ${revokedSentinel.key}` } },
        { url: '/auth/api/users?limit=1', headers: { 'x-api-key': sentinel.key } }
      ]) {
        const res = await t.app.inject(request)
        bodies.push(res.body, JSON.stringify(res.headers))
      }
      const events = (await t.app.inject({ url: '/auth/api/events?limit=1000', headers: auth(t.adminKey) })).body
      const everything = [...logLines, ...bodies, events].join('\n')
      assert.ok(logLines.some(line => line.includes('API_KEY=[redacted]')), 'the query form was logged, redacted')
      for (const secret of [sentinel.key, revokedSentinel.key, t.adminKey]) {
        assert.ok(!everything.includes(secret), 'a secret leaked')
      }
    })
  })

  describe(`API keys in the URL switched off (${dialect.name})`, () => {
    const t = useTestApp(dialect, { allowQueryApiKey: false })

    it('refuses ?API_KEY= with 401 but still takes the headers', async () => {
      const res = await t.app.inject({ url: `/auth/api/users?API_KEY=${t.adminKey}` })
      assert.equal(res.statusCode, 401)
      assert.match(res.json().detail, /switched off/)
      assert.equal((await t.app.inject({ url: '/auth/api/users', headers: auth(t.adminKey) })).statusCode, 200)
    })

    it('leaves public routes alone: a stray query key does not turn health checks into 401s', async () => {
      assert.equal((await t.app.inject({ url: `/auth/healthz?API_KEY=${t.adminKey}` })).statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/api/version', headers: { authorization: 'Basic x' } })).statusCode, 200)
    })
  })

  describe(`disabling a user (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('revokes the API keys the user owns', async () => {
      // A second admin, so demoting the first is not refused as the last admin.
      await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), role: 'admin' } })
      const user = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), role: 'admin' } })).json()
      // Keys are owned by the user whose credential created them; make one owned by this user directly.
      const { insertKeyForSecret, generateApiKeySecret } = await import('../src/api-keys/api-keys.service.ts')
      const secret = generateApiKeySecret()
      await t.app.db.transaction().execute(async trx => {
        await insertKeyForSecret(trx, { actorType: 'system', actorId: null, requestId: null, clientIp: null }, secret, { name: 'owned', scopes: ['admin'], userId: user.id, expiresAt: null })
      })
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 200)
      const demote = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { role: 'user' } })
      assert.equal(demote.statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 403, 'a key keeps no admin power its owner lost')
      const disable = await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey), payload: { disabled: true } })
      assert.equal(disable.statusCode, 200)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 401)
      const events = (await t.app.inject({ url: '/auth/api/events?type=api_key.revoked', headers: auth(t.adminKey) })).json()
      assert.equal(events[0].data.reason, 'user_disabled')
    })

    it('records the revocation of a deleted user\'s keys', async () => {
      const user = (await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), role: 'admin' } })).json()
      const { insertKeyForSecret, generateApiKeySecret } = await import('../src/api-keys/api-keys.service.ts')
      const secret = generateApiKeySecret()
      const key = await t.app.db.transaction().execute(async trx => await insertKeyForSecret(trx, { actorType: 'system', actorId: null, requestId: null, clientIp: null }, secret, { name: 'owned', scopes: ['admin'], userId: user.id, expiresAt: null }))
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${user.id}`, headers: auth(t.adminKey) })).statusCode, 204)
      assert.equal((await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode, 401)
      const events = (await t.app.inject({ url: `/auth/api/events?target_id=${key.id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(events.map((e: { type: string, data: { reason?: string } }) => [e.type, e.data.reason]), [['api_key.revoked', 'user_deleted'], ['api_key.created', undefined]])
    })
  })
}

for (const dialect of dialects()) {
  describe(`how many API keys one owner holds (${dialect.name})`, () => {
    const LIMIT = 4
    const t = useTestApp(dialect, { apiKeysPerOwner: LIMIT })

    /** A new admin user, signed in: the keys they create are theirs. */
    async function adminSession (): Promise<{ id: string, token: string }> {
      const username = uniqueName('keyholder')
      const user = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD, role: 'admin' } })
      assert.equal(user.statusCode, 201, user.body)
      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
      assert.equal(login.statusCode, 200, login.body)
      return { id: user.json().id, token: login.json().token }
    }
    const create = async (token: string, name: string) =>
      await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: { authorization: `Bearer ${token}` }, payload: { name } })
    const liveKeysOf = async (userId: string): Promise<number> =>
      (await t.app.db.selectFrom('api_keys').select('id').where('user_id', '=', userId).where('revoked_at', 'is', null).execute()).length

    it('refuses a key beyond API_KEYS_PER_OWNER live ones with 409 too_many_api_keys; revoked and expired keys do not count, nor other owners\' keys', async () => {
      const holder = await adminSession()
      const made: string[] = []
      for (let i = 0; i < LIMIT; i++) {
        const res = await create(holder.token, `key ${i}`)
        assert.equal(res.statusCode, 201, res.body)
        assert.equal(res.json().user_id, holder.id)
        made.push(res.json().id)
      }
      const refused = await create(holder.token, 'one too many')
      assert.equal(refused.statusCode, 409, refused.body)
      assert.equal(refused.json().code, 'too_many_api_keys')
      assert.match(refused.json().detail, /hold 4 live API keys; at most 4/)
      assert.equal(await liveKeysOf(holder.id), LIMIT, 'the refused create made nothing')
      const events = (await t.app.inject({ url: `/auth/api/events?type=api_key.created&actor_id=${holder.id}&limit=100`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, LIMIT)

      // Someone else's keys are theirs to count: the bootstrap key, owned by no user, still creates.
      assert.equal((await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'not theirs' } })).statusCode, 201)

      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/api-keys/${made[0]}`, headers: auth(t.adminKey) })).statusCode, 204)
      assert.equal((await create(holder.token, 'in place of a revoked one')).statusCode, 201)
      assert.equal((await create(holder.token, 'again one too many')).statusCode, 409)

      // A key past its expiry is no longer live (made directly: the API refuses a past expiry).
      await t.app.db.updateTable('api_keys').set({ expires_at: new Date(Date.now() - 60_000).toISOString() }).where('id', '=', made[1]!).execute()
      assert.equal((await create(holder.token, 'in place of an expired one')).statusCode, 201)
    })

    it('counts creates that arrive at once one after another: exactly API_KEYS_PER_OWNER of them succeed', async () => {
      const holder = await adminSession()
      const answers = await Promise.all(Array.from({ length: 2 * LIMIT }, async (_, i) => await create(holder.token, `burst ${i}`)))
      const statuses = answers.map(a => a.statusCode).sort()
      assert.deepEqual(statuses, [...Array(LIMIT).fill(201), ...Array(LIMIT).fill(409)], answers.map(a => a.body).join('\n'))
      assert.equal(await liveKeysOf(holder.id), LIMIT)
    })
  })
}
