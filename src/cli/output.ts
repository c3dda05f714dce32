import Table from 'cli-table3'

/** A failure the command reports in one line; exit code 1 (it failed) or 2 (it was called wrongly). */
export class CliError extends Error {
  readonly exitCode: number
  constructor (message: string, exitCode = 1) {
    super(message)
    this.exitCode = exitCode
  }
}

/** Wrong arguments, a missing setting or an impossible combination: exit code 2. */
export class UsageError extends CliError {
  constructor (message: string) {
    super(message, 2)
  }
}

export function printJson (value: unknown): void {
  process.stdout.write(JSON.stringify(value, null, 2) + '\n')
}

export function printLine (text: string): void {
  process.stdout.write(text + '\n')
}

/** A message about the command itself (warnings, what was undone): always stderr, so stdout stays parseable. */
export function note (text: string): void {
  process.stderr.write(`gatehouse: ${text}\n`)
}

/**
 * The width tables must fit: COLUMNS when it is set (the usual override, and
 * how a script or test asks for a width), else the terminal's width when
 * stdout is one. Piped or redirected output has no width: every value whole.
 */
export function outputWidth (env: NodeJS.ProcessEnv = process.env, stdout: { isTTY?: boolean, columns?: number } = process.stdout): number | undefined {
  if (env.COLUMNS !== undefined && /^[1-9]\d*$/.test(env.COLUMNS)) return Number(env.COLUMNS)
  return stdout.isTTY === true && stdout.columns !== undefined && stdout.columns > 0 ? stdout.columns : undefined
}

/** Narrowest a shrunk column gets (padding included): its header, or room for a few characters and the ellipsis. */
const MIN_COLUMN = 7

/**
 * Column widths (padding included) that fit `width`: the widest columns are
 * cut down to a common cap, the largest that fits, and whatever is left over
 * goes back to them; narrow columns keep their natural width.
 */
export function fitColumns (natural: number[], minimum: number[], width: number): number[] {
  // Each column has a border on its left, and the table one on the right.
  const room = width - natural.length - 1
  const capped = (cap: number): number[] => natural.map((w, i) => Math.min(w, Math.max(cap, minimum[i]!)))
  const sum = (widths: number[]): number => widths.reduce((a, b) => a + b, 0)
  if (sum(natural) <= room) return natural
  let cap = Math.max(...natural)
  while (cap > 1 && sum(capped(cap)) > room) cap -= 1
  const widths = capped(cap)
  let spare = room - sum(widths)
  for (let i = 0; spare > 0 && i < widths.length; i++) {
    if (widths[i]! < natural[i]!) {
      const give = Math.min(spare, natural[i]! - widths[i]!)
      widths[i]! += give
      spare -= give
    }
  }
  return widths
}

/**
 * A table with a rule under the header only. On a terminal (or with COLUMNS)
 * it fits the width: values of the widest columns that do not fit end in `…`
 * (`--json` has them whole).
 */
export function printTable (head: string[], rows: string[][]): void {
  const options = { head, style: { head: [], border: [], compact: true } }
  // Rendering fills colWidths with each column's natural width.
  const natural: number[] = []
  const table = new Table({ ...options, colWidths: natural })
  table.push(...rows)
  let text = table.toString()
  const width = outputWidth()
  if (width !== undefined && natural.reduce((a, b) => a + b, natural.length + 1) > width) {
    const minimum = head.map(h => Math.max(h.length + 2, MIN_COLUMN))
    const fitted = new Table({ ...options, colWidths: fitColumns(natural, minimum, width) })
    fitted.push(...rows)
    text = fitted.toString()
  }
  process.stdout.write(text + '\n')
}

/** One record as aligned `key  value` lines. */
export function printRecord (record: Record<string, unknown>): void {
  const width = Math.max(...Object.keys(record).map(k => k.length))
  for (const [key, value] of Object.entries(record)) {
    process.stdout.write(`${key.padEnd(width)}  ${cell(value)}\n`)
  }
}

export function cell (value: unknown): string {
  if (value === null || value === undefined) return ''
  if (Array.isArray(value)) return value.join(', ')
  return String(value)
}
