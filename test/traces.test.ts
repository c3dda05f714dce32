import assert from 'node:assert/strict'
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { after, describe, it } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { dialects, dropSchema, GOOD_PASSWORD, uniqueName } from './helpers.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'
import { freePort } from './ports.ts'
import { startService, waitReady } from './service-process.ts'

/** A span as OTLP/JSON carries it, its attributes flattened. */
interface ExportedSpan {
  traceId: string
  spanId: string
  parentSpanId: string
  name: string
  kind: number
  attributes: Record<string, unknown>
  service: unknown
}
const SERVER = 2
const CLIENT = 3

interface OtlpValue { stringValue?: string, intValue?: string | number, boolValue?: boolean }
interface OtlpAttribute { key: string, value: OtlpValue }
function flatten (attributes: OtlpAttribute[] | undefined): Record<string, unknown> {
  return Object.fromEntries((attributes ?? []).map(a => [a.key, a.value.stringValue ?? a.value.intValue ?? a.value.boolValue]))
}

/** A real OTLP/HTTP receiver: POST /v1/traces in OTLP's JSON encoding, every span kept. */
class OtlpReceiver {
  readonly spans: ExportedSpan[] = []
  readonly #server: Server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/traces' || req.headers['content-type'] !== 'application/json') {
        res.writeHead(404).end()
        return
      }
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { resourceSpans: Array<{ resource: { attributes: OtlpAttribute[] }, scopeSpans: Array<{ spans: Array<Omit<ExportedSpan, 'attributes' | 'service'> & { attributes: OtlpAttribute[] }> }> }> }
      for (const resource of body.resourceSpans) {
        const service = flatten(resource.resource.attributes)['service.name']
        for (const scope of resource.scopeSpans) {
          for (const span of scope.spans) this.spans.push({ ...span, parentSpanId: span.parentSpanId ?? '', attributes: flatten(span.attributes), service })
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })

  async listen (): Promise<string> {
    await new Promise<void>(resolve => this.#server.listen(0, '127.0.0.1', resolve))
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`
  }

  inTrace (traceId: string): ExportedSpan[] {
    return this.spans.filter(s => s.traceId === traceId)
  }

  async close (): Promise<void> {
    this.#server.closeAllConnections()
    await new Promise(resolve => this.#server.close(resolve))
  }
}

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-traces-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

for (const dialect of dialects()) {
  describe(`traces over OTLP/HTTP (${dialect.name})`, () => {
    const schema = `gh_traces_${randomBytes(5).toString('hex')}`
    const databaseUrl = dialect.url ?? `sqlite:${join(tmp, `${schema}.db`)}`
    const otlp = new OtlpReceiver()
    const hooks = new Receiver()
    const children: ChildProcess[] = []
    const logLines: string[] = []
    let pending = ''
    after(async () => {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      await otlp.close()
      await hooks.close()
      if (dialect.url !== undefined) await dropSchema(dialect.url, schema)
    })

    it('exports each request as one trace with its statements, password hashing and webhook delivery, and names the trace in the log, the event and the delivery', async () => {
      const endpoint = await otlp.listen()
      const hookUrl = await hooks.listen()
      const adminKey = `gatehouse_${randomBytes(24).toString('hex')}`
      const port = await freePort()
      const base = `http://127.0.0.1:${port}/auth`
      const service = startService({
        DATABASE_URL: databaseUrl,
        ...(dialect.url !== undefined ? { DATABASE_SCHEMA: schema } : {}),
        HOST: '127.0.0.1',
        PORT: String(port),
        LOG_LEVEL: 'info',
        GATEHOUSE_ADMIN_API_KEY: adminKey,
        WEBHOOK_ALLOW_PRIVATE: 'true',
        WEBHOOK_POLL_INTERVAL_MS: '50',
        OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_BSP_SCHEDULE_DELAY: '50'
      }, {
        stdout: (chunk) => {
          pending += chunk
          const lines = pending.split('\n')
          pending = lines.pop()!
          logLines.push(...lines)
        }
      })
      children.push(service)
      // Generous: a loaded machine has taken over 25 s to start the service under tsx.
      await waitReady(base, 120_000)
      const headers = { 'x-api-key': adminKey, 'content-type': 'application/json' }

      const hook = await fetch(`${base}/api/webhooks`, { method: 'POST', headers, body: JSON.stringify({ url: hookUrl, event_types: ['user.created'] }) })
      assert.equal(hook.status, 201, await hook.clone().text())
      const { secret } = await hook.json() as { secret: string }

      const username = uniqueName('traced')
      const created = await fetch(`${base}/api/users`, { method: 'POST', headers, body: JSON.stringify({ username, password: GOOD_PASSWORD }) })
      assert.equal(created.status, 201, await created.clone().text())
      const userId = (await created.json() as { id: string }).id
      const createRequestId = created.headers.get('x-request-id')

      // The event names the trace of the request that recorded it.
      const events = await (await fetch(`${base}/api/events?type=user.created&target_id=${userId}`, { headers })).json() as Array<{ id: string, trace_id?: string }>
      assert.equal(events.length, 1)
      const traceId = events[0]!.trace_id!
      assert.match(traceId, /^[0-9a-f]{32}$/)

      // That trace: one server span for the request, its statements and the password hash beneath it.
      // Spans go out in batches as they end, so a trace may arrive in parts: wait for the request's own span too.
      await waitFor('the user create trace with its password hash', () => otlp.inTrace(traceId).some(s => s.name === 'password.hash') && otlp.inTrace(traceId).some(s => s.kind === SERVER), 30_000)
      const createTrace = otlp.inTrace(traceId)
      const servers = createTrace.filter(s => s.kind === SERVER)
      assert.equal(servers.length, 1, JSON.stringify(servers))
      const request = servers[0]!
      assert.equal(request.parentSpanId, '')
      assert.equal(request.attributes['http.request.method'], 'POST')
      assert.equal(request.attributes['http.route'], '/auth/api/users')
      assert.equal(request.service, 'gatehouse')
      const statements = createTrace.filter(s => s.attributes['db.system.name'] === (dialect.name === 'postgres' ? 'postgresql' : 'sqlite'))
      assert.ok(statements.some(s => s.name === 'INSERT' && String(s.attributes['db.query.text']).includes('"events"')), 'the event insert is a span of the trace')
      assert.ok(statements.every(s => s.kind === CLIENT && s.parentSpanId !== ''))
      assert.ok(!createTrace.some(s => JSON.stringify(s.attributes).includes(GOOD_PASSWORD)), 'no span carries the password')
      // Every span of the trace hangs from the request span.
      const byId = new Map(createTrace.map(s => [s.spanId, s]))
      for (const span of createTrace) {
        let at: ExportedSpan | undefined = span
        while (at !== undefined && at.parentSpanId !== '') at = byId.get(at.parentSpanId)
        assert.equal(at?.spanId, request.spanId, `${span.name} reaches the request span`)
      }

      // The delivery continues the trace: its traceparent names it, its span is in it, and the signature still verifies.
      await waitFor('the webhook delivery', () => hooks.received.some(r => r.id === events[0]!.id), 30_000)
      const delivery = hooks.received.find(r => r.id === events[0]!.id)!
      const traceparent = String(delivery.headers.traceparent)
      const [, parentTrace, parentSpan] = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(traceparent) ?? []
      assert.equal(parentTrace, traceId, traceparent)
      new Webhook(secret).verify(delivery.body, delivery.headers as Record<string, string>)
      assert.equal((JSON.parse(delivery.body) as { trace_id: string }).trace_id, traceId)
      await waitFor('the delivery span', () => otlp.spans.some(s => s.spanId === parentSpan), 30_000)
      const deliverySpan = otlp.spans.find(s => s.spanId === parentSpan)!
      assert.equal(deliverySpan.traceId, traceId)
      assert.equal(deliverySpan.kind, CLIENT)
      assert.equal(deliverySpan.attributes['http.response.status_code'], 200)

      // A sign-in is a trace of its own, with the password verification in it.
      const login = await fetch(`${base}/api/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username, password: GOOD_PASSWORD }) })
      assert.equal(login.status, 200, await login.clone().text())
      const loginRequestId = login.headers.get('x-request-id')
      const signInTrace = (): ExportedSpan | undefined => otlp.spans.find(s => s.name === 'password.verify' && otlp.inTrace(s.traceId).some(t => t.kind === SERVER))
      await waitFor('the sign-in trace', () => signInTrace() !== undefined, 30_000)
      const verify = signInTrace()!
      assert.notEqual(verify.traceId, traceId)
      assert.equal(verify.attributes['password.scheme'], 'argon2id')
      const loginServer = otlp.inTrace(verify.traceId).filter(s => s.kind === SERVER)
      assert.equal(loginServer.length, 1)
      assert.equal(loginServer[0]!.attributes['http.route'], '/auth/api/login')

      // The access lines name the same traces.
      await waitFor('both access lines', () => [createRequestId, loginRequestId].every(id => logLines.some(l => l.includes(`"reqId":"${id}"`) && l.includes('"request completed"'))), 15_000)
      const accessOf = (id: string | null): { trace_id?: string } => JSON.parse(logLines.find(l => l.includes(`"reqId":"${id}"`) && l.includes('"request completed"'))!) as { trace_id?: string }
      assert.equal(accessOf(createRequestId).trace_id, traceId)
      assert.equal(accessOf(loginRequestId).trace_id, verify.traceId)

      service.kill('SIGTERM')
      const [code] = await once(service, 'exit') as [number | null]
      assert.equal(code, 0)
    })
  })
}
