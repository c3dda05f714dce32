import assert from 'node:assert/strict'
import { randomBytes, scryptSync } from 'node:crypto'
import { describe, it } from 'node:test'
import { hash as argon2Hash } from '@node-rs/argon2'
import { hashSync as bcryptHashSync } from '@node-rs/bcrypt'
import { checkImportedHash } from '../src/lib/passwords.ts'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

const URL = '/auth/api/users/import'

/** A passlib-style scrypt PHC string: ln is log2 N, salt and hash in unpadded standard base64. */
function scryptPhc (password: string, ln = 10, r = 8, p = 1): string {
  const salt = randomBytes(16)
  const key = scryptSync(password, salt, 32, { N: 2 ** ln, r, p })
  const b64 = (b: Buffer): string => b.toString('base64').replace(/=+$/, '')
  return `$scrypt$ln=${ln},r=${r},p=${p}$${b64(salt)}$${b64(key)}`
}

const SALT = 'c29tZXNhbHRzb21lc2FsdA'
const HASH32 = 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'

describe('imported hash formats (no hashing involved)', () => {
  it('accepts the three schemes within bounds and refuses the rest with a code', () => {
    const ok: Array<[string, string]> = [
      [`$argon2id$v=19$m=19456,t=2,p=1$${SALT}$${HASH32}`, 'argon2id'],
      [`$argon2i$v=19$m=1048576,t=10,p=16$${SALT}$${HASH32}`, 'argon2i'],
      [`$argon2d$v=19$m=4096,t=3,p=1$${SALT}$${HASH32}`, 'argon2d'],
      [bcryptHashSync('x', 4), 'bcrypt'],
      [bcryptHashSync('x', 4).replace('$2b$', '$2y$'), 'bcrypt'],
      [`$2a$15$${'a'.repeat(53)}`, 'bcrypt'],
      [scryptPhc('x', 4), 'scrypt'],
      [`$scrypt$ln=17,r=32,p=16$${SALT}==$${HASH32}=`, 'scrypt'],
      [`$scrypt$ln=10,p=1,r=8$${SALT}$${HASH32}`, 'scrypt']
    ]
    for (const [hash, scheme] of ok) assert.deepEqual(checkImportedHash(hash), { ok: true, scheme }, hash)
    const refused: Array<[string, string]> = [
      [`$argon2id$v=19$m=2097152,t=2,p=1$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$argon2id$v=19$m=19456,t=11,p=1$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$argon2id$v=19$m=19456,t=2,p=17$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$2b$16$${'a'.repeat(53)}`, 'password_hash_out_of_bounds'],
      [`$scrypt$ln=18,r=8,p=1$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$scrypt$ln=16384,r=8,p=1$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$scrypt$ln=14,r=33,p=1$${SALT}$${HASH32}`, 'password_hash_out_of_bounds'],
      [`$argon2id$v=16$m=19456,t=2,p=1$${SALT}$${HASH32}`, 'password_hash_unsupported'],
      [`$argon2id$m=19456,t=2,p=1$${SALT}$${HASH32}`, 'password_hash_unsupported'],
      [`$argon2id$v=19$m=19456,t=2,p=1$${SALT}`, 'password_hash_unsupported'],
      [`$2b$03$${'a'.repeat(53)}`, 'password_hash_unsupported'],
      [`$2b$10$${'a'.repeat(52)}`, 'password_hash_unsupported'],
      [`$scrypt$ln=14,r=8$${SALT}$${HASH32}`, 'password_hash_unsupported'],
      [`$scrypt$ln=14,r=8,p=1,p=1$${SALT}$${HASH32}`, 'password_hash_unsupported'],
      ['$pbkdf2-sha256$29000$abc$def', 'password_hash_unsupported'],
      ['plaintext', 'password_hash_unsupported']
    ]
    for (const [hash, code] of refused) {
      const checked = checkImportedHash(hash)
      assert.equal(checked.ok, false, hash)
      assert.equal(!checked.ok && checked.code, code, hash)
    }
  })
})

for (const dialect of dialects()) {
  describe(`POST /api/users/import (${dialect.name})`, () => {
    const t: TestApp = useTestApp(dialect)

    async function login (username: string, password: string): Promise<number> {
      return (await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password } })).statusCode
    }
    async function storedHash (username: string): Promise<string | null> {
      const row = await t.app.db.selectFrom('users').select('password_hash').where('username_key', '=', username.toLowerCase()).executeTakeFirstOrThrow()
      return row.password_hash
    }

    it('imports bcrypt and scrypt hashes; sign-in verifies them and upgrades them to argon2id', async () => {
      const [b, s, a] = [uniqueName('bc'), uniqueName('sc'), uniqueName('ai')]
      const bcryptHash = bcryptHashSync(GOOD_PASSWORD, 5)
      const scryptHash = scryptPhc(GOOD_PASSWORD, 12)
      const argon2iHash = await argon2Hash(GOOD_PASSWORD, { algorithm: 1, memoryCost: 4096, timeCost: 3, parallelism: 1 })
      assert.match(argon2iHash, /^\$argon2i\$/)
      const res = await t.app.inject({
        method: 'POST',
        url: URL,
        headers: auth(t.adminKey),
        payload: { users: [{ username: b, password_hash: bcryptHash }, { username: s, email: `${s}@example.com`, password_hash: scryptHash }, { username: a, password_hash: argon2iHash }] }
      })
      assert.equal(res.statusCode, 200, res.body)
      const report = res.json()
      assert.equal(report.created, 3)
      assert.equal(report.failed, 0)
      assert.deepEqual(report.results.map((r: { index: number, status: string }) => [r.index, r.status]), [[0, 'created'], [1, 'created'], [2, 'created']])
      assert.equal(await storedHash(b), bcryptHash, 'stored as given, not recomputed')
      assert.equal(await storedHash(s), scryptHash)

      // The events say so, and never carry the hash.
      const events = (await t.app.inject({ method: 'GET', url: `/auth/api/events?type=user.created&target_id=${report.results[0].id as string}`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, 1)
      assert.equal(events[0].data.password, '[redacted]')
      assert.equal(events[0].data.imported_hash_scheme, 'bcrypt')
      assert.equal(events[0].data.username, b)
      assert.ok(!JSON.stringify(events).includes(bcryptHash.slice(7)))

      for (const name of [b, s, a]) {
        assert.equal(await login(name, 'wrong horse battery staple'), 401, name)
        assert.equal(await login(name, GOOD_PASSWORD), 200, name)
        assert.match(await storedHash(name) ?? '', /^\$argon2id\$v=19\$m=19456,t=2,p=1\$/, `${name} was re-hashed`)
        assert.equal(await login(name, GOOD_PASSWORD), 200, `${name} signs in with the new hash`)
      }
    })

    it('bcrypt never matches on a 72-byte prefix', async () => {
      const name = uniqueName('bc')
      const long = 'x'.repeat(72)
      const res = await t.app.inject({ method: 'POST', url: URL, headers: auth(t.adminKey), payload: { users: [{ username: name, password_hash: bcryptHashSync(long, 4) }] } })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(await login(name, long + 'tail'), 401)
      assert.equal(await login(name, long), 200)
    })

    it('refuses out-of-bound and malformed hashes per item with 422, at once, without creating anything (atomic)', async () => {
      const names = Array.from({ length: 6 }, () => uniqueName('oob'))
      const started = process.hrtime.bigint()
      const res = await t.app.inject({
        method: 'POST',
        url: URL,
        headers: auth(t.adminKey),
        payload: {
          users: [
            { username: names[0], password_hash: bcryptHashSync(GOOD_PASSWORD, 4).replace('$04$', '$16$') },
            { username: names[1], password_hash: scryptPhc(GOOD_PASSWORD, 4).replace('ln=4', 'ln=18') },
            { username: names[2], password_hash: `$argon2id$v=19$m=2097152,t=2,p=1$${SALT}$${HASH32}` },
            { username: names[3], password_hash: '$md5$nope' },
            { username: names[4], password_hash: bcryptHashSync(GOOD_PASSWORD, 4) },
            { username: names[5], password: GOOD_PASSWORD }
          ]
        }
      })
      const ms = Number(process.hrtime.bigint() - started) / 1e6
      assert.equal(res.statusCode, 422, res.body)
      assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
      const problem = res.json()
      assert.equal(problem.code, 'import_failed')
      assert.equal(problem.created, 0)
      assert.equal(problem.failed, 4)
      assert.deepEqual(problem.results.map((r: { status: string, code?: string }) => [r.status, r.code]), [
        ['error', 'password_hash_out_of_bounds'],
        ['error', 'password_hash_out_of_bounds'],
        ['error', 'password_hash_out_of_bounds'],
        ['error', 'password_hash_unsupported'],
        ['not_created', undefined],
        ['not_created', undefined]
      ])
      // Nothing was hashed or verified: a cost-16 bcrypt, a 256 MiB scrypt or a 2 GiB argon2 would each take far longer.
      assert.ok(ms < 500, `took ${ms} ms`)
      for (const name of names) assert.equal(await storedHash(name).catch(() => 'absent'), 'absent', name)
    })

    it('atomic: false creates the valid items and reports the others: policy, both fields, duplicates in the batch and with existing users', async () => {
      const existing = uniqueName('ex')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: existing, email: `${existing}@example.com` } })
      assert.equal(created.statusCode, 201)
      const [a, b, c, d] = [uniqueName('na'), uniqueName('na'), uniqueName('na'), uniqueName('na')]
      const res = await t.app.inject({
        method: 'POST',
        url: URL,
        headers: auth(t.adminKey),
        payload: {
          atomic: false,
          users: [
            { username: a, email: `${a}@example.com`, password: GOOD_PASSWORD, groups: ['etl'] },
            { username: existing.toUpperCase() },
            { username: b, email: `${existing}@EXAMPLE.com` },
            { username: a.toUpperCase() },
            { username: c, email: `${a}@example.com` },
            { username: d, password: 'short' },
            { username: uniqueName('na'), password: GOOD_PASSWORD, password_hash: bcryptHashSync(GOOD_PASSWORD, 4) },
            { username: d, role: 'admin', disabled: true }
          ]
        }
      })
      assert.equal(res.statusCode, 200, res.body)
      const report = res.json()
      assert.equal(report.atomic, false)
      assert.equal(report.created, 2)
      assert.equal(report.failed, 6)
      assert.deepEqual(report.results.map((r: { status: string, code?: string }) => r.code ?? r.status), [
        'created', 'username_taken', 'email_taken', 'username_taken', 'email_taken', 'password_too_short', 'validation_failed', 'created'
      ])
      assert.match(report.results[3].detail, /repeats item 0/)
      const user = (await t.app.inject({ method: 'GET', url: `/auth/api/users/${report.results[0].id as string}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual([user.username, user.groups, user.role], [a, ['etl'], 'user'])
      assert.match(await storedHash(a) ?? '', /^\$argon2id\$/, 'a plaintext password is hashed with argon2id')
      assert.equal(await login(a, GOOD_PASSWORD), 200)
      const admin = (await t.app.inject({ method: 'GET', url: `/auth/api/users/${report.results[7].id as string}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual([admin.role, admin.disabled, admin.password_changed_at], ['admin', true, null])
      const events = (await t.app.inject({ method: 'GET', url: `/auth/api/events?type=user.created&target_id=${user.id as string}`, headers: auth(t.adminKey) })).json()
      assert.equal(events.length, 1)
      assert.equal(events[0].data.password, '[redacted]')
      assert.equal(events[0].data.imported_hash_scheme, undefined)
    })

    it('is for admins only, JSON only, at most 1000 users, and rejects unknown fields as a whole', async () => {
      const limited = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'writer', scopes: ['users:read', 'users:write'] } })).json().key as string
      const one = { users: [{ username: uniqueName() }] }
      assert.equal((await t.app.inject({ method: 'POST', url: URL, payload: one })).statusCode, 401)
      const forbidden = await t.app.inject({ method: 'POST', url: URL, headers: auth(limited), payload: one })
      assert.equal(forbidden.statusCode, 403)
      const form = await t.app.inject({ method: 'POST', url: URL, headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' }, payload: 'users=x' })
      assert.equal(form.statusCode, 415)
      const tooMany = await t.app.inject({ method: 'POST', url: URL, headers: auth(t.adminKey), payload: { users: Array.from({ length: 1001 }, (_, i) => ({ username: `many${i}` })) } })
      assert.equal(tooMany.statusCode, 422)
      assert.equal(tooMany.json().code, 'validation_failed')
      const unknown = await t.app.inject({ method: 'POST', url: URL, headers: auth(t.adminKey), payload: { users: [{ username: uniqueName(), id: '0190b2a0-0000-7000-8000-000000000000' }] } })
      assert.equal(unknown.statusCode, 422)
      assert.deepEqual(unknown.json().errors.map((e: { pointer: string }) => e.pointer), ['/users/0/id'])
    })

    it('imports 1000 users with hashes in one request, and documents the operation in OpenAPI', async () => {
      const hash = bcryptHashSync(GOOD_PASSWORD, 4)
      const stem = uniqueName('bulk')
      const users = Array.from({ length: 1000 }, (_, i) => ({ username: `${stem}_${i}`, email: `${stem}_${i}@example.com`, first_name: 'Bulk', password_hash: hash }))
      const res = await t.app.inject({ method: 'POST', url: URL, headers: auth(t.adminKey), payload: { users } })
      assert.equal(res.statusCode, 200, res.body.slice(0, 500))
      assert.equal(res.json().created, 1000)
      const ids = res.json().results.map((r: { id: string }) => r.id)
      const count = await t.app.db.selectFrom('events').select(eb => eb.fn.countAll<number | string>().as('n'))
        .where('type', '=', 'user.created').where('target_id', 'in', ids).executeTakeFirstOrThrow()
      assert.equal(Number(count.n), 1000)

      const spec = await t.app.inject({ method: 'GET', url: '/auth/openapi.json' })
      assert.equal(spec.statusCode, 200)
      const doc = spec.json()
      const op = doc.paths['/auth/api/users/import']?.post
      assert.ok(op !== undefined, Object.keys(doc.paths).join(', '))
      assert.equal(op.operationId, 'import_users')
      assert.deepEqual(op.tags, ['default'])
      assert.equal(doc.paths['/auth/users/import'], undefined, 'no legacy alias')
      for (const name of ['UserImport', 'UserImportItem', 'UserImportResult', 'UserImportItemResult']) {
        assert.ok(doc.components.schemas[name] !== undefined, name)
      }
    })
  })
}
