import { Ajv } from 'ajv'
import addFormats from 'ajv-formats'
import type { TSchema } from 'typebox'
import type { FastifyRequest } from 'fastify'

const FORM_TYPES = new Set(['application/x-www-form-urlencoded', 'multipart/form-data'])
// Built on the first form body: JSON clients never need it.
let coercer: Ajv | undefined
function formCoercer (): Ajv {
  if (coercer === undefined) {
    coercer = new Ajv({ coerceTypes: 'array', removeAdditional: false, useDefaults: true, allErrors: true, strict: false })
    addFormats.default(coercer)
  }
  return coercer
}

/**
 * JSON bodies are validated exactly as sent (`{"disabled": null}` is an
 * error, not `false`). Form fields, though, are strings by nature, so for
 * form bodies this coerces them to the schema's types first: `"true"` to
 * true, a single `groups` field to a one-item array. Fastify's exact
 * validation then runs on the result and reports anything still wrong.
 */
export function coerceFormFields (schema: TSchema): (request: FastifyRequest) => Promise<void> {
  let coerce: ((data: unknown) => unknown) | undefined
  return async (request) => {
    const type = request.headers['content-type']?.split(';')[0]?.trim().toLowerCase()
    if (type !== undefined && FORM_TYPES.has(type) && typeof request.body === 'object' && request.body !== null) {
      coerce ??= formCoercer().compile(schema)
      coerce(request.body)
    }
  }
}
