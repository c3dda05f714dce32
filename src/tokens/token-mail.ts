import type { Config } from '../config.ts'
import type { AccountTokenPurpose } from '../db/database.ts'

/** The page each purpose's link opens, under the base path (account/account-pages.ts). */
export const TOKEN_PAGES: Record<AccountTokenPurpose, string> = {
  invitation: '/invitation',
  password_reset: '/reset-password',
  email_verification: '/verify-email'
}

export type LinkConfig = Pick<Config, 'host' | 'port' | 'basePath'>

/**
 * The link a token's mail (or, without SMTP, the administrator) hands over.
 * Built from the address the service listens on, never from a request's Host
 * header, which whoever sends the request chooses: a link built from it could
 * carry a one-time token to another site. The token rides in the query as
 * `token`, which the request log redacts (app.ts).
 */
export function tokenLink (config: LinkConfig, purpose: AccountTokenPurpose, token: string): string {
  const host = config.host === '0.0.0.0' || config.host === '::' || config.host === '' ? 'localhost' : config.host
  return `http://${host.includes(':') ? `[${host}]` : host}:${config.port}${config.basePath}${TOKEN_PAGES[purpose]}?${new URLSearchParams({ token }).toString()}`
}
