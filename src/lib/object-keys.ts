import type { FastifyRequest } from 'fastify'
import { AppError, escapePointer } from '../errors.ts'

/**
 * The names through which a key written onto an object reaches a prototype:
 * `o["__proto__"] = v` replaces o's prototype, and a path walked name by name
 * (`constructor.prototype.x`) writes onto Object.prototype itself, which every
 * object in the process reads.
 */
const PROTOTYPE_NAMES = new Set(['__proto__', 'constructor', 'prototype'])

export function isPrototypeName (name: string): boolean {
  return PROTOTYPE_NAMES.has(name)
}

/** The JSON pointer of the first key at any depth that is a prototype name, or undefined; walked without recursion. */
export function prototypeNameIn (root: unknown): string | undefined {
  const pending: Array<[unknown, string]> = [[root, '']]
  while (pending.length > 0) {
    const [value, pointer] = pending.pop()!
    if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) pending.push([value[i], `${pointer}/${i}`])
    } else if (typeof value === 'object' && value !== null && !Buffer.isBuffer(value)) {
      for (const [name, item] of Object.entries(value)) {
        const at = `${pointer}/${escapePointer(name)}`
        if (isPrototypeName(name)) return at
        pending.push([item, at])
      }
    }
  }
  return undefined
}

/** The value a table holds under a name that came from a client: its own entries only, never what its prototype has. */
export function ownValue<T> (table: Readonly<Record<string, T>>, name: string): T | undefined {
  return Object.hasOwn(table, name) ? table[name] : undefined
}

/**
 * Refuses a request whose body or query names `__proto__`, `constructor` or
 * `prototype` as a key at any depth, whatever its media type (JSON, merge
 * patch, SCIM, form, multipart). No field of gatehouse has such a name, and
 * code further on copies, merges and walks what clients send: refusing them
 * here means no client name can reach a prototype, however it is handled.
 * The JSON parser already refuses `__proto__` and `constructor.prototype`
 * (`onProtoPoisoning`/`onConstructorPoisoning: 'error'`, system/server-options.ts); this also
 * covers form fields, query names and a lone `constructor`.
 */
export async function rejectPrototypeNames (request: FastifyRequest): Promise<void> {
  if (request.is404) return
  for (const [part, value] of [['query', request.query], ['body', request.body]] as const) {
    const pointer = prototypeNameIn(value)
    if (pointer !== undefined) {
      throw new AppError('malformed_body', 400, `The ${part} contains a forbidden property name (__proto__, constructor or prototype) at ${pointer}.`)
    }
  }
}
