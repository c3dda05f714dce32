import { createHash, randomBytes } from 'node:crypto'

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

/** `prefix` + 256 random bits in base62 (43 characters): one word to double-click and copy. */
export function randomSecret (prefix: string): string {
  let n = BigInt('0x' + randomBytes(32).toString('hex'))
  let out = ''
  while (n > 0n) {
    out = BASE62[Number(n % 62n)]! + out
    n /= 62n
  }
  return prefix + out.padStart(43, '0')
}

/** What is stored of a secret: its SHA-256, hex. A database dump holds no usable credential. */
export function digestOf (secret: string): string {
  return createHash('sha256').update(secret, 'utf8').digest('hex')
}
