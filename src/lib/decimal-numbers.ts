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
    const issues = written === undefined ? undefined : nonDecimalNumbers(written, data as Record<string, unknown>)
    const ajvErrors = result === false && Array.isArray(inner.errors) ? inner.errors as unknown[] : []
    checked.errors = issues !== undefined ? [...ajvErrors, ...issues] : inner.errors
    return issues !== undefined ? false : result
  } as Validate
  Object.defineProperty(checked, 'schemaEnv', { get: () => inner.schemaEnv })
  return checked as unknown as F
}

/** The values as the client wrote them (Ajv replaces them in place while coercing). */
function snapshot (data: unknown): Record<string, unknown> | undefined {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return undefined
  const copy: Record<string, unknown> = {}
  for (const name in data) {
    if (!Object.hasOwn(data, name)) continue
    const value = (data as Record<string, unknown>)[name]
    copy[name] = Array.isArray(value) ? [...value] : value
  }
  return copy
}

/** The coerced numbers not written in plain decimal digits; undefined when there are none (nearly always, so nothing is allocated then). */
function nonDecimalNumbers (written: Record<string, unknown>, coerced: Record<string, unknown>): NumberIssue[] | undefined {
  let issues: NumberIssue[] | undefined
  const check = (text: unknown, value: unknown, pointer: string): void => {
    if (typeof text !== 'string' || typeof value !== 'number') return
    if (DECIMAL.test(text) && Number.isFinite(value)) return
    ;(issues ??= []).push({
      instancePath: pointer,
      schemaPath: '#/type',
      keyword: 'type',
      params: {},
      message: 'must be a number in plain decimal digits, such as 100 (not Infinity, 1e3 or 0x10)'
    })
  }
  for (const name in written) {
    const before = written[name]
    const after = coerced[name]
    if (Array.isArray(after)) {
      for (let i = 0; i < after.length; i++) check(Array.isArray(before) ? before[i] : before, after[i], `/${escapePointer(name)}/${i}`)
    } else if (typeof after === 'number') {
      check(Array.isArray(before) && before.length === 1 ? before[0] : before, after, `/${escapePointer(name)}`)
    }
  }
  return issues
}
