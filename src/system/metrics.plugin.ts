import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'

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

  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched'
    requests.inc({ method: request.method, route, status: reply.statusCode })
    duration.observe({ method: request.method, route }, reply.elapsedTime / 1000)
  })

  app.get(options.path, {
    schema: { tags: ['system'], operationId: 'metrics', summary: 'Metrics', description: 'Prometheus text format. Switch off with METRICS_ENABLED=false.' },
    logLevel: 'warn',
    config: { rateLimit: false }
  }, async (_request, reply) => {
    return await reply.type(registry.contentType).send(await registry.metrics())
  })
}, { name: 'metrics' })
