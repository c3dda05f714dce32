import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto'

/**
 * Secrets the server must read back (TOTP seeds, OIDC client secrets, mail
 * payloads) are kept encrypted with AES-256-GCM under a key that lives in the
 * configuration (MFA_ENCRYPTION_KEY, src/lib/key-ring.ts) and never in the
 * database: a dump of the database alone yields no usable secret. The owner
 * (a user id, a row id) is the associated data, so a ciphertext copied onto
 * another row does not decrypt. Stored as
 * `v1.<key id>.<iv>.<ciphertext>.<tag>` (base64url), where the key id (the
 * first 8 bytes of the key's SHA-256, never the key) says which key of a
 * ring sealed it, so a rotation can open old values and find them.
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

/** The id of the key that sealed `sealed`, or undefined when it is not a sealed value. */
export function sealedKeyId (sealed: string): string | undefined {
  const parts = sealed.split('.')
  return parts.length === 5 && parts[0] === VERSION ? parts[1] : undefined
}

/**
 * The plaintext, opened with whichever of `keys` sealed it (a ring: one key or
 * several); a SecretBoxError when none of them did, or the value was sealed for
 * another context, or altered.
 */
export function open (keys: Buffer | readonly Buffer[], sealed: string, context: string): string {
  const [version, id, iv, body, tag, ...rest] = sealed.split('.')
  if (version !== VERSION || id === undefined || iv === undefined || body === undefined || tag === undefined || rest.length > 0) {
    throw new SecretBoxError('not a sealed secret')
  }
  const key = (Buffer.isBuffer(keys) ? [keys] : keys).find(k => keyId(k) === id)
  if (key === undefined) throw new SecretBoxError(`sealed under key id ${id}, which MFA_ENCRYPTION_KEY does not list`)
  try {
    const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url'))
    decipher.setAAD(Buffer.from(context, 'utf8'))
    decipher.setAuthTag(Buffer.from(tag, 'base64url'))
    return Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()]).toString('utf8')
  } catch {
    throw new SecretBoxError('the sealed secret does not authenticate')
  }
}
