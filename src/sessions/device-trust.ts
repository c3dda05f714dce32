import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import type { Db } from '../db/database.ts'
import { deploymentSecret } from './sessions.repository.ts'

/**
 * Device cookies (OWASP, "Slow Down Online Guessing Attacks with Device
 * Cookies"): a browser that signed in to an account gets a token, signed with a
 * key of the deployment, that names the account and when it was issued. A
 * sign-in that presents a valid one for the account it names is from a known
 * device, and an account lock, which strangers can cause by guessing, does not
 * shut it out. Nothing is stored per device; the token is only as good as its
 * signature and age.
 */
const VERSION = 'v1'

/**
 * The deployment's signing key, read (or made) on first use and kept; asked
 * for lazily so that an unreachable database at start-up only fails the
 * requests that need it, and tried again on the next one.
 */
export function deviceKeyOf (db: Db): () => Promise<Buffer> {
  let key: Promise<Buffer> | undefined
  return async () => {
    key ??= deploymentSecret(db, 'device_trust_key', () => randomBytes(32).toString('base64url'))
      .then(value => Buffer.from(value, 'base64url'))
      .catch((error: unknown) => {
        key = undefined
        throw error
      })
    return await key
  }
}

function mac (key: Buffer, userId: string, issuedAtS: number): Buffer {
  return createHmac('sha256', key).update(`${VERSION}.${userId}.${issuedAtS}`).digest()
}

export function issueDeviceToken (key: Buffer, userId: string, now: Date): string {
  const issuedAtS = Math.floor(now.getTime() / 1000)
  return `${VERSION}.${userId}.${issuedAtS}.${mac(key, userId, issuedAtS).toString('base64url')}`
}

/** Whether `token` is a device token of `userId`'s, issued less than `maxAgeMs` ago. */
export function isDeviceOf (key: Buffer, token: string | null, userId: string, maxAgeMs: number, now: Date): boolean {
  if (token === null) return false
  const [version, id, issued, signature, ...rest] = token.split('.')
  if (version !== VERSION || id !== userId || issued === undefined || signature === undefined || rest.length > 0 || !/^\d{1,12}$/.test(issued)) return false
  const issuedAtS = Number(issued)
  if (issuedAtS * 1000 + maxAgeMs <= now.getTime()) return false
  const given = Buffer.from(signature, 'base64url')
  const expected = mac(key, userId, issuedAtS)
  return given.length === expected.length && timingSafeEqual(given, expected)
}
