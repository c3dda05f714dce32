import { realpathSync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import { Command, CommanderError } from 'commander'
import { CliError } from './output.ts'
import { DEFAULT_URL } from './http.ts'
import { registerLocal } from './local.ts'
import { registerUsers } from './users.ts'
import { registerGroups } from './groups.ts'
import { registerKeys } from './keys.ts'
import { registerWebhooks } from './webhooks.ts'
import { registerDbUser } from './db-user.ts'
import { registerBackup } from './backup.ts'
import { registerMail } from './mail.ts'
import { RELEASE } from '../system/release.ts'

/** Exit codes: 0 done, 1 it failed, 2 it was called wrongly (unknown option, missing setting, bad value). */
export const EXIT_OK = 0
export const EXIT_FAILURE = 1
export const EXIT_USAGE = 2

export function buildProgram (): Command {
  const program = new Command('gatehouse')
    .description('Administer gatehouse, the Auth API: run it, migrate it, manage its users and API keys, and the optional database user.')
    .version(RELEASE, '-V, --version', 'print the release of this gatehouse')
    .addHelpText('after', `
Environment:
  GATEHOUSE_URL         the running service, for users, groups, API keys and webhooks (default ${DEFAULT_URL})
  GATEHOUSE_API_KEY     an admin API key, sent as X-API-Key (never on the command line)
  DATABASE_URL          the service's own database, for serve, migrate, admin create, backup, restore,
                        keys status and keys re-encrypt
  MFA_ENCRYPTION_KEY    the key ring, for keys status and keys re-encrypt (and serve)
  SERVICE_DATABASE_URL  the PostgreSQL database of db-user and --db-user
  SMTP_URL, MAIL_FROM   outgoing mail, for mail test (and serve)
  COLUMNS               the width tables fit (default: the terminal's; piped, as wide as the values)

Exit codes: 0 done, 1 failed, 2 wrong usage. Details: docs/cli.md`)
    .showHelpAfterError('(add --help for usage)')
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(text) })
  registerLocal(program)
  registerBackup(program)
  registerUsers(program)
  registerGroups(program)
  registerKeys(program)
  registerWebhooks(program)
  registerDbUser(program)
  registerMail(program)
  return program
}

export async function main (argv: string[]): Promise<number> {
  // `gatehouse users export | head` closes the pipe early: that ends the command, quietly.
  process.stdout.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code === 'EPIPE') process.exit(EXIT_OK)
    throw error
  })
  const program = buildProgram()
  try {
    await program.parseAsync(argv, { from: 'user' })
    return typeof process.exitCode === 'number' ? process.exitCode : EXIT_OK
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.code === 'commander.helpDisplayed' || error.code === 'commander.version') return EXIT_OK
      // Help shown because no command was given, or any parsing error: the call was wrong.
      return EXIT_USAGE
    }
    if (error instanceof CliError) {
      process.stderr.write(`gatehouse: ${error.message}\n`)
      return error.exitCode
    }
    process.stderr.write(`gatehouse: unexpected error: ${(error as Error).stack ?? String(error)}\n`)
    return EXIT_FAILURE
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  // main() answers every error with a code.
  main(process.argv.slice(2)).then(code => {
    // `serve` keeps running; every other command ends here with its code.
    if (process.argv[2] !== 'serve' || code !== EXIT_OK) {
      process.exitCode = code
    }
  })
}
