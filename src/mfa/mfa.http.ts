import type { FastifyRequest } from 'fastify'
import type { Config } from '../config.ts'
import { AppError } from '../errors.ts'
import type { RelyingParty } from './webauthn.ts'

/**
 * The relying party of a passkey ceremony: WEBAUTHN_RP_ID and WEBAUTHN_ORIGINS
 * when set, else the host name and origin this request reached. The browser
 * binds a passkey to its RP id and signs the origin it ran on, so a page
 * served elsewhere cannot use it whatever this answers.
 */
export function relyingParty (request: FastifyRequest, config: Pick<Config, 'webauthnRpId' | 'webauthnOrigins'>): RelyingParty {
  return {
    id: config.webauthnRpId ?? request.hostname,
    origins: config.webauthnOrigins.length > 0 ? config.webauthnOrigins : [`${request.protocol}://${request.host}`]
  }
}

/** Factors are a person's own: managed with their signed-in session, not with an API key (which could add a passkey and sign in with it). */
export function sessionUser (request: FastifyRequest): { id: string, username: string } {
  const principal = request.principal!
  if (principal.type !== 'session' || principal.user === null) {
    throw new AppError('forbidden', 403, 'Second factors are managed with a signed-in session, not an API key.')
  }
  return principal.user
}
