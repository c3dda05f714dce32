import { randomUUID } from 'node:crypto'
import type { FastifyBaseLogger } from 'fastify'
import type { Config } from '../config.ts'
import type { Db } from '../db/database.ts'
import { findEventsByIds, type EventRow } from '../events/events.repository.ts'
import { toEvent } from '../events/events.service.ts'
import { newId } from '../lib/ids.ts'
import { inSpan, type TraceIds } from '../lib/tracing.ts'
import { onDeliveriesQueued } from './webhooks.outbox.ts'
import {
  claimDeliveries,
  clearEndpointFailing,
  completeDelivery,
  findEndpoints,
  markEndpointFailing,
  type WebhookDeliveryRow,
  type WebhookEndpointRow
} from './webhooks.repository.ts'
import { createSender, signatureHeader, type SendResult, type Sender } from './webhooks.sender.ts'
import { PollingLoop } from '../lib/polling-loop.ts'
import { disableWebhookRecorded, signingSecrets } from './webhooks.service.ts'

export type WorkerSettings = Pick<Config,
  'webhookAllowPrivate' | 'webhookTimeoutMs' | 'webhookPollIntervalMs' | 'webhookRetryHorizonMs' |
  'webhookRetryBaseMs' | 'webhookRetryMaxDelayMs' | 'webhookSecretOverlapMs' | 'webhookConcurrency'>

export interface AttemptObservation {
  outcome: 'succeeded' | 'failed'
  /** The HTTP request's duration. */
  seconds: number
  /** From the event's occurred_at to this successful attempt's end; undefined for failures. */
  lagSeconds: number | undefined
}

/**
 * The delay before retry number `attempts` (1 = after the first failure):
 * doubling from the base, capped, with jitter so endpoints that failed
 * together do not all come back at the same instant.
 */
export function retryDelayMs (attempts: number, settings: Pick<WorkerSettings, 'webhookRetryBaseMs' | 'webhookRetryMaxDelayMs'>, random = Math.random()): number {
  const exponential = Math.min(settings.webhookRetryBaseMs * 2 ** Math.min(attempts - 1, 40), settings.webhookRetryMaxDelayMs)
  return Math.round(exponential * (0.5 + random * 0.5))
}

/**
 * Delivers queued webhook events: claims due deliveries (a lease, so a
 * crashed worker's claims are taken over once they run out), sends them
 * signed, and records each attempt. Every instance runs one; on PostgreSQL
 * they share the queue through FOR UPDATE SKIP LOCKED.
 */
export class WebhookWorker {
  readonly #db: Db
  readonly #settings: WorkerSettings
  readonly #log: FastifyBaseLogger
  readonly #sender: Sender
  /** Long enough for any request to finish (the timeout), with room for recording the result. */
  readonly #leaseMs: number
  readonly #observers: Array<(observation: AttemptObservation) => void> = []
  readonly #loop: PollingLoop
  #unsubscribe: (() => void) | undefined

  constructor (db: Db, settings: WorkerSettings, log: FastifyBaseLogger, userAgent: string) {
    this.#db = db
    this.#settings = settings
    this.#log = log
    this.#leaseMs = 2 * settings.webhookTimeoutMs + 1000
    this.#sender = createSender({ timeoutMs: settings.webhookTimeoutMs, allowPrivate: settings.webhookAllowPrivate, userAgent })
    this.#loop = new PollingLoop(async () => { await this.#cycle() }, settings.webhookPollIntervalMs)
  }

  get sender (): Sender {
    return this.#sender
  }

  onAttempt (observer: (observation: AttemptObservation) => void): void {
    this.#observers.push(observer)
  }

  start (): void {
    if (!this.#loop.stopped) return
    this.#unsubscribe = onDeliveriesQueued(() => { this.#loop.wake() })
    this.#loop.start()
  }

  /** Stops claiming, and waits for the deliveries in flight to be sent and recorded (bounded by the request timeout). */
  async stop (): Promise<void> {
    this.#unsubscribe?.()
    await this.#loop.stop()
    this.#sender.close()
  }

  /** Claims and delivers until nothing is due (or the worker stops). */
  async #cycle (): Promise<void> {
    try {
      while (!this.#loop.stopped) {
        const limit = this.#settings.webhookConcurrency
        const now = Date.now()
        const claimed = await claimDeliveries(this.#db, {
          now: new Date(now).toISOString(),
          leaseUntil: new Date(now + this.#leaseMs).toISOString(),
          token: randomUUID(),
          limit
        })
        if (claimed.length === 0) return
        this.#loop.found()
        await this.#deliverAll(claimed)
        if (claimed.length < limit) return
      }
    } catch (err) {
      this.#log.warn({ err }, 'webhook delivery cycle failed; will try again')
    }
  }

  async #deliverAll (claimed: WebhookDeliveryRow[]): Promise<void> {
    const [endpoints, events] = await Promise.all([
      findEndpoints(this.#db, [...new Set(claimed.map(d => d.endpoint_id))]),
      findEventsByIds(this.#db, [...new Set(claimed.map(d => d.event_id))])
    ])
    const endpointById = new Map(endpoints.map(e => [e.id, e]))
    const bodyById = new Map(events.map(e => [e.id, { body: JSON.stringify(toEvent(e)), occurredAt: new Date(e.occurred_at).getTime(), trace: traceOf(e) }]))
    await Promise.all(claimed.map(async delivery => {
      try {
        await this.#deliver(delivery, endpointById.get(delivery.endpoint_id), bodyById.get(delivery.event_id))
      } catch (err) {
        // Left claimed: the lease runs out and the delivery is tried again.
        this.#log.warn({ err, endpoint: delivery.endpoint_id, event: delivery.event_id }, 'could not record a webhook attempt')
      }
    }))
  }

  async #deliver (delivery: WebhookDeliveryRow, endpoint: WebhookEndpointRow | undefined, event: { body: string, occurredAt: number, trace: TraceIds | undefined } | undefined): Promise<void> {
    if (endpoint === undefined) return // deleted meanwhile; its deliveries went with it
    let result: SendResult
    const at = new Date()
    if (event === undefined) {
      result = { ok: false, statusCode: null, latencyMs: 0, error: 'the event is not in the event log' }
    } else {
      // A span in the trace of the request that recorded the event, and its `traceparent` on the request
      // (Standard Webhooks signs the id, timestamp and body only, so the signature is unchanged).
      result = await inSpan('POST', { client: true, parent: event.trace, attributes: { 'http.request.method': 'POST', 'gatehouse.webhook.endpoint_id': endpoint.id, 'gatehouse.event_id': delivery.event_id } }, async (span, traceHeaders) => {
        const sent = await this.#sender.send(endpoint.url, {
          ...traceHeaders,
          'webhook-id': delivery.event_id,
          'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
          'webhook-signature': signatureHeader(signingSecrets(endpoint, at.getTime()), delivery.event_id, at, event.body)
        }, event.body)
        if (sent.statusCode !== null) span.set({ 'http.response.status_code': sent.statusCode })
        if (!sent.ok) span.fail(sent.error ?? `HTTP ${sent.statusCode ?? ''}`)
        return sent
      })
    }
    const done = Date.now()
    const token = delivery.lock_token!
    const gone = result.statusCode === 410
    const giveUpAt = delivery.give_up_at !== null
      ? new Date(delivery.give_up_at).getTime()
      : new Date(delivery.created_at).getTime() + this.#settings.webhookRetryHorizonMs
    const status = result.ok ? 'delivered' : !gone && done >= giveUpAt ? 'failed' : 'pending'
    // 410: the endpoint is disabled now; the delivery waits, due at once, in case it is enabled again.
    const nextAttemptAt = new Date(result.ok || gone ? done : done + retryDelayMs(delivery.attempts + 1, this.#settings)).toISOString()

    await this.#db.transaction().execute(async trx => {
      const ours = await completeDelivery(trx, delivery, token, {
        attemptId: newId(),
        at: at.toISOString(),
        succeeded: result.ok,
        statusCode: result.statusCode,
        latencyMs: result.latencyMs,
        error: result.error,
        status,
        nextAttemptAt
      })
      if (!ours) return
      if (result.ok) {
        await clearEndpointFailing(trx, endpoint.id)
        return
      }
      if (gone) {
        await disableWebhookRecorded(trx, endpoint.id, 'gone', { status_code: 410 })
        return
      }
      // Failing since the oldest event it has not taken: so a delivery given up means the endpoint failed for the whole horizon.
      const failingSince = await markEndpointFailing(trx, endpoint.id, new Date(delivery.created_at).toISOString())
      if (failingSince !== null && done - new Date(failingSince).getTime() >= this.#settings.webhookRetryHorizonMs) {
        await disableWebhookRecorded(trx, endpoint.id, 'failing', { failing_since: failingSince })
      }
    })
    for (const observe of this.#observers) {
      observe({
        outcome: result.ok ? 'succeeded' : 'failed',
        seconds: result.latencyMs / 1000,
        lagSeconds: result.ok && event !== undefined ? (done - event.occurredAt) / 1000 : undefined
      })
    }
  }
}

declare module 'fastify' {
  interface FastifyInstance {
    webhooks: WebhookWorker
  }
}

function traceOf (event: EventRow): TraceIds | undefined {
  return event.trace_id !== null && event.span_id !== null ? { traceId: event.trace_id, spanId: event.span_id } : undefined
}
