import { AjvCompiler, type BuildCompilerFromPool, type RouteDefinition } from '@fastify/ajv-compiler'
import { SerializerSelector } from '@fastify/fast-json-stringify-compiler'
import { decimalNumbersOnly } from './decimal-numbers.ts'
import { lazySerializer, lazyValidator } from './lazy-compile.ts'
import { referencedSchemas } from './schema-refs.ts'

const AJV_OPTIONS = { removeAdditional: false, useDefaults: true, allErrors: true } as const
const ajvCompilers = AjvCompiler()

/**
 * Two Ajv instances over the same shared schemas: exact for bodies, coercing
 * for the textual parts (query string, path and headers are text, so they are
 * coerced to the declared types; JSON bodies are taken exactly as sent, and
 * form bodies are coerced by the routes that accept them, see lib/forms.ts).
 */
const buildValidators: BuildCompilerFromPool = (externalSchemas) => {
  // The Ajv instances too are made by the first request that validates (see lib/lazy-compile.ts).
  type Compile = ReturnType<typeof ajvCompilers>
  let exact: Compile | undefined
  let coercing: Compile | undefined
  return ((route: RouteDefinition) => lazyValidator(() => route.httpPart === 'body'
    ? (exact ??= ajvCompilers(externalSchemas, { customOptions: { ...AJV_OPTIONS, coerceTypes: false } }))(route)
    : decimalNumbersOnly((coercing ??= ajvCompilers(externalSchemas, { customOptions: { ...AJV_OPTIONS, coerceTypes: 'array' } }))(route)))) as ReturnType<BuildCompilerFromPool>
}

const serializerSelector = SerializerSelector()
/**
 * Response serializers, compiled on first use (see lib/lazy-compile.ts), each
 * given only the shared schemas its response refers to: fast-json-stringify
 * checks every schema it is given against the JSON Schema meta-schema at each
 * build, which with all of them cost a route's first request some 15 ms.
 */
const buildSerializers: typeof serializerSelector = (externalSchemas, options) => {
  return (route) => lazySerializer(() => serializerSelector(referencedSchemas(route.schema, (externalSchemas ?? {}) as Record<string, unknown>), options)(route))
}

/** Fastify's `schemaController`: unknown and read-only fields are an error, not something to drop silently. */
export const schemaController = { compilersFactory: { buildValidator: buildValidators, buildSerializer: buildSerializers } }
