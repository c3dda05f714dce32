import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Config } from '../config.ts'
import { requestContext, SESSION_COOKIE_PLAIN, SESSION_COOKIE_SECURE, sessionCookieOf } from '../auth/auth.plugin.ts'
import { type SignIn, type SignInContext } from './sessions.types.ts'

/** The device cookie (see device-trust.ts): kept long after the session, so a later sign-in is from a known device. */
export const DEVICE_COOKIE_PLAIN = 'gatehouse_device'
export const DEVICE_COOKIE_SECURE = '__Host-gatehouse_device'

/**
 * Sets the session cookie and the device cookie: `__Host-` and Secure over
 * HTTPS, HttpOnly and SameSite=Lax always.
 */
export function setSignInCookies (request: FastifyRequest, reply: FastifyReply, signedIn: SignIn, config: Pick<Config, 'sessionAbsoluteTimeoutMs' | 'loginKnownClientDays'>): void {
  const secure = request.protocol === 'https'
  const options = { path: '/', httpOnly: true, sameSite: 'lax', secure } as const
  reply.setCookie(secure ? SESSION_COOKIE_SECURE : SESSION_COOKIE_PLAIN, signedIn.token, { ...options, maxAge: Math.floor(config.sessionAbsoluteTimeoutMs / 1000) })
  if (config.loginKnownClientDays > 0) {
    reply.setCookie(secure ? DEVICE_COOKIE_SECURE : DEVICE_COOKIE_PLAIN, signedIn.deviceToken, { ...options, maxAge: config.loginKnownClientDays * 86_400 })
  }
}

export function clearSessionCookie (reply: FastifyReply): void {
  reply.clearCookie(SESSION_COOKIE_SECURE, { path: '/', httpOnly: true, sameSite: 'lax', secure: true })
  reply.clearCookie(SESSION_COOKIE_PLAIN, { path: '/', httpOnly: true, sameSite: 'lax' })
}

/**
 * The device cookie a request brings: over HTTPS only the `__Host-` one, as
 * for the session cookie (auth.plugin.ts sessionCookieOf). A plain
 * `gatehouse_device` there could have been set by another host of the site,
 * and would make a browser a known client of an account, to which its lock
 * does not apply.
 */
function deviceCookieOf (request: FastifyRequest): string | undefined {
  const cookies = request.cookies
  return request.protocol === 'https' ? cookies[DEVICE_COOKIE_SECURE] : cookies[DEVICE_COOKIE_SECURE] ?? cookies[DEVICE_COOKIE_PLAIN]
}

export function sessionContext (request: FastifyRequest): SignInContext {
  return {
    ...requestContext(request),
    userAgent: request.headers['user-agent'] ?? null,
    deviceToken: deviceCookieOf(request) ?? null,
    previousSessionToken: sessionCookieOf(request) ?? null
  }
}
