import type { FastifyTypeBox } from '../lib/http.ts'
import { RELEASE } from '../system/release.ts'

/** Whether the environment asks for traces: an OTLP endpoint, and the SDK not switched off (OpenTelemetry's own variables). */
export function tracingWanted (env: NodeJS.ProcessEnv = process.env): boolean {
  const endpoint = (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? env.OTEL_EXPORTER_OTLP_ENDPOINT ?? '').trim()
  return endpoint !== '' && env.OTEL_SDK_DISABLED?.trim().toLowerCase() !== 'true' && env.OTEL_TRACES_EXPORTER?.trim().toLowerCase() !== 'none'
}

/**
 * Traces every request when the environment asks for them
 * (docs/operations.md#traces); otherwise does nothing and loads nothing.
 * Called first thing on a new app: @fastify/otel wraps only the hooks and
 * routes added after it, and the database's statement spans are decided when
 * it is opened.
 */
export async function registerTracing (app: FastifyTypeBox): Promise<void> {
  if (!tracingWanted()) return
  const { startTracing } = await import('./tracing.ts')
  const { instrumentation, shutdown } = await startTracing(RELEASE, message => { app.log.warn(message) })
  await app.register(instrumentation.plugin())
  // Every line a request logs, its access line included, names its trace.
  app.addHook('onRequest', (request, _reply, done) => {
    const span = request.opentelemetry().span
    if (span != null) (request.log as unknown as { setBindings: (bindings: Record<string, string>) => void }).setBindings({ trace_id: span.spanContext().traceId })
    done()
  })
  // The spans still waiting in the batch go out before the process ends.
  app.addHook('onClose', async () => { await shutdown() })
  app.log.info({ endpoint: process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? process.env.OTEL_EXPORTER_OTLP_ENDPOINT }, 'exporting traces over OTLP/HTTP')
}
