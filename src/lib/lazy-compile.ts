/**
 * Fastify compiles every route's validators (Ajv) and response serializers
 * (fast-json-stringify) while the server starts: some 250 functions, most of
 * start-up's CPU time, for routes a given process may never serve. These
 * wrappers compile a function the first time it is called instead, so a
 * route's first request pays a few milliseconds and start-up pays nothing.
 * A schema that does not compile is then reported by the first request to the
 * route rather than at start-up; the test suite calls every route.
 *
 * Measured (issue 17, Node 20, 2-core VM, medians of 5 starts to the first 2xx
 * of /auth/healthz, interleaved): with these wrappers 289 ms and 95 MiB idle
 * RSS on SQLite, 325 ms and 94 MiB on PostgreSQL; compiling everything at
 * start 623 ms and 125 to 135 MiB, 667 ms and 122 to 133 MiB. Both goals
 * (start-up < 500 ms, idle RSS < 100 MiB) need them.
 */

type AnyFn = (...args: never[]) => unknown
type Callable = (...args: unknown[]) => unknown

/** A serializer compiled on its first call. */
export function lazySerializer<F extends AnyFn> (compile: () => F): F {
  let compiled: F | undefined
  return ((...args: unknown[]) => ((compiled ??= compile()) as unknown as Callable)(...args)) as unknown as F
}

/**
 * A validator compiled on its first call. Fastify reads `schemaEnv` before the
 * call (an Ajv function gets its parent object then, so coercion can replace
 * the root value) and `errors` after it, so both are passed through.
 */
export function lazyValidator<F extends AnyFn> (compile: () => F): F {
  let compiled: (F & { errors?: unknown, schemaEnv?: unknown }) | undefined
  const get = (): F & { errors?: unknown, schemaEnv?: unknown } => (compiled ??= compile())
  const validate = function (...args: unknown[]): unknown {
    const fn = get()
    const result = (fn as unknown as Callable)(...args)
    ;(validate as { errors?: unknown }).errors = fn.errors
    return result
  }
  Object.defineProperty(validate, 'schemaEnv', { get: () => get().schemaEnv })
  return validate as unknown as F
}
