import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto'

/**
 * Secrets the server must read back (TOTP seeds) are kept encrypted with
 * AES-256-GCM under MFA_ENCRYPTION_KEY, which lives in the configuration and
 * never in the database: a dump of the database alone yields no usable seed.
 * The owner's user id is the associated data, so a ciphertext copied onto
 * another account does not decrypt. Stored as
 * `v1.<key id>.<iv>.<ciphertext>.<tag>` (base64url), where the key id (the
 * first 8 bytes of the key's SHA-256) tells a wrong key from a damaged value.
 */
const VERSION = 'v1'

export function keyId (key: Buffer): string {
  return createHash('sha256').update(key).digest().subarray(0, 8).toString('base64url')
}

export function seal (key: Buffer, plaintext: string, context: string): string {
  const iv = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, iv)
  cipher.setAAD(Buffer.from(context, 'utf8'))
  const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()])
  return [VERSION, keyId(key), iv.toString('base64url'), body.toString('base64url'), cipher.getAuthTag().toString('base64url')].join('.')
}

export class SecretBoxError extends Error {}

/** The plaintext, or a SecretBoxError when the value was sealed under another key, for another context, or altered. */
export function open (key: Buffer, sealed: string, context: string): string {
  const [version, id, iv, body, tag, ...rest] = sealed.split('.')
  if (version !== VERSION || id === undefined || iv === undefined || body === undefined || tag === undefined || rest.length > 0) {
    throw new SecretBoxError('not a sealed secret')
  }
  if (id !== keyId(key)) throw new SecretBoxError('sealed under another MFA_ENCRYPTION_KEY')
  try {
    const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url'))
    decipher.setAAD(Buffer.from(context, 'utf8'))
    decipher.setAuthTag(Buffer.from(tag, 'base64url'))
    return Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()]).toString('utf8')
  } catch {
    throw new SecretBoxError('the sealed secret does not authenticate')
  }
}
