import type { Config } from '../config.ts'
import type { AccountTokenPurpose, Db } from '../db/database.ts'
import { publicLink } from '../lib/public-url.ts'
import { enqueueMail, isMailSending, type MailRequest } from '../mail/mail.outbox.ts'
import { issueToken, type IssuedToken, type PreparedCode } from './tokens.repository.ts'

/** The page each purpose's link opens, under the base path (account/account-pages.ts). */
export const TOKEN_PAGES: Record<AccountTokenPurpose, string> = {
  invitation: '/invitation',
  password_reset: '/reset-password',
  email_verification: '/verify-email'
}

export type LinkConfig = Pick<Config, 'publicUrl' | 'host' | 'port' | 'basePath'>

/**
 * The link a token's mail (or, without SMTP, the administrator) hands over,
 * built from PUBLIC_URL (lib/public-url.ts), never from a request's Host. The
 * token rides in the query as `token`, which the request log redacts (system/access-log.ts).
 */
export function tokenLink (config: LinkConfig, purpose: AccountTokenPurpose, token: string): string {
  return publicLink(config, TOKEN_PAGES[purpose], { token })
}

export interface TokenIssue {
  userId: string
  username: string
  purpose: AccountTokenPurpose
  /** Where the mail goes; null: nowhere to send it. */
  to: string | null
  lifetimeMs: number
  /** The token's code, hashed before the transaction (token-codes.ts, prepareCode). */
  code: PreparedCode
}

/**
 * Issues a token bound to the address `to` and returns the message that
 * carries it (template named as the purpose: the link, the code and when they
 * stop working), for a caller that writes the message itself: the mail worker
 * turning a queued request into its message (mail/mail.worker.ts).
 */
export async function issueTokenMail (trx: Db, config: LinkConfig, input: TokenIssue & { to: string }): Promise<IssuedToken & { url: string, mail: MailRequest }> {
  const issued = await issueToken(trx, { userId: input.userId, purpose: input.purpose, email: input.to, lifetimeMs: input.lifetimeMs, code: input.code })
  const url = tokenLink(config, input.purpose, issued.token)
  return { ...issued, url, mail: tokenMailOf(config, input, input.to, issued, url) }
}

function tokenMailOf (config: LinkConfig, input: TokenIssue, to: string, issued: IssuedToken, url: string): MailRequest {
  return {
    to,
    template: input.purpose,
    userId: input.userId,
    data: { username: input.username, link: url, code: issued.code, expires_at: issued.expiresAt, code_page: publicLink(config, TOKEN_PAGES[input.purpose]) }
  }
}

/**
 * Issues a token and, when this deployment sends mail and there is an
 * address, queues its mail in the caller's transaction. A mailed token is
 * bound to the address it went to. `issued.mailed` false: nothing was sent,
 * and the caller decides who gets the link.
 */
export async function issueAndMailToken (trx: Db, config: LinkConfig, input: TokenIssue): Promise<IssuedToken & { url: string, mailed: boolean }> {
  const mailing = input.to !== null && isMailSending(trx)
  const issued = await issueToken(trx, { userId: input.userId, purpose: input.purpose, email: mailing ? input.to : null, lifetimeMs: input.lifetimeMs, code: input.code })
  const url = tokenLink(config, input.purpose, issued.token)
  const mailed = mailing && await enqueueMail(trx, tokenMailOf(config, input, input.to!, issued, url))
  return { ...issued, url, mailed }
}
