import { parse, type Filter } from 'scim2-parse-filter'

export type { Filter } from 'scim2-parse-filter'

/** A filter that cannot be parsed or names something this service cannot filter on: SCIM's 400 `invalidFilter`. */
export class InvalidFilter extends Error {
  override readonly name = 'InvalidFilter'
}

const COMPARISON = /(\s(?:eq|ne|co|sw|ew|gt|ge|lt|le)\s+)([^\s"()[\]]+)/gi
const JSON_LITERAL = /^(?:true|false|null|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)$/

/**
 * RFC 7644 wants string values quoted, but Microsoft's own conformance
 * collection sends `name.familyName eq Employee` and
 * `meta.created gt 2015-10-10T14:38:21.8617979-07:00`: a bare word where a
 * value belongs is read as the string it spells. Only text outside quoted
 * strings is touched, so a quoted value is never rewritten.
 */
function quoteBareValues (text: string): string {
  return text.split(/("(?:[^"\\]|\\.)*")/).map((part, i) => i % 2 === 1
    ? part
    : part.replace(COMPARISON, (whole, op: string, value: string) => JSON_LITERAL.test(value) ? whole : `${op}${JSON.stringify(value)}`)).join('')
}

/** The AST of a SCIM filter (RFC 7644 §3.4.2.2), by scim2-parse-filter; InvalidFilter when it is not one. */
export function parseScimFilter (text: string): Filter {
  try {
    return parse(quoteBareValues(text))
  } catch (error) {
    throw new InvalidFilter(`The filter cannot be parsed: ${(error as Error).message}.`, { cause: error })
  }
}
