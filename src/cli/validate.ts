import { Ajv } from 'ajv'
import addFormats from 'ajv-formats'
import { UserCreate } from '../users/users.schemas.ts'

/**
 * The service's own UserCreate schema, compiled with the options the service
 * uses for JSON bodies (nothing coerced, nothing removed), so a row is judged
 * here as the API would judge it.
 */
let validator: ((value: unknown) => boolean) & { errors?: Array<{ instancePath: string, message?: string, params?: Record<string, unknown> }> | null } | undefined

export function userCreateProblems (value: unknown): string[] {
  if (validator === undefined) {
    const ajv = new Ajv({ allErrors: true, strict: false, coerceTypes: false, removeAdditional: false, useDefaults: false })
    addFormats.default(ajv)
    validator = ajv.compile(UserCreate)
  }
  if (validator(value)) return []
  return (validator.errors ?? []).map(e => {
    const field = e.instancePath !== '' ? e.instancePath : typeof e.params?.additionalProperty === 'string' ? `/${e.params.additionalProperty}` : '/'
    return `${field}: ${e.message ?? 'is invalid'}`
  })
}
