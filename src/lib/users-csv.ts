import { User } from '../users/users.schemas.ts'

/**
 * The CSV form of users that `gatehouse users export --format csv` and the
 * console's Export CSV write, and `gatehouse users import` reads back: one
 * column per field of the API's User, in its order, so a new field shows up
 * here (and in the round-trip tests) by itself.
 */
export const USER_CSV_COLUMNS = Object.keys(User.properties) as Array<keyof User>

/**
 * A cell a spreadsheet would run as a formula (or, with a tab or CR first,
 * show as something else) gets an apostrophe in front, as OWASP advises; so
 * does a cell that starts with an apostrophe, so that the import can take
 * exactly one off again and every value comes back as it was.
 */
const GUARDED = /^[=+\-@\t\r']/
/** An apostrophe that `guardCell` put there: followed by what it guards. */
const GUARD = /^'[=+\-@\t\r']/

/** Quoted where the text needs it: the delimiter, a quote, a line break, or spaces at either end that a reader could trim. */
function quoted (text: string, delimiter: string): string {
  return text.includes(delimiter) || /["\r\n]|^\s|\s$/.test(text) ? `"${text.replaceAll('"', '""')}"` : text
}

export function guardCell (text: string): string {
  return GUARDED.test(text) ? `'${text}` : text
}

/** A cell as the import reads it: the apostrophe of `guardCell` taken off, anything else as it is. */
export function unguardCell (text: string): string {
  return GUARD.test(text) ? text.slice(1) : text
}

/**
 * Groups as one cell: `;`-separated, as the import splits them, unless a name
 * would not survive that (it holds a `;`, has spaces at either end, or the
 * cell would start with `[`); then a JSON array, which the import also reads.
 */
function groupsCell (groups: readonly string[]): string {
  const plain = groups.every(g => !g.includes(';') && g.trim() === g) && !(groups[0] ?? '').startsWith('[')
  return plain ? groups.join(';') : JSON.stringify(groups)
}

function cellOf (value: unknown): string {
  if (value === null || value === undefined) return ''
  if (Array.isArray(value)) return groupsCell(value as string[])
  return String(value)
}

/** One CSV line (RFC 4180, CRLF) of the given cells. */
export function csvLine (cells: readonly string[], delimiter = ','): string {
  return cells.map(c => quoted(guardCell(c), delimiter)).join(delimiter) + '\r\n'
}

export function userCsvHeader (): string {
  return csvLine(USER_CSV_COLUMNS)
}

export function userCsvLine (user: Record<string, unknown>): string {
  return csvLine(USER_CSV_COLUMNS.map(column => cellOf(user[column])))
}

const DELIMITERS = [',', ';', '\t'] as const
export type CsvDelimiter = typeof DELIMITERS[number]

/**
 * The delimiter of a CSV file, judged from its header line: whichever of
 * comma, semicolon and tab occurs most often outside quotes (a spreadsheet
 * set to a European locale writes `;`, "Unicode text" exports write tabs).
 * A header of one column has none of them: then a comma.
 */
export function delimiterOf (headerLine: string): CsvDelimiter {
  const counts = new Map<string, number>(DELIMITERS.map(d => [d, 0]))
  let inQuotes = false
  for (const char of headerLine) {
    if (char === '"') inQuotes = !inQuotes
    else if (!inQuotes && counts.has(char)) counts.set(char, counts.get(char)! + 1)
  }
  let best: CsvDelimiter = ','
  for (const d of DELIMITERS) if (counts.get(d)! > counts.get(best)!) best = d
  return best
}
