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

export function printTable (head: string[], rows: string[][]): void {
  const table = new Table({ head, style: { head: [], border: [] } })
  table.push(...rows)
  process.stdout.write(table.toString() + '\n')
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
