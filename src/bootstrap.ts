import type { FastifyBaseLogger } from 'fastify'
import type { Config } from './config.ts'
import type { Db } from './db/database.ts'
import { ConfigError } from './config.ts'
import { SYSTEM_CONTEXT } from './auth/principal.ts'
import { generateApiKeySecret, insertKeyForSecret } from './api-keys/api-keys.service.ts'
import { digestOf } from './lib/secrets.ts'
import { createUser, type UsersDeps } from './users/users.service.ts'
import type { PasswordHasher } from './lib/passwords.ts'
import { passwordPolicyOf } from './lib/password-policy.ts'

const BOOTSTRAP_MARK = 'bootstrap_key_issued'
const MIN_CONFIGURED_KEY_LENGTH = 32

export interface BootstrapResult {
  /** The generated key, when one was made; the caller prints it once. */
  generatedKey?: string
}

/**
 * Makes sure a fresh deployment has a way in, without any default password:
 * a key from GATEHOUSE_ADMIN_API_KEY, an admin user from
 * GATEHOUSE_ADMIN_USERNAME/PASSWORD, or, when neither is configured and the
 * database has no admin at all, one generated key that the caller prints once.
 */
export async function bootstrap (db: Db, passwords: PasswordHasher, config: Config, log: FastifyBaseLogger): Promise<BootstrapResult> {
  await registerConfiguredAdmins(db, passwords, config, log)
  const generatedKey = await issueFirstAdminKey(db, config)
  return generatedKey === undefined ? {} : { generatedKey }
}

/** The first credentials the environment names (GATEHOUSE_ADMIN_API_KEY, GATEHOUSE_ADMIN_USERNAME/PASSWORD), if not there yet. */
export async function registerConfiguredAdmins (db: Db, passwords: PasswordHasher, config: Config, log: FastifyBaseLogger): Promise<void> {
  const ctx = SYSTEM_CONTEXT
  if (config.bootstrapAdminApiKey !== undefined) {
    const secret = config.bootstrapAdminApiKey
    if (secret.length < MIN_CONFIGURED_KEY_LENGTH) throw new ConfigError(`GATEHOUSE_ADMIN_API_KEY must have at least ${MIN_CONFIGURED_KEY_LENGTH} characters`)
    const known = async (): Promise<boolean> =>
      await db.selectFrom('api_keys').select('id').where('digest', '=', digestOf(secret)).executeTakeFirst() !== undefined
    if (!await known()) {
      try {
        await db.transaction().execute(async trx => {
          await insertKeyForSecret(trx, ctx, secret, { name: 'GATEHOUSE_ADMIN_API_KEY', scopes: ['admin'], userId: null, expiresAt: null })
          await markBootstrapped(trx)
        })
        log.info('registered GATEHOUSE_ADMIN_API_KEY as an admin API key')
      } catch (error) {
        // Instances starting at the same moment all find the key missing; the first to insert it wins.
        if (!await known()) throw error
      }
    }
  }
  if (config.bootstrapAdminUsername !== undefined && config.bootstrapAdminPassword !== undefined) {
    const username = config.bootstrapAdminUsername
    const exists = async (): Promise<boolean> =>
      await db.selectFrom('users').select('id').where('username_key', '=', username.toLowerCase()).executeTakeFirst() !== undefined
    if (!await exists()) {
      const deps: UsersDeps = { db, passwords, passwordPolicy: passwordPolicyOf(config) }
      const systemAdmin = { type: 'api_key' as const, id: 'system', userId: null, user: null, scopes: new Set(['admin'] as const) }
      try {
        await createUser(deps, systemAdmin, ctx, { username, password: config.bootstrapAdminPassword, role: 'admin' })
        await db.insertInto('gatehouse_meta').values({ key: BOOTSTRAP_MARK, value: new Date().toISOString() })
          .onConflict(oc => oc.column('key').doNothing()).execute()
        log.info({ username }, 'created the first admin user from GATEHOUSE_ADMIN_USERNAME')
      } catch (error) {
        // As for the key: another instance starting at the same moment created the user first.
        if (!await exists()) throw error
      }
    }
  }
}

/**
 * One generated admin key, when the environment names no first credential
 * and the database has no admin at all; undefined otherwise. The caller
 * prints it once, so the server calls this only once it listens: a start
 * that fails on a busy port must not use up the one key a database gets.
 */
export async function issueFirstAdminKey (db: Db, config: Config): Promise<string | undefined> {
  const ctx = SYSTEM_CONTEXT
  if (config.bootstrapAdminApiKey !== undefined || config.bootstrapAdminUsername !== undefined) return undefined

  const admins = await db.selectFrom('users').select('id').where('role', '=', 'admin').limit(1).executeTakeFirst()
  if (admins !== undefined) return undefined
  // The mark is taken in the same transaction as the key, so of several
  // instances starting on one empty database exactly one issues a key, and a
  // restart never issues another.
  const secret = generateApiKeySecret()
  const issued = await db.transaction().execute(async trx => {
    const marked = await markBootstrapped(trx)
    if (!marked) return false
    await insertKeyForSecret(trx, ctx, secret, { name: 'bootstrap', scopes: ['admin'], userId: null, expiresAt: null })
    return true
  })
  return issued ? secret : undefined
}

async function markBootstrapped (trx: Db): Promise<boolean> {
  const result = await trx.insertInto('gatehouse_meta').values({ key: BOOTSTRAP_MARK, value: new Date().toISOString() })
    .onConflict(oc => oc.column('key').doNothing()).executeTakeFirst()
  return (result.numInsertedOrUpdatedRows ?? 0n) > 0n
}
