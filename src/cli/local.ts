import type { Command } from 'commander'
import type { Principal } from '../auth/principal.ts'
import type { Config } from '../config.ts'
import type { Db } from '../db/database.ts'
import type { UsersDeps } from '../users/users.service.ts'
import { CliError, printJson, printLine, UsageError } from './output.ts'
import { readPassword, type PasswordOptions } from './prompt.ts'

/** Events written by these commands name the CLI as their actor: `{"type": "system", "id": "cli"}`. */
const CLI_CONTEXT = { actorType: 'system', actorId: 'cli', requestId: null, clientIp: null } as const
const BOOTSTRAP_MARK = 'bootstrap_key_issued'

async function loadConfigOrUsage (): Promise<Config> {
  const { ConfigError, loadConfig } = await import('../config.ts')
  try {
    return loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) throw new UsageError(error.message)
    throw error
  }
}

/** The configured database, migrated (as the server would at start), for the duration of `work`. */
async function withDatabase<T> (work: (db: Db, config: Config, applied: string[]) => Promise<T>): Promise<T> {
  const config = await loadConfigOrUsage()
  const { createDb } = await import('../db/database.ts')
  const { migrateToLatest } = await import('../db/migrate.ts')
  const db = createDb(config)
  try {
    const applied = await migrateToLatest(db, config.databaseSchema)
    return await work(db, config, applied)
  } finally {
    await db.destroy()
  }
}

/** A service error (AppError) becomes its one-line detail. */
async function appErrorsAsCli<T> (work: () => Promise<T>): Promise<T> {
  const { AppError } = await import('../errors.ts')
  try {
    return await work()
  } catch (error) {
    if (error instanceof AppError) throw new CliError(error.detail)
    throw error
  }
}

export function registerLocal (program: Command): void {
  program.command('serve')
    .description('run the service, as "npm start" does (settings from the environment: docs/configuration.md)')
    .action(async () => {
      const { startServer } = await import('../server.ts')
      await startServer()
    })

  program.command('migrate')
    .description('bring the database schema of DATABASE_URL up to date')
    .option('--json', 'print JSON')
    .action(async (options: { json?: boolean }) => {
      const applied = await withDatabase(async (_db, _config, applied) => applied)
      if (options.json === true) printJson({ applied })
      else printLine(applied.length > 0 ? `Applied migrations: ${applied.join(', ')}` : 'The database is up to date; nothing to apply')
    })

  const admin = program.command('admin').description('work on the configured database directly (DATABASE_URL), without a running service')
  admin.command('create')
    .description('create an admin API key (printed once), or with --username an admin user')
    .option('--username <name>', 'create an admin user of this name instead of a key')
    .option('--email <address>', 'the admin user\'s email')
    .option('--password-stdin', 'read the admin user\'s password from standard input')
    .option('--password-prompt', 'ask for the password on the terminal (the default on a terminal)')
    .option('--name <name>', 'the key\'s name', 'gatehouse admin create')
    .option('--json', 'print JSON')
    .action(async (options: PasswordOptions & { username?: string, email?: string, name: string, json?: boolean }) => {
      if (options.username === undefined && (options.email !== undefined || options.passwordStdin === true || options.passwordPrompt === true)) {
        throw new UsageError('--email and the password options go with --username')
      }
      if (options.username === undefined) {
        // The API's rule for key names (ApiKeyCreate), which this path does not pass through.
        if (options.name.length < 1 || options.name.length > 100) throw new UsageError('--name must have 1 to 100 characters')
        const { generateApiKeySecret, insertKeyForSecret } = await import('../api-keys/api-keys.service.ts')
        const secret = generateApiKeySecret()
        const key = await withDatabase(async (db) => await db.transaction().execute(async trx => {
          const key = await insertKeyForSecret(trx, CLI_CONTEXT, secret, { name: options.name, scopes: ['admin'], userId: null, expiresAt: null })
          // A later first start then prints no key of its own.
          await trx.insertInto('gatehouse_meta').values({ key: BOOTSTRAP_MARK, value: new Date().toISOString() })
            .onConflict(oc => oc.column('key').doNothing()).execute()
          return key
        }))
        if (options.json === true) printJson({ ...key, key: secret })
        else {
          printLine(`Admin API key (shown once, store it now): ${secret}`)
          printLine(`id: ${key.id}  name: ${key.name}`)
        }
        return
      }
      const username = options.username
      const { userCreateProblems } = await import('./validate.ts')
      const problems = userCreateProblems({ username, ...(options.email !== undefined ? { email: options.email } : {}) })
      if (problems.length > 0) throw new UsageError(`invalid admin user: ${problems.join('; ')}`)
      const password = await readPassword(options, { required: true, confirm: true })
      const { createUser } = await import('../users/users.service.ts')
      const { PasswordHasher } = await import('../lib/passwords.ts')
      const { passwordPolicyOf } = await import('../lib/password-policy.ts')
      const { user } = await withDatabase(async (db, config) => await appErrorsAsCli(async () => {
        const deps: UsersDeps = { db, passwords: new PasswordHasher(config), passwordPolicy: passwordPolicyOf(config) }
        // The same stand-in admin the start-up bootstrap uses for GATEHOUSE_ADMIN_USERNAME.
        const cli: Principal = { type: 'api_key', id: 'cli', userId: null, user: null, scopes: new Set(['admin'] as const) }
        const created = await createUser(deps, cli, CLI_CONTEXT, { username, password, role: 'admin', ...(options.email !== undefined ? { email: options.email } : {}) })
        await db.insertInto('gatehouse_meta').values({ key: BOOTSTRAP_MARK, value: new Date().toISOString() })
          .onConflict(oc => oc.column('key').doNothing()).execute()
        return created
      }))
      if (options.json === true) printJson(user)
      else printLine(`Created admin user ${user.username} (${user.id})`)
    })
}
