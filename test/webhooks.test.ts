import assert from 'node:assert/strict'
import { after, before, describe, it } from 'node:test'
import { Webhook as StandardWebhook } from 'standardwebhooks'
import { buildApp } from '../src/app.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import type { Config } from '../src/config.ts'
import { purgeWebhookHistory } from '../src/webhooks/webhooks.service.ts'
import { auth, createTestApp, dialects, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { listen, runCli } from './cli-helpers.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'

/** Short intervals, so retries and polls happen within a test's patience; receivers are on 127.0.0.1. */
const FAST: Partial<Config> = {
  webhookAllowPrivate: true,
  webhookPollIntervalMs: 50,
  webhookRetryBaseMs: 50,
  webhookRetryMaxDelayMs: 200,
  webhookTimeoutMs: 2000
}

interface Hook { id: string, secret: string, url: string }

async function createHook (t: TestApp, payload: Record<string, unknown>): Promise<Hook> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(t.adminKey), payload })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function createUser (t: TestApp): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('hook') } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function eventOf (t: TestApp, type: string, targetId: string): Promise<Record<string, unknown> & { id: string }> {
  const res = await t.app.inject({ url: `/auth/api/events?type=${type}&target_id=${targetId}`, headers: auth(t.adminKey) })
  const [event] = res.json()
  assert.ok(event, `no ${type} event for ${targetId}`)
  return event
}

function headersOf (r: { headers: Record<string, unknown> }): Record<string, string> {
  return {
    'webhook-id': String(r.headers['webhook-id']),
    'webhook-timestamp': String(r.headers['webhook-timestamp']),
    'webhook-signature': String(r.headers['webhook-signature'])
  }
}

for (const dialect of dialects()) {
  describe(`webhooks (${dialect.name})`, () => {
    const t = useTestApp(dialect, FAST)
    const receiver = new Receiver()
    let url: string
    before(async () => { url = await receiver.listen() })
    after(async () => { await receiver.close() })

    it('delivers the event as GET /api/events shows it, signed so that standardwebhooks verifies it', async () => {
      receiver.answer = () => 204
      const hook = await createHook(t, { url, event_types: ['user.*'], description: 'sync' })
      assert.match(hook.secret, /^whsec_[A-Za-z0-9+/]{43}=$/)
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the delivery', () => receiver.accepted().has(event.id))
      const got = receiver.received.find(r => r.id === event.id)!
      // The receiver's side of the interoperability: the reference library accepts it.
      const verified = new StandardWebhook(hook.secret).verify(got.body, headersOf(got))
      assert.deepEqual(verified, event)
      assert.equal(got.headers['content-type'], 'application/json')
      assert.match(String(got.headers['webhook-signature']), /^v1,[A-Za-z0-9+/]+=*$/)
      assert.throws(() => new StandardWebhook(`whsec_${Buffer.alloc(32, 1).toString('base64')}`).verify(got.body, headersOf(got)), /No matching signature/)
      assert.throws(() => new StandardWebhook(hook.secret).verify(got.body.replace('user.created', 'user.deleted'), headersOf(got)))

      // The filter: an api_key event is not for this endpoint.
      const key = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'not-for-hook' } })).json()
      const keyEvent = await eventOf(t, 'api_key.created', key.id)
      const user2 = await createUser(t)
      const event2 = await eventOf(t, 'user.created', user2.id)
      await waitFor('the second delivery', () => receiver.accepted().has(event2.id))
      assert.ok(!receiver.received.some(r => r.id === keyEvent.id), 'an api_key event was delivered to a user.* endpoint')
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('gets every event to a receiver that fails and then recovers exactly once by webhook-id, and lists the attempts', async () => {
      let failing = true
      receiver.answer = () => failing ? 503 : 200
      const hook = await createHook(t, { url, event_types: ['user.created'] })
      const users = []
      for (let i = 0; i < 10; i++) users.push(await createUser(t))
      const ids = await Promise.all(users.map(async u => (await eventOf(t, 'user.created', u.id)).id))
      await waitFor('failed attempts of every event', () => ids.every(id => receiver.received.some(r => r.id === id && r.status === 503)))
      const attempts = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}/attempts?event_id=${ids[0]}`, headers: auth(t.adminKey) })).json()
      assert.ok(attempts.length >= 1)
      assert.equal(attempts[0].succeeded, false)
      assert.equal(attempts[0].status_code, 503)
      assert.ok(attempts[0].latency_ms >= 0)
      assert.ok(Date.parse(attempts[0].next_attempt_at) > Date.parse(attempts[0].attempted_at), 'a retry is scheduled after the attempt')
      failing = false
      await waitFor('every event delivered', () => ids.every(id => receiver.accepted().has(id)))
      // Retries lag behind by their back-off; give a duplicate the chance to show up.
      await new Promise(resolve => setTimeout(resolve, 400))
      const accepted = receiver.accepted()
      for (const id of ids) assert.equal(accepted.get(id), 1, `event ${id} was accepted ${accepted.get(id)} times`)
      const deliveries = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}/deliveries?status=delivered`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(new Set(deliveries.map((d: { event_id: string }) => d.event_id)), new Set(ids))
      for (const d of deliveries) {
        assert.ok(d.attempts >= 2 && d.last_status_code === 200 && d.next_attempt_at === null && d.delivered_at !== null, JSON.stringify(d))
      }
      const hookNow = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(hookNow.failing_since, null, 'a success clears failing_since')
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('forgets finished deliveries and attempts past the retention, never a pending delivery', async () => {
      receiver.answer = ({ body }) => body.includes('"retry-me') ? 503 : 200
      const done = await createHook(t, { url, event_types: ['user.created'] })
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the delivery', () => receiver.accepted().has(event.id))
      const retrying = await createHook(t, { url, event_types: ['api_key.created'] })
      const key = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'retry-me' } })).json()
      const keyEvent = await eventOf(t, 'api_key.created', key.id)
      await waitFor('a failed attempt', () => receiver.received.some(r => r.id === keyEvent.id && r.status === 503))
      const listed = async (hook: Hook, what: string): Promise<Array<Record<string, unknown>>> =>
        (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}/${what}`, headers: auth(t.adminKey) })).json()
      assert.equal((await listed(done, 'deliveries')).length, 1)
      assert.ok((await listed(done, 'attempts')).length >= 1)

      // Now is the retention's end: everything finished so far is older than that.
      const removed = await purgeWebhookHistory(t.app.db, t.config, Date.now() + t.config.webhookRetentionMs + 60_000)
      assert.ok(removed.deliveries >= 1 && removed.attempts >= 2, JSON.stringify(removed))
      assert.deepEqual(await listed(done, 'deliveries'), [])
      assert.deepEqual(await listed(done, 'attempts'), [])
      const pending = await listed(retrying, 'deliveries')
      assert.deepEqual(pending.map(d => [d.event_id, d.status]), [[keyEvent.id, 'pending']])
      for (const hook of [done, retrying]) await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('signs with both the old and the new secret during a rotation\'s overlap', async () => {
      receiver.answer = () => 200
      const hook = await createHook(t, { url, event_types: ['user.created'] })
      const rotated = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/rotate-secret`, headers: auth(t.adminKey) })
      assert.equal(rotated.statusCode, 200)
      const { secret: newSecret, previous_secret_expires_at: until } = rotated.json()
      assert.notEqual(newSecret, hook.secret)
      assert.ok(Date.parse(until) > Date.now() + 3_600_000, 'the default overlap is a day')
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the delivery', () => receiver.accepted().has(event.id))
      const got = receiver.received.find(r => r.id === event.id)!
      assert.equal(String(got.headers['webhook-signature']).split(' ').length, 2)
      new StandardWebhook(newSecret).verify(got.body, headersOf(got))
      new StandardWebhook(hook.secret).verify(got.body, headersOf(got))
      const log = JSON.stringify((await t.app.inject({ url: `/auth/api/events?target_id=${hook.id}`, headers: auth(t.adminKey) })).json())
      assert.match(log, /webhook\.secret_rotated/)
      assert.ok(!log.includes(newSecret.slice(6)) && !log.includes(hook.secret.slice(6)), 'a secret reached the event log')
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('disables an endpoint that answers 410, with a webhook.disabled event, and resumes when it is enabled again', async () => {
      let gone = true
      receiver.answer = () => gone ? 410 : 200
      const hook = await createHook(t, { url, event_types: ['user.created'] })
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the endpoint disabled', async () =>
        (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })).json().enabled === false)
      const state = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(state.disabled_reason, 'gone')
      const disabled = await eventOf(t, 'webhook.disabled', hook.id)
      assert.deepEqual(disabled.actor, { type: 'system', id: null })
      assert.equal((disabled.data as { reason: string }).reason, 'gone')
      assert.equal(receiver.received.filter(r => r.id === event.id).length, 1, 'no retry after 410')

      gone = false
      const enabled = await t.app.inject({ method: 'PATCH', url: `/auth/api/webhooks/${hook.id}`, headers: { ...auth(t.adminKey), 'content-type': 'application/merge-patch+json' }, payload: JSON.stringify({ enabled: true }) })
      assert.equal(enabled.statusCode, 200, enabled.body)
      assert.equal(enabled.json().disabled_reason, null)
      await waitFor('the queued delivery after re-enabling', () => receiver.accepted().has(event.id))
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('replays a time range with the events\' own webhook-ids, and retries one delivery by hand', async () => {
      receiver.answer = () => 200
      const since = new Date().toISOString()
      // Events from before the endpoint existed are replayed too.
      const early = await createUser(t)
      const earlyEvent = await eventOf(t, 'user.created', early.id)
      const hook = await createHook(t, { url, event_types: ['user.created'] })
      const late = await createUser(t)
      const lateEvent = await eventOf(t, 'user.created', late.id)
      await waitFor('the live delivery', () => receiver.accepted().has(lateEvent.id))
      assert.ok(!receiver.received.some(r => r.id === earlyEvent.id))

      const replay = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/replay`, headers: auth(t.adminKey), payload: { since } })
      assert.equal(replay.statusCode, 202, replay.body)
      assert.equal(replay.json().queued, 2)
      await waitFor('the replayed deliveries', () => receiver.accepted().get(lateEvent.id) === 2 && receiver.accepted().has(earlyEvent.id))
      assert.equal((await eventOf(t, 'webhook.replayed', hook.id)).type, 'webhook.replayed')

      const retry = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/deliveries/${earlyEvent.id}/retry`, headers: auth(t.adminKey) })
      assert.equal(retry.statusCode, 202, retry.body)
      assert.equal(retry.json().status, 'pending')
      await waitFor('the retried delivery', () => receiver.accepted().get(earlyEvent.id) === 2)
      const missing = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/deliveries/${hook.id}/retry`, headers: auth(t.adminKey) })
      assert.equal(missing.statusCode, 404)
      assert.equal(missing.json().code, 'webhook_delivery_not_found')
      const backwards = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/replay`, headers: auth(t.adminKey), payload: { since, until: since } })
      assert.equal(backwards.statusCode, 422)
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('sends a retry asked for while that delivery is in flight, instead of letting the attempt\'s answer swallow it', async () => {
      let release: (() => void) | undefined
      const held = new Promise<void>(resolve => { release = resolve })
      let arrived = false
      // The first request is held open: the retry lands between the receiver taking it and the worker recording it.
      const firstN = receiver.received.length
      receiver.answer = async ({ n }) => {
        if (n !== firstN) return 200
        arrived = true
        await held
        return 200
      }
      const hook = await createHook(t, { url, event_types: ['user.created'] })
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the first attempt to reach the receiver', () => arrived)
      const retry = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/deliveries/${event.id}/retry`, headers: auth(t.adminKey) })
      assert.equal(retry.statusCode, 202, retry.body)
      release!()
      await waitFor('the retried delivery', () => receiver.accepted().get(event.id) === 2)
      const delivery = async (): Promise<{ status: string, attempts: number }> =>
        (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}/deliveries?limit=1`, headers: auth(t.adminKey) })).json()[0]
      await waitFor('the delivery to settle', async () => { const d = await delivery(); return d.status === 'delivered' && d.attempts === 2 })
      const attempts = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}/attempts?event_id=${event.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(attempts.length, 2)
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('sends a signed test ping and reports the answer', async () => {
      receiver.answer = ({ body }) => body.includes('webhook.ping') ? 202 : 500
      const hook = await createHook(t, { url })
      const res = await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/test`, headers: auth(t.adminKey) })
      assert.equal(res.statusCode, 200, res.body)
      const result = res.json()
      assert.equal(result.ok, true)
      assert.equal(result.status_code, 202)
      const got = receiver.received.find(r => r.id === result.webhook_id)!
      assert.equal((new StandardWebhook(hook.secret).verify(got.body, headersOf(got)) as { type: string }).type, 'webhook.ping')
      receiver.answer = () => 500
      const failed = (await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/test`, headers: auth(t.adminKey) })).json()
      assert.equal(failed.ok, false)
      assert.equal(failed.status_code, 500)
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })
    })

    it('manages endpoints with admin or webhooks:manage only, shows the secret once, and records the changes', async () => {
      const manager = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'hooks', scopes: ['webhooks:manage'] } })).json().key
      const reader = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'reader', scopes: ['events:read'] } })).json().key
      assert.equal((await t.app.inject({ url: '/auth/api/webhooks', headers: auth(reader) })).statusCode, 403)
      assert.equal((await t.app.inject({ url: '/auth/api/webhooks' })).statusCode, 401)

      const created = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(manager), payload: { url, event_types: ['api_key.*', 'user.deleted'], enabled: false } })
      assert.equal(created.statusCode, 201, created.body)
      const hook = created.json()
      assert.equal(created.headers.location, `/auth/api/webhooks/${hook.id}`)
      assert.deepEqual({ enabled: hook.enabled, disabled_reason: hook.disabled_reason }, { enabled: false, disabled_reason: 'manual' })
      const got = (await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(manager) })).json()
      assert.equal(got.secret, undefined)
      const list = (await t.app.inject({ url: '/auth/api/webhooks', headers: auth(manager) })).json()
      assert.ok(list.some((h: { id: string }) => h.id === hook.id))
      assert.ok(!JSON.stringify(list).includes('whsec_'))

      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/webhooks/${hook.id}`, headers: auth(manager), payload: { description: 'audit', event_types: ['*'] } })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.deepEqual(patched.json().event_types, ['*'])
      const updated = await eventOf(t, 'webhook.updated', hook.id)
      assert.deepEqual((updated.data as { changes: Record<string, unknown> }).changes.description, { from: null, to: 'audit' })

      for (const [payload, pointer] of [
        [{ url: 'ftp://example.com/x' }, '/url'],
        [{ url, event_types: ['user.creatd'] }, '/event_types/0'],
        [{ url, event_types: ['user*'] }, '/event_types/0'],
        [{ url, event_types: [] }, '/event_types'],
        [{ url: 'http://user:pw@127.0.0.1/x' }, '/url'],
        [{ url, secret: 'whsec_mine' }, '/secret']
      ] as const) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(manager), payload })
        assert.equal(res.statusCode, 422, `${JSON.stringify(payload)}: ${res.body}`)
        assert.equal(res.json().errors[0].pointer, pointer, res.body)
      }
      assert.equal((await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${hook.id}`, headers: auth(manager) })).statusCode, 204)
      const gone = await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(manager) })
      assert.equal(gone.statusCode, 404)
      assert.equal(gone.json().code, 'webhook_not_found')
      assert.equal((await eventOf(t, 'webhook.deleted', hook.id)).type, 'webhook.deleted')
      const createdEvent = await eventOf(t, 'webhook.created', hook.id)
      assert.equal((createdEvent.actor as { type: string }).type, 'api_key')
      assert.ok(!JSON.stringify(createdEvent).includes('whsec_'), 'the secret reached the event log')
    })

    it('reports pending and failed deliveries and attempts at /metrics', async () => {
      const text = (await t.app.inject({ url: '/auth/metrics' })).body
      assert.match(text, /^gatehouse_webhook_deliveries_pending \d+$/m)
      assert.match(text, /^gatehouse_webhook_deliveries_failed \d+$/m)
      assert.match(text, /^gatehouse_webhook_attempts_total\{outcome="succeeded"\} [1-9]\d*$/m)
      assert.match(text, /^gatehouse_webhook_attempts_total\{outcome="failed"\} [1-9]\d*$/m)
      assert.match(text, /^gatehouse_webhook_delivery_lag_seconds_count [1-9]\d*$/m)
    })

    it('gives a delivery up after the retry horizon, disables the long-failing endpoint with an event, and delivers on a manual retry', async () => {
      const short = await createTestApp(dialect, { ...FAST, webhookRetryHorizonMs: 600 })
      try {
        let down = true
        receiver.answer = () => down ? 500 : 200
        const hook = await createHook(short, { url, event_types: ['user.created'] })
        const user = await createUser(short)
        const event = await eventOf(short, 'user.created', user.id)
        await waitFor('the endpoint disabled as failing', async () =>
          (await short.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(short.adminKey) })).json().disabled_reason === 'failing')
        const disabled = await eventOf(short, 'webhook.disabled', hook.id)
        assert.equal((disabled.data as { reason: string }).reason, 'failing')
        const [delivery] = (await short.app.inject({ url: `/auth/api/webhooks/${hook.id}/deliveries`, headers: auth(short.adminKey) })).json()
        assert.equal(delivery.status, 'failed')
        assert.equal(delivery.next_attempt_at, null)
        assert.ok(delivery.attempts >= 2)
        const failedMetric = (await short.app.inject({ url: '/auth/metrics' })).body
        assert.match(failedMetric, /^gatehouse_webhook_deliveries_failed 1$/m)

        down = false
        await short.app.inject({ method: 'PATCH', url: `/auth/api/webhooks/${hook.id}`, headers: auth(short.adminKey), payload: { enabled: true } })
        const retry = await short.app.inject({ method: 'POST', url: `/auth/api/webhooks/${hook.id}/deliveries/${event.id}/retry`, headers: auth(short.adminKey) })
        assert.equal(retry.statusCode, 202)
        await waitFor('the delivery after a manual retry', () => receiver.accepted().has(event.id))
      } finally {
        await short.app.close()
      }
    })

    it('queues deliveries but sends none on an instance with WEBHOOK_DELIVERY=false', async () => {
      const queueOnly = await createTestApp(dialect, { ...FAST, webhookDelivery: false })
      try {
        receiver.answer = () => 200
        const hook = await createHook(queueOnly, { url, event_types: ['user.created'] })
        const user = await createUser(queueOnly)
        const event = await eventOf(queueOnly, 'user.created', user.id)
        await new Promise(resolve => setTimeout(resolve, 300))
        assert.ok(!receiver.received.some(r => r.id === event.id), 'an instance with delivery off sent a delivery')
        const [delivery] = (await queueOnly.app.inject({ url: `/auth/api/webhooks/${hook.id}/deliveries`, headers: auth(queueOnly.adminKey) })).json()
        assert.deepEqual({ event_id: delivery.event_id, status: delivery.status, attempts: delivery.attempts }, { event_id: event.id, status: 'pending', attempts: 0 })
      } finally {
        await queueOnly.app.close()
      }
    })

    // The command line talks HTTP; once is enough, and each command is a process start.
    it('gatehouse webhooks create / list / attempts / replay / delete', { skip: dialect.name !== 'sqlite' && 'the CLI is tested on SQLite' }, async () => {
      receiver.answer = () => 200
      const env = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
      const created = await runCli(['webhooks', 'create', url, '--event', 'user.created', '--description', 'from the cli', '--json'], { env })
      assert.equal(created.code, 0, created.stderr)
      const hook = JSON.parse(created.stdout)
      assert.match(hook.secret, /^whsec_/)
      const text = await runCli(['webhooks', 'list'], { env })
      assert.equal(text.code, 0, text.stderr)
      assert.ok(text.stdout.includes(hook.id) && !text.stdout.includes('whsec_'))
      const since = new Date(Date.now() - 60_000).toISOString()
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('the delivery', () => receiver.accepted().has(event.id))
      const attempts = await runCli(['webhooks', 'attempts', hook.id, '--json'], { env })
      assert.equal(attempts.code, 0, attempts.stderr)
      assert.ok(JSON.parse(attempts.stdout).some((a: { event_id: string, succeeded: boolean }) => a.event_id === event.id && a.succeeded))
      const replay = await runCli(['webhooks', 'replay', hook.id, '--since', since], { env })
      assert.equal(replay.code, 0, replay.stderr)
      assert.match(replay.stdout, /Queued [1-9]\d* deliver/)
      await waitFor('the replayed delivery', () => (receiver.accepted().get(event.id) ?? 0) >= 2)
      const deleted = await runCli(['webhooks', 'delete', hook.id], { env })
      assert.equal(deleted.code, 0, deleted.stderr)
      assert.equal((await t.app.inject({ url: `/auth/api/webhooks/${hook.id}`, headers: auth(t.adminKey) })).statusCode, 404)
      const bad = await runCli(['webhooks', 'create', url, '--event', 'Nope'], { env })
      assert.equal(bad.code, 1)
      assert.match(bad.stderr, /event_types/)
    })
  })

  describe(`webhooks: SSRF guard (${dialect.name})`, () => {
    const t = useTestApp(dialect, { ...FAST, webhookAllowPrivate: false })
    const receiver = new Receiver()
    before(async () => { await receiver.listen() })
    after(async () => { await receiver.close() })

    it('refuses URLs that lead to loopback, private, link-local, unique-local, multicast or unspecified addresses', async () => {
      const refused = [
        'http://127.0.0.1/hook', 'http://127.1.2.3:8080/hook', 'http://localhost/hook', 'http://2130706433/hook',
        'http://10.1.2.3/', 'http://172.16.0.1/', 'http://192.168.1.1/', 'http://100.64.0.1/',
        'http://169.254.169.254/latest/meta-data/', 'http://0.0.0.0/', 'http://224.0.0.1/', 'http://255.255.255.255/',
        'http://[::1]/', 'http://[::]/', 'http://[fe80::1]/', 'http://[fd00::1]/', 'http://[fc00::1]/', 'http://[ff02::1]/',
        'http://[::ffff:127.0.0.1]/', 'http://[::ffff:a9fe:a9fe]/', 'http://[64:ff9b::a00:1]/', 'http://[2002:c0a8:101::1]/'
      ]
      for (const target of refused) {
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(t.adminKey), payload: { url: target } })
        assert.equal(res.statusCode, 422, `${target} was accepted`)
        assert.equal(res.json().code, 'webhook_url_refused', target)
      }
      const patchTarget = await t.app.inject({ method: 'POST', url: '/auth/api/webhooks', headers: auth(t.adminKey), payload: { url: 'http://93.184.215.14/hook', enabled: false } })
      assert.equal(patchTarget.statusCode, 201, patchTarget.body)
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/api/webhooks/${patchTarget.json().id}`, headers: auth(t.adminKey), payload: { url: 'http://[::1]:9/x' } })
      assert.equal(patched.statusCode, 422)
      assert.equal(patched.json().code, 'webhook_url_refused')
      await t.app.inject({ method: 'DELETE', url: `/auth/api/webhooks/${patchTarget.json().id}`, headers: auth(t.adminKey) })
    })

    it('checks the address again at delivery time: a name that now resolves to loopback gets nothing', async () => {
      // As if `localhost` had resolved to a public address when the endpoint was saved (DNS rebinding).
      const now = new Date().toISOString()
      const id = '01900000-0000-7000-8000-00000000abcd'
      await t.app.db.insertInto('webhook_endpoints').values({
        id,
        url: `http://localhost:${receiver.port}/hook`,
        description: null,
        event_types: '["*"]',
        event_patterns: '["%"]',
        enabled: true,
        disabled_reason: null,
        secret: 'whsec_' + Buffer.alloc(32, 7).toString('base64'),
        previous_secret: null,
        previous_secret_expires_at: null,
        failing_since: null,
        created_at: now,
        updated_at: now
      }).execute()
      const user = await createUser(t)
      const event = await eventOf(t, 'user.created', user.id)
      await waitFor('a refused attempt', async () =>
        (await t.app.inject({ url: `/auth/api/webhooks/${id}/attempts?event_id=${event.id}`, headers: auth(t.adminKey) })).json().length > 0)
      const [attempt] = (await t.app.inject({ url: `/auth/api/webhooks/${id}/attempts?event_id=${event.id}`, headers: auth(t.adminKey) })).json()
      assert.equal(attempt.succeeded, false)
      assert.equal(attempt.status_code, null)
      assert.match(attempt.error, /refused: localhost leads to (127\.0\.0\.1|::1)/)
      // The literal-address path too, which connects without a lookup.
      const ping = (await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${id}/test`, headers: auth(t.adminKey) })).json()
      assert.equal(ping.ok, false)
      await t.app.db.updateTable('webhook_endpoints').set({ url: `http://127.0.0.1:${receiver.port}/hook` }).where('id', '=', id).execute()
      const literal = (await t.app.inject({ method: 'POST', url: `/auth/api/webhooks/${id}/test`, headers: auth(t.adminKey) })).json()
      assert.equal(literal.ok, false)
      assert.match(literal.error, /refused: 127\.0\.0\.1/)
      assert.equal(receiver.received.length, 0, 'the receiver on loopback was reached')
    })
  })
}

for (const dialect of dialects().filter(d => d.name === 'postgres')) {
  describe('webhooks: two instances on one PostgreSQL database', () => {
    let t: TestApp
    let second: FastifyTypeBox
    const receiver = new Receiver()
    let url: string
    const settings = { ...FAST, webhookPollIntervalMs: 10, webhookConcurrency: 5 }
    before(async () => {
      url = await receiver.listen()
      t = await createTestApp(dialect, settings)
      second = await buildApp({ config: t.config, logger: false })
      await second.ready()
    })
    after(async () => {
      await second?.close()
      await t?.app.close()
      await receiver.close()
    })

    it('never has one delivery in flight twice, and delivers each event once', async () => {
      const inFlight = new Set<string>()
      let overlaps = 0
      // Each answer takes a while, so a second claim of the same row would overlap the first.
      receiver.answer = async ({ id }) => {
        if (inFlight.has(id)) overlaps++
        inFlight.add(id)
        await new Promise(resolve => setTimeout(resolve, 30))
        inFlight.delete(id)
        return 200
      }
      await createHook(t, { url, event_types: ['user.created'] })
      const ids: string[] = []
      // Created through both instances, so both workers are woken and race for the same rows.
      for (let i = 0; i < 60; i++) {
        const app = i % 2 === 0 ? t.app : second
        const res = await app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('pair') } })
        assert.equal(res.statusCode, 201)
        ids.push(res.json().id)
      }
      const eventIds = await Promise.all(ids.map(async id => (await eventOf(t, 'user.created', id)).id))
      await waitFor('every event delivered', () => eventIds.every(id => receiver.accepted().has(id)), 30_000)
      await new Promise(resolve => setTimeout(resolve, 300))
      assert.equal(overlaps, 0, 'a delivery was in flight twice at once')
      const accepted = receiver.accepted()
      for (const id of eventIds) assert.equal(accepted.get(id), 1, `event ${id} delivered ${accepted.get(id)} times`)
      assert.equal(receiver.received.length, eventIds.length)
    })
  })
}
