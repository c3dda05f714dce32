import fp from 'fastify-plugin'
import type { FastifyTypeBox } from '../lib/http.ts'
import { deleteFinishedMailBefore } from '../mail/mail.repository.ts'
import { deleteChallengesBefore } from '../mfa/mfa.repository.ts'
import { purgeIdempotencyKeys } from '../idempotency/idempotency.service.ts'
import { purgeSignInHistory } from '../sessions/sessions.service.ts'
import { deleteTokensEndedBefore } from '../tokens/tokens.repository.ts'
import { purgeWebhookHistory } from '../webhooks/webhooks.service.ts'

/** How long the outbox keeps a message sent or given up (its payload is gone already): for the event log's mail ids. */
const MAIL_RETENTION_MS = 30 * 86_400_000
const HOUR_MS = 3_600_000

/**
 * What is kept only for a while is deleted once an hour, and once at start
 * (docs/operations.md, Retention): old sessions and sign-in addresses,
 * challenges, webhook deliveries, finished mail, ended one-time tokens and
 * idempotency keys. The event log is never purged here.
 */
async function retention (app: FastifyTypeBox): Promise<void> {
  const { db, config } = app
  const purge = async (): Promise<void> => {
    try {
      const removed = await purgeSignInHistory(db, config)
      if (removed.sessions > 0 || removed.addresses > 0) app.log.info({ removed }, 'purged old sessions and sign-in addresses')
      // Sign-in and passkey challenges live minutes; an hour past their end they are of no use to anyone.
      await deleteChallengesBefore(db, new Date(Date.now() - HOUR_MS).toISOString())
      const webhookHistory = await purgeWebhookHistory(db, config)
      if (webhookHistory.deliveries > 0 || webhookHistory.attempts > 0) app.log.info({ removed: webhookHistory }, 'purged old webhook deliveries and attempts')
      const mails = await deleteFinishedMailBefore(db, new Date(Date.now() - MAIL_RETENTION_MS).toISOString())
      if (mails > 0) app.log.info({ removed: { mails } }, 'purged mail sent or given up more than 30 days ago')
      // Invitation, reset and confirmation tokens a day past their end: the event log keeps what happened.
      await deleteTokensEndedBefore(db, new Date(Date.now() - 24 * HOUR_MS).toISOString())
      const idempotencyKeys = await purgeIdempotencyKeys(db)
      if (idempotencyKeys > 0) app.log.info({ removed: { idempotencyKeys } }, 'purged idempotency keys older than a day')
    } catch (err) {
      app.log.warn({ err }, 'could not purge old sessions; will try again')
    }
  }
  // One purge at a time, none once closing begins, and the last awaited before the database closes.
  let purging: Promise<void> = Promise.resolve()
  let closing = false
  const purgeInBackground = (): void => {
    if (!closing) purging = purging.then(purge)
  }
  const purgeTimer = setInterval(purgeInBackground, HOUR_MS).unref()
  // At start as well, once the server listens: nothing waits on it, so the start does not either.
  app.addHook('onReady', async () => { setImmediate(purgeInBackground) })
  app.addHook('preClose', async () => {
    closing = true
    clearInterval(purgeTimer)
    await purging
  })
}

export default fp(retention, { name: 'gatehouse-retention' })
