import { createHash, type Hash } from 'node:crypto'
import { createReadStream, createWriteStream, type WriteStream } from 'node:fs'
import { open } from 'node:fs/promises'
import { once } from 'node:events'
import { createGunzip, createGzip, type Gzip } from 'node:zlib'
import type { DialectName } from '../db/database.ts'
import { TABLES_BY_NAME, type ColumnKind } from './backup-tables.ts'

/**
 * gatehouse's backup file: gzip of JSON lines, the same on both databases so
 * that a backup of either restores into either.
 *
 *   {"format":"gatehouse-backup","format_version":1,…,"tables":[{"name":…,"columns":[[name,kind],…]}]}
 *   {"table":"users"}
 *   [value, value, …]                      one line per row, in the header's column order
 *   {"end":"users","rows":N,"sha256":"…"}
 *   …                                      every table of the header, in its order
 *   {"complete":true,"header_sha256":"…","tables":{"users":{"rows":N,"sha256":"…"},…}}
 *
 * A table's checksum is SHA-256 over its rows in primary-key order, each the
 * JSON of its values with the keys of JSON values sorted: the same for the
 * same data on SQLite and on PostgreSQL (whose jsonb orders keys its own way),
 * so a restore compares what it wrote, read back, with the file.
 */
export const BACKUP_FORMAT = 'gatehouse-backup'
export const BACKUP_FORMAT_VERSION = 1

export interface BackupHeader {
  format: typeof BACKUP_FORMAT
  format_version: number
  /** The release that wrote it. */
  gatehouse: string
  dialect: DialectName
  /** The source's applied migrations, oldest first: the schema the rows fit. */
  migrations: string[]
  /** When the snapshot was taken: every write committed before is in the file. */
  snapshot_at: string
  tables: Array<{ name: string, columns: Array<[string, ColumnKind]> }>
}

export interface TableSummary { rows: number, sha256: string }
export interface BackupFooter { complete: true, header_sha256: string, tables: Record<string, TableSummary> }

/** The file is not a complete, intact backup; the message says where and why. */
export class BackupFileError extends Error {}

/** Keys of objects sorted, recursively: the checksummed form of a JSON value. */
function sortedKeys (value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortedKeys)
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {}
    for (const key of Object.keys(value).sort()) out[key] = sortedKeys((value as Record<string, unknown>)[key])
    return out
  }
  return value
}

/** The running checksum and count of one table's rows. */
export class TableDigest {
  readonly #hash: Hash = createHash('sha256')
  readonly #jsonColumns: number[]
  rows = 0

  constructor (kinds: readonly ColumnKind[]) {
    this.#jsonColumns = kinds.flatMap((kind, i) => kind === 'json' ? [i] : [])
  }

  /** `line`: the row as written in the file, when the caller has it already. */
  add (values: unknown[], line?: string): void {
    this.rows++
    if (this.#jsonColumns.length === 0) {
      this.#hash.update((line ?? JSON.stringify(values)) + '\n')
      return
    }
    const canonical = values.slice()
    for (const i of this.#jsonColumns) canonical[i] = sortedKeys(canonical[i])
    this.#hash.update(JSON.stringify(canonical) + '\n')
  }

  summary (): TableSummary {
    return { rows: this.rows, sha256: this.#hash.digest('hex') }
  }
}

/**
 * Writes a backup to `path` through a file beside it, renamed into place once
 * complete and on disk: a backup interrupted halfway never has the name asked for.
 */
export class BackupWriter {
  readonly #path: string
  readonly #partial: string
  readonly #file: WriteStream
  readonly #gzip: Gzip
  readonly #tables: Record<string, TableSummary> = {}
  #headerSha = ''
  #digest: TableDigest | undefined
  #table = ''

  private constructor (path: string, partial: string, file: WriteStream, gzip: Gzip) {
    this.#path = path
    this.#partial = partial
    this.#file = file
    this.#gzip = gzip
  }

  /** Fails if `path` exists: a backup never overwrites a file. */
  static async create (path: string): Promise<BackupWriter> {
    const partial = `${path}.partial-${process.pid}`
    const exists = await open(path, 'r').then(async h => { await h.close(); return true }, () => false)
    if (exists) throw new BackupFileError(`${path} already exists; give a new file name`)
    const file = createWriteStream(partial, { flags: 'wx', mode: 0o600 })
    await once(file, 'open')
    // The fastest level: rows repeat their shapes, and compress well even so (bench/README.md, bench:backup).
    const gzip = createGzip({ level: 1 })
    gzip.pipe(file)
    return new BackupWriter(path, partial, file, gzip)
  }

  async header (header: BackupHeader): Promise<void> {
    const line = JSON.stringify(header)
    this.#headerSha = createHash('sha256').update(line).digest('hex')
    await this.#write(line)
  }

  async startTable (name: string, kinds: ColumnKind[]): Promise<void> {
    this.#table = name
    this.#digest = new TableDigest(kinds)
    await this.#write(JSON.stringify({ table: name }))
  }

  async rows (batch: unknown[][]): Promise<void> {
    const digest = this.#digest!
    let text = ''
    for (const values of batch) {
      const line = JSON.stringify(values)
      digest.add(values, line)
      text += line + '\n'
    }
    if (!this.#gzip.write(text)) await once(this.#gzip, 'drain')
  }

  async endTable (): Promise<TableSummary> {
    const summary = this.#digest!.summary()
    this.#tables[this.#table] = summary
    await this.#write(JSON.stringify({ end: this.#table, ...summary }))
    return summary
  }

  /** Writes the footer, syncs the file and gives it its name. */
  async finish (): Promise<{ bytes: number, tables: Record<string, TableSummary> }> {
    const footer: BackupFooter = { complete: true, header_sha256: this.#headerSha, tables: this.#tables }
    this.#gzip.end(JSON.stringify(footer) + '\n')
    await once(this.#file, 'finish')
    const { rename } = await import('node:fs/promises')
    const handle = await open(this.#partial, 'r+')
    try { await handle.sync() } finally { await handle.close() }
    await rename(this.#partial, this.#path)
    return { bytes: this.#file.bytesWritten, tables: this.#tables }
  }

  /** After a failure: the partial file goes. */
  async abandon (): Promise<void> {
    this.#gzip.destroy()
    this.#file.destroy()
    const { rm } = await import('node:fs/promises')
    await rm(this.#partial, { force: true })
  }

  async #write (line: string): Promise<void> {
    if (!this.#gzip.write(line + '\n')) await once(this.#gzip, 'drain')
  }
}

/** Lines of a gzip file, with their numbers; a damaged or cut gzip stream throws. */
async function * gzipLines (path: string): AsyncGenerator<{ number: number, text: string }> {
  const handle = await open(path, 'r').catch((error: NodeJS.ErrnoException) => {
    throw new BackupFileError(`cannot read ${path}: ${error.code === 'ENOENT' ? 'no such file' : error.message}`)
  })
  const magic = Buffer.alloc(2)
  await handle.read(magic, 0, 2, 0)
  await handle.close()
  if (magic[0] !== 0x1f || magic[1] !== 0x8b) throw new BackupFileError(`${path} is not a gatehouse backup (not a gzip file)`)
  const gunzip = createGunzip()
  const source = createReadStream(path)
  source.on('error', error => gunzip.destroy(error))
  source.pipe(gunzip)
  let rest = ''
  let number = 0
  try {
    for await (const chunk of gunzip as AsyncIterable<Buffer>) {
      const text = rest + chunk.toString('utf8')
      const lines = text.split('\n')
      rest = lines.pop()!
      for (const line of lines) yield { number: ++number, text: line }
    }
  } catch (error) {
    throw new BackupFileError(`${path} is damaged or cut short after line ${number} (${(error as Error).message})`)
  }
  if (rest !== '') yield { number: ++number, text: rest }
}

export type BackupItem =
  | { type: 'header', header: BackupHeader }
  | { type: 'rows', table: string, kinds: ColumnKind[], rows: unknown[][] }
  | { type: 'end', table: string, summary: TableSummary }

const ROWS_PER_BATCH = 1000

function parseLine (path: string, number: number, text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    throw new BackupFileError(`${path}, line ${number}: not valid JSON`)
  }
}

/** Whether `value` can be a stored value of this kind (null is left to the columns' own NOT NULL). */
function fitsKind (kind: ColumnKind, value: unknown): boolean {
  if (value === null || kind === 'json') return true
  if (kind === 'bool') return typeof value === 'boolean'
  if (kind === 'int') return Number.isSafeInteger(value)
  return typeof value === 'string'
}

function checkHeader (path: string, value: unknown): BackupHeader {
  const header = value as Partial<BackupHeader> | null
  if (header === null || typeof header !== 'object' || header.format !== BACKUP_FORMAT) throw new BackupFileError(`${path} is not a gatehouse backup (no header)`)
  if (header.format_version !== BACKUP_FORMAT_VERSION) {
    throw new BackupFileError(`${path} is in backup format ${String(header.format_version)}; this gatehouse reads format ${BACKUP_FORMAT_VERSION}`)
  }
  if (!Array.isArray(header.migrations) || header.migrations.length === 0 || !Array.isArray(header.tables)) throw new BackupFileError(`${path}: the header has no migrations or tables`)
  for (const table of header.tables) {
    const known = TABLES_BY_NAME.get(table.name)
    if (known === undefined) throw new BackupFileError(`${path}: the header names a table this gatehouse does not know: ${table.name}`)
    for (const [column, kind] of table.columns) {
      if (known.columns[column] !== kind) throw new BackupFileError(`${path}: column ${table.name}.${column} is not one this gatehouse knows as ${kind}`)
    }
  }
  return header as BackupHeader
}

/**
 * Reads a backup and checks it as it goes: the header, each table's section
 * in the header's order, each row's shape, each table's count and checksum
 * at its end, and the footer. Anything wrong throws BackupFileError, so a
 * reader that acts on the rows (restore) must undo what it did on a throw.
 */
export async function * readBackup (path: string): AsyncGenerator<BackupItem, BackupFooter> {
  const lines = gzipLines(path)
  const first = await lines.next()
  if (first.done === true) throw new BackupFileError(`${path} is empty`)
  const headerLine = first.value.text
  const header = checkHeader(path, parseLine(path, 1, headerLine))
  yield { type: 'header', header }
  const done: Record<string, TableSummary> = {}
  let index = 0
  let section: { name: string, kinds: ColumnKind[], digest: TableDigest, batch: unknown[][] } | undefined
  for await (const { number, text } of lines) {
    const where = `${path}, line ${number}`
    if (section !== undefined && text.startsWith('[')) {
      const values = parseLine(path, number, text)
      if (!Array.isArray(values) || values.length !== section.kinds.length) throw new BackupFileError(`${where}: a row of ${section.name} must have ${section.kinds.length} values`)
      section.kinds.forEach((kind, i) => {
        if (!fitsKind(kind, values[i])) throw new BackupFileError(`${where}: value ${i + 1} of a row of ${section!.name} is not a ${kind}`)
      })
      section.digest.add(values, section.kinds.includes('json') ? undefined : text)
      section.batch.push(values)
      if (section.batch.length >= ROWS_PER_BATCH) {
        yield { type: 'rows', table: section.name, kinds: section.kinds, rows: section.batch }
        section.batch = []
      }
      continue
    }
    const item = parseLine(path, number, text) as Record<string, unknown> | null
    if (item === null || typeof item !== 'object') throw new BackupFileError(`${where}: unexpected line`)
    if (section === undefined && typeof item.table === 'string') {
      const expected = header.tables[index]
      if (expected?.name !== item.table) throw new BackupFileError(`${where}: table ${item.table} where the header has ${expected?.name ?? 'no more tables'}`)
      const kinds = expected.columns.map(([, kind]) => kind)
      section = { name: item.table, kinds, digest: new TableDigest(kinds), batch: [] }
    } else if (section !== undefined && item.end === section.name) {
      if (section.batch.length > 0) yield { type: 'rows', table: section.name, kinds: section.kinds, rows: section.batch }
      const summary = section.digest.summary()
      if (item.rows !== summary.rows) throw new BackupFileError(`${where}: ${section.name} should have ${String(item.rows)} rows, the file has ${summary.rows}`)
      if (item.sha256 !== summary.sha256) throw new BackupFileError(`${where}: the rows of ${section.name} do not match their checksum`)
      done[section.name] = summary
      yield { type: 'end', table: section.name, summary }
      section = undefined
      index++
    } else if (section === undefined && item.complete === true) {
      if (index !== header.tables.length) throw new BackupFileError(`${where}: the file ends before table ${header.tables[index]!.name}`)
      const footer = item as unknown as BackupFooter
      if (footer.header_sha256 !== createHash('sha256').update(headerLine).digest('hex')) throw new BackupFileError(`${path}: the header does not match its checksum`)
      for (const [name, summary] of Object.entries(done)) {
        const listed = footer.tables?.[name]
        if (listed?.rows !== summary.rows || listed.sha256 !== summary.sha256) throw new BackupFileError(`${where}: the footer disagrees with table ${name}`)
      }
      if ((await lines.next()).done !== true) throw new BackupFileError(`${path}: lines after the end of the backup`)
      return footer
    } else {
      throw new BackupFileError(`${where}: unexpected line${section !== undefined ? ` in table ${section.name}` : ''}`)
    }
  }
  throw new BackupFileError(`${path} is cut short: it ends ${section !== undefined ? `inside table ${section.name}` : 'before its footer'}`)
}
