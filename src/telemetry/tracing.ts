import { context, propagation, SpanKind, SpanStatusCode, trace, TraceFlags, type Context, type Span } from '@opentelemetry/api'
import { FastifyOtelInstrumentation } from '@fastify/otel'
import { BatchSpanProcessor, NodeTracerProvider, type SpanExporter } from '@opentelemetry/sdk-trace-node'
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources'
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions'
import type { LogEvent } from 'kysely'
import { installTracing, type SpanHandle, type TraceIds, type Tracing } from '../lib/tracing.ts'

/**
 * The OpenTelemetry side of tracing, loaded (by telemetry/telemetry.ts) only
 * when an OTLP endpoint is configured: a tracer provider exporting over
 * OTLP/HTTP in batches, configured by the standard OTEL_* variables (the
 * exporter reads the endpoint, headers and timeout, the batch processor
 * OTEL_BSP_*, the sampler OTEL_TRACES_SAMPLER, the resource OTEL_SERVICE_NAME
 * and OTEL_RESOURCE_ATTRIBUTES), and @fastify/otel for the request spans.
 */
export async function startTracing (release: string, warn: (message: string) => void): Promise<{ instrumentation: FastifyOtelInstrumentation, shutdown: () => Promise<void> }> {
  const resource = defaultResource()
    .merge(resourceFromAttributes({ [ATTR_SERVICE_NAME]: 'gatehouse', [ATTR_SERVICE_VERSION]: release }))
    .merge(detectResources({ detectors: [envDetector] }))
  const provider = new NodeTracerProvider({ resource, spanProcessors: [new BatchSpanProcessor(await exporterFor(warn))] })
  // The global provider, the AsyncLocalStorage context manager, and W3C trace context and baggage as the propagator.
  provider.register()
  const tracer = trace.getTracer('gatehouse', release)
  installTracing(tracingWith(tracer))
  const instrumentation = new FastifyOtelInstrumentation()
  instrumentation.setTracerProvider(provider)
  return { instrumentation, shutdown: async () => { await provider.shutdown() } }
}

/** OTLP/HTTP with protobuf, the protocol's default; JSON when OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL says http/json. */
async function exporterFor (warn: (message: string) => void): Promise<SpanExporter> {
  const protocol = process.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? process.env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf'
  if (protocol === 'http/json') return new (await import('@opentelemetry/exporter-trace-otlp-http')).OTLPTraceExporter()
  if (protocol !== 'http/protobuf') warn(`OTEL_EXPORTER_OTLP_PROTOCOL=${protocol} is not supported; traces are exported over http/protobuf`)
  return new (await import('@opentelemetry/exporter-trace-otlp-proto')).OTLPTraceExporter()
}

/** A statement's first word (`SELECT`, `INSERT`, `BEGIN`), past the comment db/prepared.ts marks its statements with. */
function verbOf (text: string): string {
  return /^\s*(?:\/\*.*?\*\/\s*)*([A-Za-z]+)/s.exec(text)?.[1]?.toUpperCase() ?? 'SQL'
}

const NO_SPAN: SpanHandle = { set: () => {}, fail: () => {} }

function handleOf (span: Span): SpanHandle {
  return {
    set: (attributes) => { span.setAttributes(attributes) },
    fail: (message) => { span.setStatus({ code: SpanStatusCode.ERROR, message }) }
  }
}

/** The context to start a span in: the active one, or else the stored trace a piece of background work continues. */
function parentContext (parent: TraceIds | undefined): Context {
  const active = context.active()
  if (parent === undefined || trace.getSpan(active) !== undefined) return active
  return trace.setSpanContext(active, { traceId: parent.traceId, spanId: parent.spanId, traceFlags: TraceFlags.SAMPLED, isRemote: true })
}

function tracingWith (tracer: ReturnType<typeof trace.getTracer>): Tracing {
  return {
    inSpan: async (name, options, work) => {
      // Work of no request (the dummy hash at start-up) is not a trace of its own; an outgoing call is.
      if (options.client !== true && options.parent === undefined && trace.getSpan(context.active()) === undefined) return await work(NO_SPAN, {})
      const span = tracer.startSpan(name, { kind: options.client === true ? SpanKind.CLIENT : SpanKind.INTERNAL, ...(options.attributes !== undefined ? { attributes: options.attributes } : {}) }, parentContext(options.parent))
      const spanContext = trace.setSpan(context.active(), span)
      const headers: Record<string, string> = {}
      if (options.client === true) propagation.inject(spanContext, headers)
      try {
        return await context.with(spanContext, async () => await work(handleOf(span), headers))
      } catch (error) {
        span.recordException(error as Error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: (error as Error).message })
        throw error
      } finally {
        span.end()
      }
    },
    active: () => {
      const spanContext = trace.getSpan(context.active())?.spanContext()
      return spanContext !== undefined && trace.isSpanContextValid(spanContext) ? { traceId: spanContext.traceId, spanId: spanContext.spanId } : undefined
    },
    statementLog: (system) => (event: LogEvent) => {
      // Kysely calls this as the statement ends, in its caller's context; the span is dated back by the statement's duration.
      // A statement of no request or traced work (the background workers polling) would be a trace of one span each.
      if (trace.getSpan(context.active()) === undefined) return
      const text = event.query.sql
      const span = tracer.startSpan(verbOf(text), {
        kind: SpanKind.CLIENT,
        startTime: Date.now() - event.queryDurationMillis,
        attributes: { 'db.system.name': system, 'db.query.text': text }
      })
      if (event.level === 'error') span.setStatus({ code: SpanStatusCode.ERROR, message: event.error instanceof Error ? event.error.message : String(event.error) })
      span.end()
    }
  }
}
