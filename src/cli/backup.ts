import type { Command } from 'commander'
import type { TableSummary } from '../backup/backup-file.ts'
import { CliError, printJson, printLine, UsageError } from './output.ts'

/** The database settings alone: a backup or restore needs nothing else of the service's configuration. */
async function databaseSettings (): Promise<{ databaseUrl: string, databaseSchema: string | undefined }> {
  const { ConfigError, loadConfig } = await import('../config.ts')
  try {
    const { databaseUrl, databaseSchema } = loadConfig()
    return { databaseUrl, databaseSchema }
  } catch (error) {
    if (error instanceof ConfigError) throw new UsageError(error.message)
    throw error
  }
}

/** What the backup code refuses (a damaged file, a database that is not empty, a newer schema) is one line, exit code 1. */
async function backupErrorsAsCli<T> (work: () => Promise<T>): Promise<T> {
  const { BackupFileError } = await import('../backup/backup-file.ts')
  const { BackupDatabaseError } = await import('../backup/backup-database.ts')
  try {
    return await work()
  } catch (error) {
    if (error instanceof BackupFileError || error instanceof BackupDatabaseError) throw new CliError(error.message)
    const { code, message } = error as { code?: string, message?: string }
    // A database that refused a row (a constraint, a type): the whole restore was rolled back.
    if (typeof code === 'string' || (error as Error).name === 'SqliteError') throw new CliError(`the database refused it: ${message ?? String(error)}`)
    throw error
  }
}

function rowsOf (tables: Record<string, TableSummary>): number {
  return Object.values(tables).reduce((sum, t) => sum + t.rows, 0)
}

function mib (bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
}

const plural = (n: number, one: string): string => `${n} ${one}${n === 1 ? '' : 's'}`

export function registerBackup (program: Command): void {
  program.command('backup')
    .description('write a consistent copy of the database of DATABASE_URL to FILE while the service runs, or with --verify check a backup file')
    .argument('<file>', 'the backup file to write (it must not exist yet), or with --verify to check')
    .option('--verify', 'check FILE instead: its structure, and every table\'s row count and checksum')
    .option('--json', 'print JSON')
    .action(async (file: string, options: { verify?: boolean, json?: boolean }) => {
      const started = Date.now()
      if (options.verify === true) {
        const { verifyBackup } = await import('../backup/backup.ts')
        const report = await backupErrorsAsCli(async () => await verifyBackup(file))
        if (options.json === true) printJson({ ok: true, ...report })
        else {
          printLine(`${file} is a complete gatehouse backup: ${plural(rowsOf(report.tables), 'row')} in ${plural(Object.keys(report.tables).length, 'table')}, every count and checksum matches`)
          printLine(`taken ${report.snapshot_at} from ${report.dialect} by gatehouse ${report.gatehouse}, schema at ${report.migration}`)
        }
        return
      }
      const settings = await databaseSettings()
      const { takeBackup } = await import('../backup/backup.ts')
      const report = await backupErrorsAsCli(async () => await takeBackup(settings, file))
      if (options.json === true) printJson({ ...report, seconds: (Date.now() - started) / 1000 })
      else printLine(`Backed up ${plural(rowsOf(report.tables), 'row')} of ${plural(Object.keys(report.tables).length, 'table')} (${report.tables.users?.rows ?? 0} users) from ${report.dialect} to ${file}: ${mib(report.bytes)} in ${((Date.now() - started) / 1000).toFixed(1)} s`)
    })

  program.command('restore')
    .description('restore a backup file into the empty database of DATABASE_URL (SQLite or PostgreSQL, whichever the backup came from)')
    .argument('<file>', 'a file written by gatehouse backup')
    .option('--force', 'replace what gatehouse keeps in a database that is not empty')
    .option('--json', 'print JSON')
    .action(async (file: string, options: { force?: boolean, json?: boolean }) => {
      const started = Date.now()
      const settings = await databaseSettings()
      const { restoreBackup } = await import('../backup/restore.ts')
      const report = await backupErrorsAsCli(async () => await restoreBackup(settings, file, { force: options.force === true }))
      if (options.json === true) printJson({ ...report, seconds: (Date.now() - started) / 1000 })
      else {
        printLine(`Restored ${plural(rowsOf(report.tables), 'row')} of ${plural(Object.keys(report.tables).length, 'table')} (${report.tables.users?.rows ?? 0} users) from ${file} into ${report.into} in ${((Date.now() - started) / 1000).toFixed(1)} s; every count and checksum matches the backup`)
        if (report.upgraded.length > 0) printLine(`Then applied migrations: ${report.upgraded.join(', ')}`)
      }
    })
}
