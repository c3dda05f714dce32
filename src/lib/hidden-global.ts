/**
 * Runs `fn` with `globalThis[name]` absent, then puts the property back as it
 * was: when `fn` returns, or when the promise it returns settles.
 *
 * Node defines its web globals (FormData, Response, …) as lazy getters, and
 * the first read loads their implementation, undici: some 25 ms and 3 MiB. Two
 * dependencies read one at load time only to decide something gatehouse does
 * not use (see the callers), so that read is made to find nothing.
 */
export function withGlobalHidden<T> (name: 'FormData' | 'Response', fn: () => T): T {
  const descriptor = Object.getOwnPropertyDescriptor(globalThis, name)
  Object.defineProperty(globalThis, name, { value: undefined, configurable: true, writable: true })
  const restore = (): void => {
    if (descriptor !== undefined) Object.defineProperty(globalThis, name, descriptor)
    else delete (globalThis as Record<string, unknown>)[name]
  }
  let result: T
  try {
    result = fn()
  } catch (error) {
    restore()
    throw error
  }
  if (result instanceof Promise) return result.finally(restore) as T
  restore()
  return result
}
