import type { FastifyRequest } from 'fastify'
import { AppError, escapePointer, type FieldError } from '../errors.ts'

/** Enough to show the client what is wrong; a 4 MiB import full of NULs need not be listed item by item. */
const MAX_REPORTED = 20

/** A high surrogate not followed by a low one, or a low one not preceded by a high one. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/
/** Any surrogate at all: nearly every text has none, and a plain scan says so before the look-around above runs. */
const ANY_SURROGATE = /[\uD800-\uDFFF]/

/** What no stored text can hold, and how a field error names it. */
function unstorable (text: string): string | undefined {
  if (text.includes('\u0000')) return 'a NUL byte (U+0000)'
  if (ANY_SURROGATE.test(text) && LONE_SURROGATE.test(text)) return 'a lone UTF-16 surrogate (U+D800 to U+DFFF)'
  return undefined
}

/**
 * Refuses U+0000 and lone UTF-16 surrogates anywhere a request carries text:
 * decoded query values, path parameters, and every string and field name of a
 * parsed body (JSON, form or multipart). Headers need no check: Node reads
 * them as Latin-1 and refuses NUL in them.
 *
 * PostgreSQL cannot store either in text and fails the statement (a surrogate
 * is not UTF-8; JSON's `"\ud800"` escape makes one); SQLite's C strings end at
 * NUL, so `q=%00` became the pattern `%` and matched everyone, and it stores a
 * surrogate as bytes no reader can decode. Refusing them here, before
 * validation and before any handler (or a streamed answer) starts, gives both
 * databases the same 422 without a rule in every schema.
 */
export async function rejectNulBytes (request: FastifyRequest): Promise<void> {
  if (request.is404) return
  const errors: FieldError[] = []
  collectUnstorable(request.query, 'query', errors)
  collectUnstorable(request.params, 'path', errors)
  collectUnstorable(request.body, 'body', errors)
  if (errors.length > 0) {
    throw new AppError('validation_failed', 422, 'The request contains a NUL byte (U+0000) or a lone UTF-16 surrogate, which no value may contain.', { errors })
  }
}

/** Walks the value without recursion, so no nesting depth can exhaust the stack. */
function collectUnstorable (root: unknown, part: string, errors: FieldError[]): void {
  if (root === undefined || root === null) return
  const pending: Array<[unknown, string]> = [[root, '']]
  while (pending.length > 0 && errors.length < MAX_REPORTED) {
    const [value, pointer] = pending.pop()!
    if (typeof value === 'string') {
      const what = unstorable(value)
      if (what !== undefined) errors.push({ in: part, pointer, detail: `contains ${what}` })
    } else if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) pending.push([value[i], `${pointer}/${i}`])
    } else if (typeof value === 'object' && value !== null && !Buffer.isBuffer(value)) {
      const entries = Object.entries(value)
      for (let i = entries.length - 1; i >= 0; i--) {
        const [name, item] = entries[i]!
        const at = `${pointer}/${escapePointer(name)}`
        const what = unstorable(name)
        if (what !== undefined) errors.push({ in: part, pointer: at, detail: `is a field name containing ${what}` })
        pending.push([item, at])
      }
    }
  }
}
