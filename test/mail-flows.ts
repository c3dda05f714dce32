import { after } from 'node:test'
import type { Config } from '../src/config.ts'
import { SmtpTestServer } from './smtp-server.ts'

/** The public address the mailed links are built from in the flow tests. */
export const PUBLIC_URL = 'https://pipelines.example.test/auth'

/**
 * A real SMTP server for this test file, closed when the file ends. Each file
 * of the mailed flows (invitations, password reset, e-mail verification)
 * starts its own, so their inboxes never mix.
 */
export async function smtpForThisFile (): Promise<SmtpTestServer> {
  const smtp = await SmtpTestServer.start()
  after(async () => { await smtp.close() })
  return smtp
}

/** Settings that send through `server` and poll the outbox often, so a test waits for a mail for milliseconds, not seconds. */
export function mailSettings (server: SmtpTestServer): Partial<Config> {
  return {
    smtpUrl: server.url,
    smtpTrustForTests: [server.certificate],
    mailFrom: 'gatehouse@example.test',
    publicUrl: PUBLIC_URL,
    productName: 'Pipelines',
    mailPollIntervalMs: 50,
    mailRetryBaseMs: 100,
    mailTimeoutMs: 2000
  }
}

/** The `XXXX-XXXX` code a mail's text carries, or undefined. */
export function mailedCode (text: string): string | undefined {
  return /\b([A-Z0-9]{4}-[A-Z0-9]{4})\b/.exec(text)?.[1]
}
