import { Type, type Static, type TSchema } from 'typebox'
import { STATUS_CODES } from 'node:http'

/**
 * A reference to a schema registered with `app.addSchema`, typed as the
 * schema itself. Named schemas appear once under components.schemas in the
 * OpenAPI document instead of being inlined at every use.
 */
export function ref<T extends TSchema> (schema: T): ReturnType<typeof Type.Unsafe<Static<T>>> {
  const id = (schema as { $id?: unknown }).$id
  if (typeof id !== 'string') throw new TypeError('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>(Type.Ref(`${id}#`))
}

export const Problem = Type.Object({
  type: Type.String({ description: '`urn:gatehouse:problem:<code>`; see docs/errors.md.' }),
  title: Type.String({ description: 'The HTTP status text.' }),
  status: Type.Integer(),
  detail: Type.String({ description: 'What went wrong, for a person.' }),
  code: Type.String({ description: 'Stable snake_case error code, for programs.', examples: ['user_not_found'] }),
  request_id: Type.String({ description: 'Quote this when reporting a problem; it is in our logs.' }),
  errors: Type.Optional(Type.Array(Type.Object({
    in: Type.String({ description: 'body, query, path or header' }),
    pointer: Type.String({ description: 'JSON pointer (RFC 6901) to the offending value.' }),
    detail: Type.String()
  })))
}, {
  $id: 'Problem',
  // RFC 9457 extension members: some problems carry more (Import Users' per-item report).
  additionalProperties: true,
  description: 'An RFC 9457 problem; every error has this shape, as application/problem+json. Some carry extension members, described with their operation.'
})

const ProblemRef = ref(Problem)

/** Error responses to document for an operation, each as a Problem; 500 is possible everywhere. */
export function problems (...statuses: number[]): Record<number, TSchema> {
  const out: Record<number, TSchema> = {}
  for (const status of [...statuses, 500]) {
    out[status] = Type.Unsafe({ ...ProblemRef, description: STATUS_CODES[status] ?? 'Error' })
  }
  return out
}

/** The two path families: the current release under /api, and 3.6.1's paths, kept as deprecated aliases. */
export const FAMILIES = [
  { prefix: '/api', legacy: false, tag: 'default', operationId: (id: string) => id },
  { prefix: '', legacy: true, tag: 'legacy', operationId: (id: string) => `legacy_${id}` }
] as const

/** Any one of the three ways to send an API key will do. */
export const SECURITY: Array<Record<string, string[]>> = [{ ApiKeyQuery: [] }, { ApiKeyHeader: [] }, { Bearer: [] }]

/**
 * `T | null` as `type: [T, "null"]` (OpenAPI 3.1) rather than anyOf: the
 * serializer writes type lists directly but must run a validator for anyOf.
 */
export function Nullable<T extends TSchema & { type: string }> (schema: T, options: Record<string, unknown> = {}): ReturnType<typeof Type.Unsafe<Static<T> | null>> {
  return Type.Unsafe<Static<T> | null>({ ...schema, ...options, type: [schema.type, 'null'] })
}
