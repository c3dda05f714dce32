import type { LogEvent } from 'kysely'

/**
 * What the service asks of tracing, at any level: a span around some work,
 * the trace a change is recorded in, a span per database statement. Until
 * src/telemetry/tracing.ts installs the OpenTelemetry implementation (only
 * with OTEL_EXPORTER_OTLP_ENDPOINT set, docs/operations.md#traces) every call
 * is the work itself and nothing more, and no OpenTelemetry module is loaded.
 */
export interface Tracing {
  inSpan: <T>(name: string, options: SpanOptions, work: (span: SpanHandle, headers: Readonly<Record<string, string>>) => Promise<T>) => Promise<T>
  active: () => TraceIds | undefined
  statementLog: (system: 'sqlite' | 'postgresql') => ((event: LogEvent) => void) | undefined
}

/** A span as the traced code sees it: attributes to add, and a failure to mark it with. */
export interface SpanHandle {
  set: (attributes: Record<string, string | number | boolean>) => void
  fail: (message: string) => void
}

export interface SpanOptions {
  /** An outgoing call (SMTP, a webhook, an OpenID provider): span kind CLIENT, and `headers` carries its `traceparent`. */
  client?: boolean
  attributes?: Record<string, string | number | boolean>
  /** The trace to continue when there is no active one (a webhook delivery continues its event's). */
  parent?: TraceIds | undefined
}

/** W3C trace context ids, lower-case hex: 32 digits and 16. */
export interface TraceIds { traceId: string, spanId: string }

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({})
const NO_SPAN: SpanHandle = { set: () => {}, fail: () => {} }
const OFF: Tracing = {
  inSpan: async (_name, _options, work) => await work(NO_SPAN, NO_HEADERS),
  active: () => undefined,
  statementLog: () => undefined
}

let current: Tracing = OFF

/** Called once, by src/telemetry/tracing.ts, before the database is opened. */
export function installTracing (tracing: Tracing): void {
  current = tracing
}

export async function inSpan<T> (name: string, options: SpanOptions, work: (span: SpanHandle, headers: Readonly<Record<string, string>>) => Promise<T>): Promise<T> {
  return await current.inSpan(name, options, work)
}

/** The trace and span active here, if tracing is on and a span is. */
export function activeTrace (): TraceIds | undefined {
  return current.active()
}

/** Kysely's `log` option: a span per statement when tracing is on, nothing (no option) when off. */
export function statementLog (system: 'sqlite' | 'postgresql'): { log?: (event: LogEvent) => void } {
  const log = current.statementLog(system)
  return log === undefined ? {} : { log }
}
