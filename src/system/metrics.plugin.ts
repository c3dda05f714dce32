import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { countMailsByStatus } from '../mail/mail.repository.ts'
import { countDeliveriesByStatus } from '../webhooks/webhooks.repository.ts'
import { problems } from '../lib/openapi.ts'
import { transactionRetryCounts } from '../db/database.ts'

/**
 * Prometheus metrics at `${basePath}/metrics`. Routes are labelled by their
 * pattern (`/auth/api/users/:user_id`), never the concrete URL, so label
 * cardinality stays bounded whatever clients send.
 */
export default fp(async function metricsPlugin (app: FastifyInstance, options: { path: string }) {
  const registry = new Registry()
  collectDefaultMetrics({ register: registry, prefix: 'gatehouse_' })
  const requests = new Counter({
    name: 'gatehouse_http_requests_total',
    help: 'HTTP requests answered, by method, route pattern and status.',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [registry]
  })
  const duration = new Histogram({
    name: 'gatehouse_http_request_duration_seconds',
    help: 'Time to answer an HTTP request, by method and route pattern.',
    labelNames: ['method', 'route'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry]
  })
  registry.registerMetric(new Gauge({
    name: 'gatehouse_password_hash_queue',
    help: 'Password hashes waiting for a free slot.',
    registers: [],
    collect () { this.set(app.passwords.pendingCount) }
  }))
  registry.registerMetric(new Counter({
    name: 'gatehouse_log_lines_dropped_total',
    help: 'Log lines not written to stdout: its reader was gone (EPIPE) or did not keep up, or the last flush at shutdown ran out of time.',
    registers: [],
    collect () {
      this.reset()
      this.inc(app.stdoutLog?.droppedLines ?? 0)
    }
  }))

  registry.registerMetric(new Counter({
    name: 'gatehouse_users_page_cache_lookups_total',
    help: 'Users list pages asked of this instance\'s page cache, by result: hit (served from it), miss (read from the database), resting (read from the database without asking, after a streak of misses).',
    labelNames: ['result'] as const,
    registers: [],
    collect () {
      this.reset()
      for (const [result, count] of Object.entries(app.usersPages.counts)) this.inc({ result }, count)
    }
  }))

  registry.registerMetric(new Counter({
    name: 'gatehouse_db_transaction_retries_total',
    help: 'Transactions of this instance that PostgreSQL rolled back to break a deadlock (reason="deadlock") or for a serialization failure, where gatehouse runs them again (up to three attempts; the last failure answers 409 conflict). Deadlocks should stay at 0: each waited deadlock_timeout (1 s by default) before PostgreSQL found it.',
    labelNames: ['reason'] as const,
    registers: [],
    collect () {
      this.reset()
      for (const [reason, count] of Object.entries(transactionRetryCounts(app.db))) this.inc({ reason }, count)
    }
  }))

  // Webhooks: the queue is shared by every instance, so its size is read from the database at each scrape.
  let queue: Promise<{ pending: number, failed: number }> | undefined
  const readQueue = async (): Promise<{ pending: number, failed: number }> => {
    queue ??= countDeliveriesByStatus(app.db).finally(() => { queue = undefined })
    return await queue
  }
  registry.registerMetric(new Gauge({
    name: 'gatehouse_webhook_deliveries_pending',
    help: 'Webhook deliveries queued or being retried, across all instances.',
    registers: [],
    async collect () { this.set((await readQueue()).pending) }
  }))
  registry.registerMetric(new Gauge({
    name: 'gatehouse_webhook_deliveries_failed',
    help: 'Webhook deliveries given up after the retry horizon, across all instances.',
    registers: [],
    async collect () { this.set((await readQueue()).failed) }
  }))
  const attempts = new Counter({
    name: 'gatehouse_webhook_attempts_total',
    help: 'Webhook delivery requests made by this instance, by outcome.',
    labelNames: ['outcome'] as const,
    registers: [registry]
  })
  const attemptDuration = new Histogram({
    name: 'gatehouse_webhook_attempt_duration_seconds',
    help: 'Time a receiver took to answer a webhook request (this instance).',
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry]
  })
  const deliveryLag = new Histogram({
    name: 'gatehouse_webhook_delivery_lag_seconds',
    help: 'From an event to its successful delivery (this instance): queueing, retries and the request.',
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300, 3600, 86_400],
    registers: [registry]
  })
  app.webhooks.onAttempt(({ outcome, seconds, lagSeconds }) => {
    attempts.inc({ outcome })
    attemptDuration.observe(seconds)
    if (lagSeconds !== undefined) deliveryLag.observe(lagSeconds)
  })

  // Mail: the outbox too is shared by every instance.
  let mailQueue: Promise<{ pending: number, failed: number }> | undefined
  const readMailQueue = async (): Promise<{ pending: number, failed: number }> => {
    mailQueue ??= countMailsByStatus(app.db).finally(() => { mailQueue = undefined })
    return await mailQueue
  }
  registry.registerMetric(new Gauge({
    name: 'gatehouse_mail_pending',
    help: 'Mail queued or being retried, across all instances.',
    registers: [],
    async collect () { this.set((await readMailQueue()).pending) }
  }))
  registry.registerMetric(new Gauge({
    name: 'gatehouse_mail_failed',
    help: 'Mail given up (refused for good, or past MAIL_RETRY_HORIZON_S) and still in the outbox, across all instances.',
    registers: [],
    async collect () { this.set((await readMailQueue()).failed) }
  }))
  const mailAttempts = new Counter({
    name: 'gatehouse_mail_attempts_total',
    help: 'SMTP sends tried by this instance, by outcome: sent, retry (to be tried again), failed (given up).',
    labelNames: ['outcome'] as const,
    registers: [registry]
  })
  const mailLag = new Histogram({
    name: 'gatehouse_mail_send_lag_seconds',
    help: 'From queueing a message to its sending (this instance): waiting, retries and the SMTP conversation.',
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300, 3600, 86_400],
    registers: [registry]
  })
  app.mail?.onAttempt(({ outcome, lagSeconds }) => {
    mailAttempts.inc({ outcome })
    if (lagSeconds !== undefined) mailLag.observe(lagSeconds)
  })

  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched'
    requests.inc({ method: request.method, route, status: reply.statusCode })
    duration.observe({ method: request.method, route }, reply.elapsedTime / 1000)
  })

  app.get(options.path, {
    schema: {
      tags: ['system'],
      operationId: 'metrics',
      summary: 'Metrics',
      description: 'Prometheus text format. Switch off with METRICS_ENABLED=false.',
      // A string body with a text type is sent as it is, never through a serializer.
      response: { 200: { description: 'The metrics, in the Prometheus text exposition format 0.0.4.', content: { 'text/plain': { schema: { type: 'string' } } } }, ...problems() }
    },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async (_request, reply) => {
    return await reply.type(registry.contentType).send(await registry.metrics())
  })
}, { name: 'metrics' })
