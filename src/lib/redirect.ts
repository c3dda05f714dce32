import { isSameOriginPath } from '../config.ts'

/**
 * Characters a URL may carry as they are; `%` only as the start of an escape.
 * Everything else (spaces, quotes, non-ASCII such as `。` or U+202E) is
 * percent-encoded as UTF-8.
 */
const NEEDS_ESCAPE = /[^A-Za-z0-9\-._~!$&'()*+,;=:@/?#%]|%(?![0-9A-Fa-f]{2})/gu

/**
 * Where to send a browser after sign-in, from a `next` someone else may have
 * written: a path on this origin, percent-encoded, or undefined.
 *
 * A path only (`isSameOriginPath`: not `//host`, `/\host`, a scheme or control
 * characters), so it can never redirect to another site. Encoded, because a
 * `Location` header holds only Latin-1 (Node refuses anything beyond it) and
 * because a browser then reads the target as the path it is, never normalising
 * a look-alike character (`/。evil.example`) into something else. Existing
 * escapes are kept, so the result is the same however often it passes through
 * here (a form carries it back in a hidden field).
 */
export function sameOriginRedirect (next: unknown): string | undefined {
  if (typeof next !== 'string' || !isSameOriginPath(next)) return undefined
  const encoded = next.replace(NEEDS_ESCAPE, (char) => [...Buffer.from(char, 'utf8')].map(byte => `%${byte.toString(16).toUpperCase().padStart(2, '0')}`).join(''))
  return isSameOriginPath(encoded) ? encoded : undefined
}
