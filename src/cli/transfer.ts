import { createWriteStream } from 'node:fs'
import { open } from 'node:fs/promises'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { pipeline, Readable, type Writable } from 'node:stream'
import type { Command } from 'commander'
import { parse } from 'csv-parse'
import pLimit from 'p-limit'
import { isPrototypeName, prototypeNameIn } from '../lib/object-keys.ts'
import { checkImportedHash } from '../lib/passwords.ts'
import { delimiterOf, unguardCell, userCsvHeader, userCsvLine, type CsvDelimiter } from '../lib/users-csv.ts'
import { ApiClient, ApiError } from './http.ts'
import { CliError, printJson, printLine, UsageError } from './output.ts'
import { addFilterOptions, filterQuery, type FilterOptions } from './filters.ts'

/**
 * Fields of an exported user that the server assigns or decides (a confirmed
 * address, a pending invitation): skipped on import, so an export imports again.
 */
const SERVER_FIELDS = new Set(['id', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at', 'email_verified', 'invitation_pending'])
const IN_FLIGHT = 8

export interface ImportRow {
  /** Line of the file where the row starts. */
  line: number
  username: string | null
  status: 'created' | 'failed' | 'valid' | 'rolled_back' | 'not_attempted'
  id?: string
  error?: string
  body?: Record<string, unknown>
}

const READ_ERRORS: Record<string, string> = { ENOENT: 'no such file', EACCES: 'permission denied', EISDIR: 'it is a directory' }

/** Why `file` cannot be read, in a few words (the error's own message names the file a second time). */
function readProblem (error: unknown): string {
  const { code, message } = error as NodeJS.ErrnoException
  return (code !== undefined ? READ_ERRORS[code] : undefined) ?? message.replace(/^[A-Z]+: /, '').replace(/, \w+ '.*'$/, '')
}

/**
 * Opens the file to import before anything else happens, so a wrong name is
 * one line (exit code 1) rather than a stream error thrown from nowhere.
 */
async function openInput (file: string): Promise<Readable> {
  if (file === '-') return process.stdin
  try {
    const handle = await open(file, 'r')
    // Opening a directory succeeds on Linux; reading it is what fails.
    if ((await handle.stat()).isDirectory()) {
      await handle.close()
      throw Object.assign(new Error('is a directory'), { code: 'EISDIR' })
    }
    return handle.createReadStream()
  } catch (error) {
    throw new CliError(`cannot read ${file}: ${readProblem(error)}`)
  }
}

async function * jsonLines (input: Readable): AsyncGenerator<{ line: number, record: unknown, error?: string }> {
  let line = 0
  for await (const text of createInterface({ input, crlfDelay: Infinity })) {
    line += 1
    if (text.trim() === '') continue
    try {
      yield { line, record: JSON.parse(text) }
    } catch {
      yield { line, record: undefined, error: 'not valid JSON' }
    }
  }
}

/**
 * The input with its first line read ahead (to judge the delimiter from the
 * header), and a stream that still yields every byte, that line included.
 */
async function withFirstLine (input: Readable): Promise<{ firstLine: string, rest: Readable }> {
  const chunks = input[Symbol.asyncIterator]() as AsyncIterator<Buffer | string>
  const head: Buffer[] = []
  let ended = false
  while (!head.some(c => c.includes(0x0a))) {
    const next = await chunks.next()
    if (next.done === true) { ended = true; break }
    head.push(Buffer.from(next.value))
  }
  const text = Buffer.concat(head).toString('utf8').replace(/^\uFEFF/, '')
  const firstLine = text.split(/\r?\n/, 1)[0] ?? ''
  const rest = Readable.from((async function * () {
    yield * head
    if (ended) return
    for (let next = await chunks.next(); next.done !== true; next = await chunks.next()) yield next.value
  })(), { objectMode: false })
  return { firstLine, rest }
}

/** A header's columns as the error shows them: each quoted, at most ten, each at most 40 characters. */
function columnsRead (names: string[], delimiter: CsvDelimiter): string {
  const shown = names.slice(0, 10).map(n => JSON.stringify(n.length > 40 ? `${n.slice(0, 40)}…` : n))
  const more = names.length > 10 ? ` and ${names.length - 10} more` : ''
  const separator = delimiter === '\t' ? 'tabs' : `"${delimiter}"`
  return names.length === 1 ? `the one column ${shown[0]!} (looking for ",", ";" or tab between columns)` : `the columns ${shown.join(', ')}${more} (separated by ${separator})`
}

async function * csvRows (input: Readable): AsyncGenerator<{ line: number, record: unknown, error?: string }> {
  const { firstLine, rest } = await withFirstLine(input)
  const delimiter = delimiterOf(firstLine)
  const parser = parse({
    bom: true,
    delimiter,
    skip_empty_lines: true,
    info: true,
    relax_column_count: false,
    columns: (header: string[]) => {
      const names = header.map(h => h.trim())
      if (!names.includes('username')) throw new UsageError(`the CSV header has no username column: it read ${columnsRead(names, delimiter)}`)
      const forbidden = names.find(isPrototypeName)
      if (forbidden !== undefined) throw new UsageError(`the CSV header names a column "${forbidden}", which no user field is`)
      return names
    }
  })
  // pipeline, not pipe: a read error mid-file must reach the loop below, not crash the process.
  pipeline(rest, parser, () => {})
  for await (const { record, info } of parser as AsyncIterable<{ record: Record<string, string>, info: { lines: number } }>) {
    yield { line: info.lines, record: fromCsv(record) }
  }
}

const BOOLEAN_COLUMNS = new Set(['disabled', 'password_sign_in', 'email_verified', 'invitation_pending'])

/**
 * CSV cells are text: an empty cell is an absent field, groups are a JSON
 * array or `;`-separated, the yes/no fields a boolean word. The apostrophe
 * the export puts before a cell a spreadsheet would run as a formula is taken
 * off first (lib/users-csv.ts).
 */
function fromCsv (record: Record<string, string>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const [key, cell] of Object.entries(record)) {
    if (cell === '') continue
    const value = unguardCell(cell)
    if (key === 'groups') {
      if (value.trim().startsWith('[')) {
        try { out.groups = JSON.parse(value) } catch { out.groups = value }
      } else out.groups = value.split(';').map(g => g.trim()).filter(g => g !== '')
    } else if (BOOLEAN_COLUMNS.has(key)) {
      out[key] = /^(true|1|yes)$/i.test(value) ? true : /^(false|0|no)$/i.test(value) ? false : value
    } else out[key] = value
  }
  return out
}

/** The body to send for one record, or why it cannot be sent. */
export function toCreateBody (record: unknown, userCreateProblems: (value: unknown) => string[]): { body?: Record<string, unknown>, error?: string } {
  if (record === null || typeof record !== 'object' || Array.isArray(record)) return { error: 'a row must be a JSON object' }
  // A row's names become keys of the body built here: __proto__ would replace its prototype.
  const forbidden = prototypeNameIn(record)
  if (forbidden !== undefined) return { error: `${forbidden}: no user field has this name (__proto__, constructor and prototype are refused)` }
  const body: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(record)) {
    if (SERVER_FIELDS.has(key)) continue
    body[key] = value
  }
  // The UserCreate schema judges the rest; the password fields are checked here, as the import operation checks them.
  const { password, password_hash: passwordHash, ...rest } = body
  const problems = userCreateProblems(rest)
  if (password !== undefined && passwordHash !== undefined) problems.push('give password or password_hash, not both')
  if (password !== undefined && (typeof password !== 'string' || password.length < 1 || password.length > 1024)) {
    problems.push('/password: must be a string of 1 to 1024 characters')
  }
  if (passwordHash !== undefined) {
    if (typeof passwordHash !== 'string') problems.push('/password_hash: must be a string')
    else {
      const checked = checkImportedHash(passwordHash)
      if (!checked.ok) problems.push(`/password_hash: ${checked.detail} (${checked.code})`)
    }
  }
  return problems.length > 0 ? { error: problems.join('; ') } : { body }
}

/** What the import operation answers, with 200 or (atomic, nothing created) 422. */
interface ImportReport {
  results: Array<{ index: number, status: 'created' | 'error' | 'not_created', id?: string, code?: string, detail?: string }>
}

/**
 * POST /api/users/import. Unlike ApiClient.request, a 422 `import_failed`
 * is not an error here: its body carries the per-item report.
 */
async function postImport (client: ApiClient, users: Array<Record<string, unknown>>, atomic: boolean): Promise<ImportReport & { applied: boolean }> {
  let response: Response
  try {
    response = await fetch(`${client.baseUrl}/api/users/import`, {
      method: 'POST',
      headers: { 'x-api-key': process.env.GATEHOUSE_API_KEY ?? '', 'content-type': 'application/json', accept: 'application/json, application/problem+json' },
      body: JSON.stringify({ users, atomic })
    })
  } catch (error) {
    const cause = (error as { cause?: { code?: string, message?: string } }).cause
    throw new CliError(`cannot reach ${client.baseUrl}: ${cause?.code ?? cause?.message ?? (error as Error).message}`)
  }
  const text = await response.text()
  let body: (ImportReport & { code?: string, detail?: string }) | undefined
  try {
    body = text !== '' ? JSON.parse(text) : undefined
  } catch {
    throw new CliError(`POST ${client.baseUrl}/api/users/import answered ${response.status} with malformed JSON`)
  }
  if (response.ok && body !== undefined) return { ...body, applied: true }
  if (response.status === 422 && body?.code === 'import_failed' && Array.isArray(body.results)) return { ...body, applied: false }
  throw new ApiError(response.status, body, response.statusText, client.baseUrl)
}

/** Rows per request: at most what one import request takes, and a body well inside its 4 MiB limit. */
const BATCH_ROWS = 1000
const BATCH_BYTES = 3 * 1024 * 1024

function * batches (rows: ImportRow[], maxRows: number): Generator<ImportRow[]> {
  let batch: ImportRow[] = []
  let bytes = 0
  for (const row of rows) {
    const size = JSON.stringify(row.body).length + 1
    if (batch.length > 0 && (batch.length >= maxRows || bytes + size > BATCH_BYTES)) {
      yield batch
      batch = []
      bytes = 0
    }
    batch.push(row)
    bytes += size
  }
  if (batch.length > 0) yield batch
}

function batchSize (value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > BATCH_ROWS) throw new UsageError(`--batch-size takes a whole number from 1 to ${BATCH_ROWS}`)
  return Number(value)
}

function formatOf (file: string, given: string | undefined): 'csv' | 'jsonl' {
  if (given !== undefined) {
    if (given !== 'csv' && given !== 'jsonl') throw new UsageError('--format takes csv or jsonl')
    return given
  }
  if (/\.csv$/i.test(file)) return 'csv'
  if (/\.(jsonl|ndjson)$/i.test(file)) return 'jsonl'
  throw new UsageError('cannot tell the format from the file name; pass --format csv or --format jsonl')
}

/**
 * One status line on stderr, on a terminal only (piped, stderr stays quiet):
 * drawn as soon as a phase starts, then again every second, so a slow batch
 * never looks like a hang, and on each change at most ten times a second.
 */
class Progress {
  readonly #out = process.stderr
  readonly #enabled = process.stderr.isTTY === true
  #render: () => string = () => ''
  #timer: NodeJS.Timeout | undefined
  #drawn = 0

  /** What the line says from now on; `render` runs at each drawing, so counts and rates are current. */
  show (render: () => string): void {
    if (!this.#enabled) return
    this.#render = render
    this.#draw()
    this.#timer ??= setInterval(() => { this.#draw() }, 1000).unref()
  }

  changed (): void {
    if (this.#enabled && Date.now() - this.#drawn >= 100) this.#draw()
  }

  /** The line as it ends, kept on screen; the report follows on a line of its own. */
  end (): void {
    clearInterval(this.#timer)
    this.#timer = undefined
    if (this.#drawn === 0) return
    this.#draw()
    this.#out.write('\n')
    this.#drawn = 0
  }

  #draw (): void {
    this.#drawn = Date.now()
    // \r back to the start of the line; ESC [K clears what a longer earlier text left.
    this.#out.write(`\r${this.#render()}\u001b[K`)
  }
}

/** `importing [######........] 2000/10000 rows, 850 rows/s, 3 s`: rate and time since the first batch was sent. */
function importLine (done: number, total: number, startedAt: number): string {
  const seconds = (Date.now() - startedAt) / 1000
  const width = 20
  const filled = total === 0 ? width : Math.round(width * done / total)
  const rate = seconds > 0 ? Math.round(done / seconds) : 0
  return `importing [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total} rows, ${rate} rows/s, ${Math.floor(seconds)} s`
}

async function writeText (out: Writable, text: string): Promise<void> {
  if (!out.write(text)) await once(out, 'drain')
}

function exportFormatOf (output: string | undefined, given: string | undefined): 'csv' | 'jsonl' {
  if (given !== undefined) {
    if (given !== 'csv' && given !== 'jsonl') throw new UsageError('--format takes csv or jsonl')
    return given
  }
  return output !== undefined && /\.csv$/i.test(output) ? 'csv' : 'jsonl'
}

export function registerTransfer (users: Command): void {
  addFilterOptions(users.command('export').description('write users as JSON Lines (one user per line) or CSV, read a page at a time; both import again'))
    .option('--format <format>', 'jsonl or csv (default: csv for an --output file ending in .csv, else jsonl)')
    .option('--output <file>', 'write to this file instead of standard output')
    .action(async (options: FilterOptions & { output?: string, format?: string }) => {
      const format = exportFormatOf(options.output, options.format)
      const client = ApiClient.fromEnv()
      const query = filterQuery(options)
      const out: Writable = options.output !== undefined ? createWriteStream(options.output, { flags: 'wx', mode: 0o600 }) : process.stdout
      if (options.output !== undefined) await once(out, 'open').catch((error: Error) => { throw new CliError(`cannot write ${options.output}: ${error.message}`) })
      let count = 0
      if (format === 'csv') await writeText(out, userCsvHeader())
      for await (const page of client.users(query)) {
        for (const user of page) await writeText(out, format === 'csv' ? userCsvLine(user) : JSON.stringify(user) + '\n')
        count += page.length
        if (options.output !== undefined && process.stderr.isTTY === true) process.stderr.write(`\rexported ${count} users`)
      }
      if (options.output !== undefined) {
        out.end()
        await once(out, 'finish')
        process.stderr.write(`${process.stderr.isTTY === true ? '\r' : ''}exported ${count} users to ${options.output}\n`)
      }
    })

  users.command('import')
    .description('create users, with passwords or existing password hashes, from a CSV or JSON Lines file; all or nothing unless --continue-on-error')
    .argument('<file>', 'a .csv or .jsonl file, or - for standard input (then give --format)')
    .option('--format <format>', 'csv or jsonl (default: from the file name)')
    .option('--dry-run', 'check every row, against the service too, and create nothing')
    .option('--continue-on-error', 'create the valid rows even if others fail (default: any failure creates nothing)')
    .option('--batch-size <n>', `rows per request to the import operation, 1 to ${BATCH_ROWS} (default ${BATCH_ROWS})`, batchSize)
    .option('--json', 'print the per-row report as JSON')
    .action(async (file: string, options: ImportOptions) => {
      const progress = new Progress()
      try {
        await importUsers(file, options, progress)
      } finally {
        // Also when it fails: the error message gets a line of its own.
        progress.end()
      }
    })
}

interface ImportOptions { format?: string, dryRun?: boolean, continueOnError?: boolean, batchSize?: number, json?: boolean }

async function importUsers (file: string, options: ImportOptions, progress: Progress): Promise<void> {
  const format = formatOf(file, options.format)
  const client = ApiClient.fromEnv()
  const { userCreateProblems } = await import('./validate.ts')
  const input = await openInput(file)
  const rows: ImportRow[] = []
  progress.show(() => `reading ${file === '-' ? 'standard input' : file}: ${rows.length} rows`)
  try {
    for await (const { line, record, error } of format === 'csv' ? csvRows(input) : jsonLines(input)) {
      const username = record !== null && typeof record === 'object' && typeof (record as { username?: unknown }).username === 'string'
        ? (record as { username: string }).username
        : null
      const checked = error !== undefined ? { error } : toCreateBody(record, userCreateProblems)
      rows.push({ line, username, status: checked.error !== undefined ? 'failed' : 'valid', ...checked })
      progress.changed()
    }
  } catch (error) {
    if (error instanceof CliError) throw error
    const code = (error as { code?: string }).code
    if (code !== undefined && /^E[A-Z]+$/.test(code) && (error as { syscall?: string }).syscall !== undefined) throw new CliError(`cannot read ${file}: ${readProblem(error)}`)
    throw new CliError(`${file} is not valid ${format === 'csv' ? 'CSV' : 'JSON Lines'}: ${(error as Error).message}`)
  }

  // Conflicts the service would refuse: within the file, and with the users it already has.
  const existingNames = new Set<string>()
  const existingEmails = new Set<string>()
  progress.show(() => `checking ${rows.length} rows against the existing users: ${existingNames.size} read`)
  for await (const page of client.users()) {
    for (const user of page) {
      existingNames.add(user.username.toLowerCase())
      if (user.email !== null) existingEmails.add(user.email.toLowerCase())
    }
    progress.changed()
  }
  const seenNames = new Map<string, number>()
  const seenEmails = new Map<string, number>()
  for (const row of rows) {
    if (row.status !== 'valid' || row.body === undefined) continue
    const name = String(row.body.username).toLowerCase()
    const email = typeof row.body.email === 'string' ? row.body.email.toLowerCase() : undefined
    const fail = (error: string): void => { row.status = 'failed'; row.error = error }
    if (existingNames.has(name)) fail(`a user named "${String(row.body.username)}" already exists`)
    else if (seenNames.has(name)) fail(`the username repeats line ${seenNames.get(name)!}`)
    else if (email !== undefined && existingEmails.has(email)) fail(`another user has the email ${String(row.body.email)}`)
    else if (email !== undefined && seenEmails.has(email)) fail(`the email repeats line ${seenEmails.get(email)!}`)
    seenNames.set(name, seenNames.get(name) ?? row.line)
    if (email !== undefined) seenEmails.set(email, seenEmails.get(email) ?? row.line)
  }

  const invalid = rows.filter(r => r.status === 'failed').length
  let rolledBack = 0
  let aborted = false
  if (options.dryRun !== true && (invalid === 0 || options.continueOnError === true)) {
    const pending = rows.filter(r => r.status === 'valid')
    const atomic = options.continueOnError !== true
    let done = 0
    const startedAt = Date.now()
    progress.show(() => importLine(done, pending.length, startedAt))
    for (const batch of batches(pending, options.batchSize ?? BATCH_ROWS)) {
      if (aborted) break
      try {
        const report = await postImport(client, batch.map(r => r.body!), atomic)
        for (const result of report.results) {
          const row = batch[result.index]
          if (row === undefined) continue
          if (result.status === 'created' && result.id !== undefined) {
            row.status = 'created'
            row.id = result.id
          } else if (result.status === 'error') {
            row.status = 'failed'
            row.error = `${result.detail ?? 'refused'}${result.code !== undefined ? ` (${result.code})` : ''}`
          }
        }
        if (!report.applied) aborted = true
      } catch (error) {
        if (!(error instanceof ApiError)) throw error
        // The service refused the whole batch (no admin scope, busy, a conflict with a concurrent change): every row of it failed.
        for (const row of batch) {
          row.status = 'failed'
          row.error = error.message
        }
        if (atomic) aborted = true
      }
      done += batch.length
      progress.changed()
    }
    if (aborted) {
    // All or nothing: what earlier batches of this run created is deleted again.
      const limit = pLimit(IN_FLIGHT)
      const undo = rows.filter(r => r.status === 'created')
      progress.show(() => `deleting again what this import created: ${rolledBack} of ${undo.length} users`)
      await Promise.all(undo.map(async row => await limit(async () => {
        try {
          await client.request('DELETE', `/api/users/${row.id!}`)
          row.status = 'rolled_back'
          rolledBack += 1
          progress.changed()
        } catch (error) {
          row.error = `created, and could not be deleted again: ${(error as Error).message}`
        }
      })))
    }
  }
  progress.end()
  for (const row of rows) {
    if (row.status === 'valid' && options.dryRun !== true) row.status = 'not_attempted'
    delete row.body
  }

  const failed = rows.filter(r => r.status === 'failed')
  const created = rows.filter(r => r.status === 'created').length
  if (options.json === true) {
    printJson({ dry_run: options.dryRun === true, rows_read: rows.length, created, failed: failed.length, rolled_back: rolledBack, rows })
  } else {
    for (const row of failed) printLine(`line ${row.line}${row.username !== null ? ` (${row.username})` : ''}: ${row.error ?? ''}`)
    const leftover = rows.filter(r => r.status === 'created' && aborted)
    for (const row of leftover) printLine(`line ${row.line} (${row.username ?? ''}): ${row.error ?? ''}`)
    if (options.dryRun === true) {
      printLine(`Dry run: ${rows.length - failed.length} of ${rows.length} rows would be created${failed.length > 0 ? `, ${failed.length} have problems` : ''}; nothing was changed`)
    } else if (failed.length > 0 && options.continueOnError !== true) {
      printLine(`Nothing was imported: ${failed.length} of ${rows.length} rows failed${rolledBack > 0 ? ` (the ${rolledBack} users created before the failure were deleted again)` : ''}. ` +
      'Fix them, or pass --continue-on-error to import the others.')
    } else {
      printLine(`Created ${created} of ${rows.length} users${failed.length > 0 ? `; ${failed.length} rows failed` : ''}`)
    }
  }
  if (failed.length > 0) process.exitCode = 1
}
