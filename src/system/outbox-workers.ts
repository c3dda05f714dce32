import type { Config } from '../config.ts'
import type { FastifyTypeBox } from '../lib/http.ts'
import type { MailTemplates } from '../mail/mail.templates.ts'
import { MailWorker } from '../mail/mail.worker.ts'
import { WebhookWorker } from '../webhooks/webhooks.worker.ts'
import { RELEASE } from './system.routes.ts'

/**
 * The two outboxes' senders: webhook deliveries always (they start with the
 * server when WEBHOOK_DELIVERY allows), mail when SMTP is configured (when
 * MAIL_DELIVERY allows). Each stops before the database closes, after what
 * it has in flight is recorded.
 */
export async function startOutboxWorkers (app: FastifyTypeBox, config: Config, mailTemplates: MailTemplates | undefined): Promise<{ webhooks: WebhookWorker, mail: MailWorker | undefined }> {
  const { db } = app
  const webhooks = new WebhookWorker(db, config, app.log, `gatehouse-webhooks/${RELEASE}`)
  if (config.webhookDelivery) app.addHook('onReady', async () => { webhooks.start() })
  app.addHook('preClose', async () => { await webhooks.stop() })
  const mail = mailTemplates !== undefined ? await MailWorker.create(db, config, mailTemplates, app.log) : undefined
  if (mail !== undefined && config.mailDelivery) app.addHook('onReady', async () => { mail.start() })
  if (mail !== undefined) app.addHook('preClose', async () => { await mail.stop() })
  if (mailTemplates !== undefined && mailTemplates.unused.length > 0) {
    app.log.warn({ files: mailTemplates.unused }, 'MAIL_TEMPLATES_DIR holds files that match no mail template; they are ignored (docs/email.md#templates)')
  }
  if (mail === undefined) app.log.info('no SMTP_URL: no mail is sent, and security notices are not queued (docs/email.md#without-smtp)')
  return { webhooks, mail }
}
