import type { FastifyRequest } from 'fastify'
import { AppError, escapePointer, type FieldError } from '../errors.ts'

/** Enough to show the client what is wrong; a 4 MiB import full of NULs need not be listed item by item. */
const MAX_REPORTED = 20

/**
 * Refuses U+0000 anywhere a request carries text: decoded query values, path
 * parameters, and every string and field name of a parsed body (JSON, form or
 * multipart). PostgreSQL cannot store it in text and fails the statement;
 * SQLite's C strings end at it, so `q=%00` became the pattern `%` and matched
 * everyone. Refusing it here, before validation and before any handler (or a
 * streamed answer) starts, gives both databases the same 422 without a rule
 * in every schema.
 */
export async function rejectNulBytes (request: FastifyRequest): Promise<void> {
  if (request.is404) return
  const errors: FieldError[] = []
  for (const [part, value] of [['query', request.query], ['path', request.params], ['body', request.body]] as const) {
    collectNulBytes(value, part, errors)
  }
  if (errors.length > 0) {
    throw new AppError('validation_failed', 422, 'The request contains a NUL byte (U+0000), which no value may contain.', { errors })
  }
}

/** Walks the value without recursion, so no nesting depth can exhaust the stack. */
function collectNulBytes (root: unknown, part: string, errors: FieldError[]): void {
  const pending: Array<[unknown, string]> = [[root, '']]
  while (pending.length > 0 && errors.length < MAX_REPORTED) {
    const [value, pointer] = pending.pop()!
    if (typeof value === 'string') {
      if (value.includes('\u0000')) errors.push({ in: part, pointer, detail: 'contains a NUL byte (U+0000)' })
    } else if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) pending.push([value[i], `${pointer}/${i}`])
    } else if (typeof value === 'object' && value !== null && !Buffer.isBuffer(value)) {
      const entries = Object.entries(value)
      for (let i = entries.length - 1; i >= 0; i--) {
        const [name, item] = entries[i]!
        const at = `${pointer}/${escapePointer(name)}`
        if (name.includes('\u0000')) errors.push({ in: part, pointer: at, detail: 'is a field name containing a NUL byte (U+0000)' })
        pending.push([item, at])
      }
    }
  }
}
