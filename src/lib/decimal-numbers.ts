import { escapePointer } from '../errors.ts'

/**
 * Ajv coerces a query, path or header value to a number whenever
 * `value == +value`: so `Infinity`, `1e309` (which is Infinity too), `0x10`,
 * `1e3` and ` 5` all became numbers. Worse, a coerced Infinity skipped
 * `minimum` and `maximum` (Ajv checks those only on finite numbers) and went
 * on to SQL as a page size, failing the statement on both databases. This
 * wrapper, around every validator of those textual parts, accepts a coerced
 * number only if the client wrote it in plain decimal digits and it is finite;
 * anything else is reported as a validation error of that value.
 */

const DECIMAL = /^-?(?:0|[1-9]\d*)(?:\.\d+)?$/

/** Ajv's error shape, as errors.ts turns it into a field error. */
interface NumberIssue { instancePath: string, schemaPath: string, keyword: string, params: Record<string, unknown>, message: string }

type Validate = ((data: unknown, context?: unknown) => unknown) & { errors?: unknown, schemaEnv?: unknown }

export function decimalNumbersOnly<F> (validate: F): F {
  const inner = validate as unknown as Validate
  const checked = function (data: unknown, context?: unknown): unknown {
    const written = snapshot(data)
    const result = inner(data, context)
    const issues = written === undefined ? [] : nonDecimalNumbers(written, data as Record<string, unknown>)
    const ajvErrors = result === false && Array.isArray(inner.errors) ? inner.errors as unknown[] : []
    checked.errors = issues.length > 0 ? [...ajvErrors, ...issues] : inner.errors
    return issues.length > 0 ? false : result
  } as Validate
  Object.defineProperty(checked, 'schemaEnv', { get: () => inner.schemaEnv })
  return checked as unknown as F
}

/** The values as the client wrote them (Ajv replaces them in place while coercing). */
function snapshot (data: unknown): Record<string, unknown> | undefined {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return undefined
  const copy: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(data)) copy[name] = Array.isArray(value) ? [...value] : value
  return copy
}

function nonDecimalNumbers (written: Record<string, unknown>, coerced: Record<string, unknown>): NumberIssue[] {
  const issues: NumberIssue[] = []
  for (const [name, before] of Object.entries(written)) {
    const after = coerced[name]
    const pairs: Array<[unknown, unknown, string]> = Array.isArray(after)
      ? after.map((item, i) => [Array.isArray(before) ? before[i] : before, item, `/${i}`])
      : [[Array.isArray(before) && before.length === 1 ? before[0] : before, after, '']]
    for (const [text, value, suffix] of pairs) {
      if (typeof text !== 'string' || typeof value !== 'number') continue
      if (DECIMAL.test(text) && Number.isFinite(value)) continue
      issues.push({
        instancePath: `/${escapePointer(name)}${suffix}`,
        schemaPath: '#/type',
        keyword: 'type',
        params: {},
        message: 'must be a number in plain decimal digits, such as 100 (not Infinity, 1e3 or 0x10)'
      })
    }
  }
  return issues
}
