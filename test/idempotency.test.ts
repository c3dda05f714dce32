import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { buildApp } from '../src/app.ts'
import { defaultConfig } from '../src/config.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { purgeIdempotencyKeys } from '../src/idempotency/idempotency.service.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'

const DAY_MS = 24 * 3_600_000

interface Answer { statusCode: number, headers: Record<string, unknown>, body: string, json: () => any }

async function create (app: FastifyTypeBox, credential: string, key: string | undefined, payload: Record<string, unknown> | string, options: { url?: string, contentType?: string } = {}): Promise<Answer> {
  return await app.inject({
    method: 'POST',
    url: options.url ?? '/auth/api/users',
    headers: {
      ...auth(credential),
      ...(key !== undefined ? { 'idempotency-key': key } : {}),
      ...(options.contentType !== undefined ? { 'content-type': options.contentType } : {})
    },
    payload
  })
}

async function usersNamed (t: TestApp, username: string): Promise<Array<{ id: string }>> {
  const res = await t.app.inject({ url: `/auth/api/users?username=${encodeURIComponent(username)}`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function createdEvents (t: TestApp, userId: string): Promise<unknown[]> {
  const res = await t.app.inject({ url: `/auth/api/events?type=user.created&target_id=${userId}`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function keyRows (t: TestApp): Promise<number> {
  const row = await t.app.db.selectFrom('idempotency_keys').select(eb => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()
  return Number(row.n)
}

async function createApiKey (t: TestApp): Promise<string> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: uniqueName('key'), scopes: ['users:write', 'users:read'] } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json().key
}

function assertReplayOf (replay: Answer, first: Answer): void {
  assert.equal(replay.statusCode, first.statusCode)
  assert.equal(replay.body, first.body, 'the body, byte for byte')
  for (const name of ['content-type', 'location', 'etag']) assert.equal(replay.headers[name], first.headers[name], name)
  assert.equal(replay.headers['idempotent-replayed'], 'true')
  assert.notEqual(replay.headers['x-request-id'], first.headers['x-request-id'], 'the replay has its own request id')
}

for (const dialect of dialects()) {
  describe(`Idempotency-Key on Create User (${dialect.name})`, () => {
    const t = useTestApp(dialect)

    it('replays the first answer to a retry with the same key and body: same status, body, Location and ETag, one user and one user.created event', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = `"${randomUUID()}"`
      const first = await create(t.app, t.adminKey, key, body)
      assert.equal(first.statusCode, 201, first.body)
      assert.equal(first.headers['idempotent-replayed'], undefined)
      for (let i = 0; i < 2; i++) assertReplayOf(await create(t.app, t.adminKey, key, body), first)
      const users = await usersNamed(t, body.username)
      assert.equal(users.length, 1)
      assert.equal((await createdEvents(t, users[0]!.id)).length, 1)
    })

    it('makes Import Users retry-safe: a retry gets the first results again, each user created once, and another body is refused', async () => {
      const names = [uniqueName('imported'), uniqueName('imported')]
      const body = { atomic: false, users: names.map(username => ({ username, password: GOOD_PASSWORD })) }
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, body, { url: '/auth/api/users/import' })
      assert.equal(first.statusCode, 200, first.body)
      assert.deepEqual(first.json().results.map((r: { status: string }) => r.status), ['created', 'created'])
      // Without the key, the same import again would answer username_taken for both.
      assertReplayOf(await create(t.app, t.adminKey, key, body, { url: '/auth/api/users/import' }), first)
      for (const username of names) {
        const users = await usersNamed(t, username)
        assert.equal(users.length, 1)
        assert.equal((await createdEvents(t, users[0]!.id)).length, 1)
      }
      const other = await create(t.app, t.adminKey, key, { ...body, users: body.users.slice(0, 1) }, { url: '/auth/api/users/import' })
      assert.equal(other.statusCode, 422, other.body)
      assert.equal(other.json().code, 'idempotency_key_reused')
    })

    it('takes the key bare as well as quoted, as the same key', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, `"${key}"`, body)
      assert.equal(first.statusCode, 201, first.body)
      assertReplayOf(await create(t.app, t.adminKey, key, body), first)
    })

    it('refuses the same key with another body: 422 idempotency_key_reused, and nothing is created', async () => {
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, { username: uniqueName(), password: GOOD_PASSWORD })
      assert.equal(first.statusCode, 201, first.body)
      const other = { username: uniqueName(), password: GOOD_PASSWORD }
      const refused = await create(t.app, t.adminKey, key, other)
      assert.equal(refused.statusCode, 422, refused.body)
      assert.match(refused.headers['content-type'] as string, /^application\/problem\+json/)
      assert.equal(refused.json().code, 'idempotency_key_reused')
      assert.equal(refused.headers['idempotent-replayed'], undefined)
      assert.equal((await usersNamed(t, other.username)).length, 0)
      // The same fields in another order are other bytes: the fingerprint is of the body as sent.
      const reordered = await create(t.app, t.adminKey, key, `{"password":"${GOOD_PASSWORD}","username":"${first.json().username as string}"}`, { contentType: 'application/json' })
      assert.equal(reordered.json().code, 'idempotency_key_reused')
    })

    it('of five identical requests at once, creates one user; the others get its answer again or 409 idempotency_key_in_progress with Retry-After', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const answers = await Promise.all(Array.from({ length: 5 }, async () => await create(t.app, t.adminKey, key, body)))
      const made = answers.filter(a => a.statusCode === 201 && a.headers['idempotent-replayed'] === undefined)
      assert.equal(made.length, 1, answers.map(a => `${a.statusCode} ${a.body}`).join('\n'))
      for (const answer of answers) {
        if (answer === made[0]) continue
        if (answer.statusCode === 409) {
          assert.equal(answer.json().code, 'idempotency_key_in_progress')
          assert.equal(answer.headers['retry-after'], '1')
        } else {
          assertReplayOf(answer, made[0]!)
        }
      }
      const users = await usersNamed(t, body.username)
      assert.equal(users.length, 1)
      assert.equal((await createdEvents(t, users[0]!.id)).length, 1)
      // Once the first is answered, every retry gets its answer.
      assertReplayOf(await create(t.app, t.adminKey, key, body), made[0]!)
    })

    it('keeps keys apart per credential and per path: another API key, or the 3.6.1 path, with the same key is a new request', async () => {
      const other = await createApiKey(t)
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, { username: uniqueName(), password: GOOD_PASSWORD })
      assert.equal(first.statusCode, 201, first.body)
      const byOtherKey = { username: uniqueName(), password: GOOD_PASSWORD }
      const second = await create(t.app, other, key, byOtherKey)
      assert.equal(second.statusCode, 201, second.body)
      assert.equal(second.headers['idempotent-replayed'], undefined)
      assert.equal((await usersNamed(t, byOtherKey.username)).length, 1)
      const legacy = await create(t.app, t.adminKey, key, { username: uniqueName(), password: GOOD_PASSWORD }, { url: '/auth/users' })
      assert.equal(legacy.statusCode, 201, legacy.body)
      assert.equal(legacy.headers['idempotent-replayed'], undefined)
      // And each holds its own first answer.
      assertReplayOf(await create(t.app, other, key, byOtherKey), second)
    })

    it('keeps a signed-in user\'s keys for the user: a retry through another of their sessions gets the first answer', async () => {
      const admin = { username: uniqueName('admin'), password: GOOD_PASSWORD, role: 'admin' }
      assert.equal((await create(t.app, t.adminKey, undefined, admin)).statusCode, 201)
      const signIn = async (): Promise<string> => {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: admin.username, password: GOOD_PASSWORD } })
        assert.equal(res.statusCode, 200, res.body)
        return res.json().token
      }
      const [one, two] = [await signIn(), await signIn()]
      assert.notEqual(one, two)
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const first = await create(t.app, one, key, body)
      assert.equal(first.statusCode, 201, first.body)
      assertReplayOf(await create(t.app, two, key, body), first)
      // The deployment's key is another credential: the same key there is a new request.
      const byKey = await create(t.app, t.adminKey, key, body)
      assert.equal(byKey.json().code, 'username_taken')
      assert.equal(byKey.headers['idempotent-replayed'], undefined)
    })

    it('replays a 422 validation answer too (with the first request_id in its body); the corrected body needs a new key', async () => {
      const body = { username: uniqueName(), password: 'short' }
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, body)
      assert.equal(first.statusCode, 422, first.body)
      assert.equal(first.json().code, 'password_too_short')
      const replay = await create(t.app, t.adminKey, key, body)
      assertReplayOf(replay, first)
      assert.equal(replay.json().request_id, first.headers['x-request-id'])
      const corrected = await create(t.app, t.adminKey, key, { ...body, password: GOOD_PASSWORD })
      assert.equal(corrected.json().code, 'idempotency_key_reused')
      assert.equal((await create(t.app, t.adminKey, randomUUID(), { ...body, password: GOOD_PASSWORD })).statusCode, 201)
    })

    it('replays a form-urlencoded create on the 3.6.1 path, as 3.6.1 clients send it', async () => {
      const username = uniqueName()
      const form = `username=${username}&password=${encodeURIComponent(GOOD_PASSWORD)}&groups=a&groups=b`
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, form, { url: '/auth/users', contentType: 'application/x-www-form-urlencoded' })
      assert.equal(first.statusCode, 201, first.body)
      assertReplayOf(await create(t.app, t.adminKey, key, form, { url: '/auth/users', contentType: 'application/x-www-form-urlencoded' }), first)
      const swapped = await create(t.app, t.adminKey, key, form.replace('groups=a&groups=b', 'groups=b&groups=a'), { url: '/auth/users', contentType: 'application/x-www-form-urlencoded' })
      assert.equal(swapped.json().code, 'idempotency_key_reused')
      assert.equal((await usersNamed(t, username)).length, 1)
    })

    it('fingerprints a multipart body by its fields, so a retry with a new boundary is the same request', async () => {
      const username = uniqueName()
      const multipart = (boundary: string): string =>
        [['username', username], ['password', GOOD_PASSWORD]].map(([name, value]) => `--${boundary}\r\nContent-Disposition: form-data; name="${name!}"\r\n\r\n${value!}\r\n`).join('') + `--${boundary}--\r\n`
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, multipart('aaaa1111'), { url: '/auth/users', contentType: 'multipart/form-data; boundary=aaaa1111' })
      assert.equal(first.statusCode, 201, first.body)
      const retry = await create(t.app, t.adminKey, key, multipart('bbbb2222'), { url: '/auth/users', contentType: 'multipart/form-data; boundary=bbbb2222' })
      assertReplayOf(retry, first)
      assert.equal(retry.headers.deprecation, first.headers.deprecation, 'a 3.6.1 path still says it is deprecated')
      assert.equal((await usersNamed(t, username)).length, 1)
    })

    it('refuses a malformed key with 422 validation_failed pointing at the header, before anything is done', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      for (const key of ['', '""', 'two words', 'a,b', `"${'k'.repeat(256)}"`, 'k'.repeat(256), '"\u00e9"']) {
        const res = await create(t.app, t.adminKey, key, body)
        assert.equal(res.statusCode, 422, `${JSON.stringify(key)}: ${res.body}`)
        assert.equal(res.json().code, 'validation_failed')
        assert.deepEqual(res.json().errors.map((e: { in: string, pointer: string }) => [e.in, e.pointer]), [['header', '/idempotency-key']])
      }
      assert.equal((await usersNamed(t, body.username)).length, 0)
      assert.equal((await create(t.app, t.adminKey, `"${'k'.repeat(255)}"`, body)).statusCode, 201)
    })

    it('leaves the table alone for requests without the header', async () => {
      const before = await keyRows(t)
      const res = await create(t.app, t.adminKey, undefined, { username: uniqueName(), password: GOOD_PASSWORD })
      assert.equal(res.statusCode, 201, res.body)
      assert.equal(res.headers['idempotent-replayed'], undefined)
      assert.equal(await keyRows(t), before)
    })

    it('frees the key after 24 hours: the purge, driven a day ahead, removes it and the key makes a new request', async () => {
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, { username: uniqueName(), password: GOOD_PASSWORD })
      assert.equal(first.statusCode, 201, first.body)
      assert.equal(await purgeIdempotencyKeys(t.app.db, Date.now() + DAY_MS - 60_000), 0, 'kept within the day')
      const other = { username: uniqueName(), password: GOOD_PASSWORD }
      assert.equal((await create(t.app, t.adminKey, key, other)).json().code, 'idempotency_key_reused')
      assert.ok(await purgeIdempotencyKeys(t.app.db, Date.now() + DAY_MS + 1000) >= 1)
      const fresh = await create(t.app, t.adminKey, key, other)
      assert.equal(fresh.statusCode, 201, fresh.body)
      assert.equal(fresh.headers['idempotent-replayed'], undefined)
    })

    it('answers 409 with Retry-After while another instance holds the key, and lets a retry take it over once that holder\'s lease has run out', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const first = await create(t.app, t.adminKey, key, body)
      assert.equal(first.statusCode, 201, first.body)
      // As an instance that claimed the key and stopped before answering leaves it.
      const held = (until: number) => t.app.db.updateTable('idempotency_keys')
        .set({ state: 'in_progress', lock_token: 'another-instance', locked_until: new Date(until).toISOString(), status_code: null, response_headers: null, response_body: null })
        .where('key', '=', key).execute()
      await held(Date.now() + 60_000)
      const busy = await create(t.app, t.adminKey, key, body)
      assert.equal(busy.statusCode, 409, busy.body)
      assert.equal(busy.json().code, 'idempotency_key_in_progress')
      assert.equal(busy.headers['retry-after'], '1')
      await held(Date.now() - 1000)
      // The request runs again: the user exists, so this time the answer is username_taken, kept for later retries.
      const again = await create(t.app, t.adminKey, key, body)
      assert.equal(again.statusCode, 409, again.body)
      assert.equal(again.json().code, 'username_taken')
      assert.equal(again.headers['idempotent-replayed'], undefined)
      assertReplayOf(await create(t.app, t.adminKey, key, body), again)
      assert.equal((await usersNamed(t, body.username)).length, 1)
    })

    it('documents the header on both Create User operations in the OpenAPI document', async () => {
      const document = (await t.app.inject({ url: '/auth/openapi.json' })).json()
      for (const path of ['/auth/api/users', '/auth/users']) {
        const operation = document.paths[path].post
        const parameter = operation.parameters.find((p: { in: string, name: string }) => p.in === 'header' && p.name.toLowerCase() === 'idempotency-key')
        assert.ok(parameter, `${path} names Idempotency-Key`)
        assert.equal(parameter.required, false)
        assert.ok(operation.responses['201'].headers['Idempotent-Replayed'])
        // And only there: other writes do not take it.
        assert.equal(document.paths[path].get.parameters.some((p: { name: string }) => p.name.toLowerCase() === 'idempotency-key'), false)
      }
    })
  })

  describe(`Idempotency-Key when the request fails on our side (${dialect.name})`, () => {
    let t: TestApp
    before(async () => { t = await createTestApp(dialect) })
    after(async () => { await t?.app.close() })

    it('keeps no 5xx answer: the key is freed and the retry runs the request', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      // Without its events table a create cannot be recorded, and fails as a whole.
      await t.app.db.schema.alterTable('events').renameTo('events_away').execute()
      let failed: Answer
      try {
        failed = await create(t.app, t.adminKey, key, body)
      } finally {
        await t.app.db.schema.alterTable('events_away').renameTo('events').execute()
      }
      assert.ok(failed.statusCode >= 500, failed.body)
      assert.equal(await keyRows(t), 0)
      const retry = await create(t.app, t.adminKey, key, body)
      assert.equal(retry.statusCode, 201, retry.body)
      assert.equal(retry.headers['idempotent-replayed'], undefined)
      assert.equal((await usersNamed(t, body.username)).length, 1)
    })
  })

  describe(`Idempotency-Key across two instances on one database (${dialect.name})`, () => {
    let a: TestApp
    let b: FastifyTypeBox
    let dir: string | undefined
    before(async () => {
      let overrides = {}
      if (dialect.name === 'sqlite') {
        dir = await mkdtemp(join(tmpdir(), 'gatehouse-idempotency-'))
        overrides = { databaseUrl: `sqlite:${join(dir, 'shared.db')}` }
      }
      a = await createTestApp(dialect, overrides)
      b = await buildApp({ config: defaultConfig({ ...a.config }), logger: false })
      await b.ready()
    })
    after(async () => {
      await b?.close()
      await a?.app.close()
      if (dir !== undefined) await rm(dir, { recursive: true, force: true })
    })

    it('a retry sent to the other instance gets the first answer, and another body there is refused', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const first = await create(a.app, a.adminKey, key, body)
      assert.equal(first.statusCode, 201, first.body)
      assertReplayOf(await create(b, a.adminKey, key, body), first)
      const refused = await create(b, a.adminKey, key, { username: uniqueName(), password: GOOD_PASSWORD })
      assert.equal(refused.json().code, 'idempotency_key_reused')
      assert.equal((await usersNamed(a, body.username)).length, 1)
    })

    it('of identical requests sent to both instances at once, one creates the user', async () => {
      const body = { username: uniqueName(), password: GOOD_PASSWORD }
      const key = randomUUID()
      const answers = await Promise.all([a.app, b, a.app, b].map(async app => await create(app, a.adminKey, key, body)))
      assert.equal(answers.filter(x => x.statusCode === 201 && x.headers['idempotent-replayed'] === undefined).length, 1, answers.map(x => `${x.statusCode} ${x.body}`).join('\n'))
      for (const answer of answers) assert.ok(answer.statusCode === 201 || answer.json().code === 'idempotency_key_in_progress', answer.body)
      const users = await usersNamed(a, body.username)
      assert.equal(users.length, 1)
      assert.equal((await createdEvents(a, users[0]!.id)).length, 1)
    })
  })
}
