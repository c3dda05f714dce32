import { CredentialCache, watchCredentialChanges, writesPlugin } from '../auth/credential-cache.ts'
import type { Config } from '../config.ts'
import { createDb, isPostgres, type Db } from '../db/database.ts'
import { prepareSchemaAtStart } from '../db/migrate.ts'
import type { FastifyTypeBox } from '../lib/http.ts'
import { mailKeyOf, MailPolicyPlugin } from '../mail/mail.outbox.ts'

/**
 * The database the app serves from (`given`, shared with a test or the CLI,
 * or opened from the settings and closed last of all with the app), with
 * the plugins every transaction carries, migrated at start unless told not
 * to (MIGRATE_ON_START, db/migrate.ts).
 */
export async function openDatabase (app: FastifyTypeBox, config: Config, given: Db | undefined, migrate: boolean): Promise<{ db: Db, credentials: CredentialCache }> {
  const ownDb = given ?? createDb(config)
  if (given === undefined) app.addHook('onClose', async () => { await ownDb.destroy() })
  // Checked credentials are cached briefly; every write through this handle that could end one empties the cache.
  const credentials = new CredentialCache(config.credentialCacheTtlMs, !isPostgres(ownDb))
  // Whether mail is queued, and which notices, travels on the handle into every transaction (mail/mail.outbox.ts).
  const db = ownDb.withPlugin(writesPlugin(credentials))
    .withPlugin(new MailPolicyPlugin({ sending: config.smtpUrl !== undefined, notices: new Set(config.mailNotices), sealKey: mailKeyOf(config.mfaEncryptionKey) }))
  const stopWatching = watchCredentialChanges(db, config, credentials, app.log)
  app.addHook('preClose', stopWatching)
  if (migrate) {
    try {
      await prepareSchemaAtStart(db, config.databaseSchema, { migrate: config.migrateOnStart, log: app.log })
    } catch (error) {
      // Nobody gets this app to close: what it opened goes now, or the PostgreSQL pool and the
      // credential listener's reconnecting would keep the process (a test file, the CLI) alive.
      await stopWatching()
      if (given === undefined) await ownDb.destroy().catch(() => {})
      throw error
    }
  }
  return { db, credentials }
}
