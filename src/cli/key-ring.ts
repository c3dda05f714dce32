import type { Command } from 'commander'
import type { Db } from '../db/database.ts'
import type { KeyIdCounts } from '../key-ring/key-ring.service.ts'
import { CliError, note, printJson, printLine, printTable, UsageError } from './output.ts'

/**
 * `gatehouse keys status` and `keys re-encrypt`: the MFA_ENCRYPTION_KEY ring
 * (docs/operations.md#key-rotation), worked on in the database of
 * DATABASE_URL directly, unlike the API-key subcommands beside them, which
 * go through a running service. Safe while the service runs: a value is
 * replaced only if it is still the one that was read.
 */
const DEFAULT_BATCH = 500

interface Ring { db: Db, ring: Buffer[], keyFile: string | undefined }

/** The database (its schema current) and the ring as a start would have it: MFA_ENCRYPTION_KEY, else on SQLite the key file a start wrote. */
async function withRing<T> (work: (ring: Ring) => Promise<T>): Promise<T> {
  const { ConfigError, loadConfig } = await import('../config.ts')
  const { KeyFileError, withEmbeddedKey } = await import('../key-ring/key-file.ts')
  let embedded
  try {
    embedded = withEmbeddedKey(loadConfig(), { generate: false })
  } catch (error) {
    if (error instanceof ConfigError || error instanceof KeyFileError) throw new UsageError(error.message)
    throw error
  }
  const { config } = embedded
  const { createDb } = await import('../db/database.ts')
  const { schemaState } = await import('../db/migrate.ts')
  const db = createDb(config)
  try {
    const { pending } = await schemaState(db, config.databaseSchema)
    if (pending.length > 0) throw new CliError(`the database is behind this release (${pending.length} migration(s) to run); run gatehouse migrate first`)
    return await work({ db, ring: config.mfaKeyRing, keyFile: embedded.file })
  } finally {
    await db.destroy()
  }
}

function roleOf (row: KeyIdCounts): string {
  switch (row.role) {
    case 'seals': return `entry ${row.position!} (seals)`
    case 'listed': return `entry ${row.position!}`
    case 'database': return 'the database\'s own mail key'
    case 'unlisted': return 'NOT LISTED'
    case 'unreadable': return 'not a sealed value'
  }
}

function printCounts (rows: KeyIdCounts[]): void {
  printTable(['key id', 'in MFA_ENCRYPTION_KEY', 'TOTP', 'OIDC', 'mail', 'total'],
    rows.map(row => [row.keyId, roleOf(row), String(row.counts.totp), String(row.counts.oidc), String(row.counts.mail), String(row.total)]))
}

const asJson = (rows: KeyIdCounts[]): object[] => rows.map(row => ({ key_id: row.keyId, role: row.role, position: row.position ?? null, ...row.counts, total: row.total }))

function keySource (ring: Ring): string {
  return ring.keyFile !== undefined ? `the key in ${ring.keyFile}` : `${ring.ring.length} key(s) of MFA_ENCRYPTION_KEY`
}

export function registerKeyRing (keys: Command): void {
  keys.command('status')
    .description('count the sealed values (TOTP secrets, OIDC client secrets, queued mail) under each MFA_ENCRYPTION_KEY key id, in the database of DATABASE_URL directly')
    .option('--json', 'print JSON')
    .action(async (options: { json?: boolean }) => {
      await withRing(async (ring) => {
        const { sealedValuesByKey, unopenable } = await import('../key-ring/key-ring.service.ts')
        const rows = await sealedValuesByKey(ring.db, ring.ring)
        const unlisted = unopenable(rows)
        if (options.json === true) printJson({ keys: asJson(rows), unopenable: unlisted.reduce((sum, row) => sum + row.total, 0) })
        else {
          printLine(`Sealed values by key id (ring: ${ring.ring.length === 0 ? 'MFA_ENCRYPTION_KEY is not set' : keySource(ring)}):`)
          printCounts(rows)
          if (unlisted.length > 0) note(`${unlisted.reduce((sum, row) => sum + row.total, 0)} value(s) are under a key MFA_ENCRYPTION_KEY does not list; they are refused when used`)
        }
      })
    })

  keys.command('re-encrypt')
    .description('move every sealed value under the first key of MFA_ENCRYPTION_KEY, in batches (one transaction each), in the database of DATABASE_URL directly; stopped, run it again and it finishes')
    .option('--batch-size <n>', `values per transaction (default ${DEFAULT_BATCH})`)
    .option('--json', 'print JSON')
    .action(async (options: { batchSize?: string, json?: boolean }) => {
      const batchSize = options.batchSize === undefined ? DEFAULT_BATCH : Number(options.batchSize)
      if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) throw new UsageError('--batch-size must be a whole number from 1 to 100000')
      await withRing(async (ring) => {
        if (ring.ring.length === 0) throw new UsageError('MFA_ENCRYPTION_KEY is not set: there is no key to re-encrypt under')
        const { describeCounts, reEncrypt, sealedValuesByKey, unopenable } = await import('../key-ring/key-ring.service.ts')
        const unlisted = unopenable(await sealedValuesByKey(ring.db, ring.ring))
        if (unlisted.length > 0) {
          throw new CliError(`refusing to re-encrypt: ${unlisted.map(row => row.role === 'unreadable' ? `${row.total} value(s) are not sealed values (${describeCounts(row.counts)})` : `${row.total} value(s) (${describeCounts(row.counts)}) are under key id ${row.keyId}, which MFA_ENCRYPTION_KEY does not list`).join('; ')}. ` +
            'List that key (after the first) and run it again; nothing was changed')
        }
        const result = await reEncrypt(ring.db, ring.ring, batchSize, progress => {
          note(`re-encrypted ${progress.moved} of ${progress.of} ${progress.place} value(s)`)
        })
        const rows = await sealedValuesByKey(ring.db, ring.ring)
        if (options.json === true) printJson({ moved: result.moved, failed: result.failed, keys: asJson(rows) })
        else {
          printLine(`Re-encrypted ${result.moved} value(s) under key id ${rows[0]!.keyId}. Values remaining under each key id:`)
          printCounts(rows)
        }
        if (result.failed.length > 0) {
          throw new CliError(`${result.failed.length} value(s) did not open with their key and were left as they are: ${result.failed.slice(0, 5).map(f => `${f.place} ${f.key} (${f.reason})`).join(', ')}${result.failed.length > 5 ? ', …' : ''}`)
        }
      })
    })
}
