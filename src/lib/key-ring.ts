/**
 * MFA_ENCRYPTION_KEY as a key ring: one key, or a comma-separated list of
 * them. The first seals every new value; every listed key opens what it
 * sealed (src/lib/secret-box.ts finds it by the key id in the value), so a
 * new key can be put first while the old one stays listed
 * (docs/operations.md, Key rotation).
 */
/** 32 bytes as 64 hex digits or as base64 (`openssl rand -base64 32`); anything else is a typo, not a key. */
export function parseKey (text: string): Buffer | undefined {
  const bytes = /^[0-9a-fA-F]{64}$/.test(text) ? Buffer.from(text, 'hex') : /^[A-Za-z0-9+/_-]{43}=?$/.test(text) ? Buffer.from(text, 'base64') : undefined
  return bytes?.length === 32 ? bytes : undefined
}

/** The ring's keys, the sealing one first; `refuse`'s error, naming the position, for a malformed or repeated entry. */
export function parseKeyRing (value: string, refuse: (message: string) => Error, name = 'MFA_ENCRYPTION_KEY'): Buffer[] {
  const entries = value.split(',').map(entry => entry.trim())
  const keys: Buffer[] = []
  for (const [index, entry] of entries.entries()) {
    const where = entries.length > 1 ? `entry ${index + 1} of ${name}` : name
    if (entry === '') throw refuse(`${where} is empty; list keys separated by commas, the one that seals first`)
    const key = parseKey(entry)
    if (key === undefined) throw refuse(`${where} must be 32 bytes, as 64 hex digits or base64 (openssl rand -base64 32)`)
    if (keys.some(k => k.equals(key))) throw refuse(`${where} repeats an earlier key`)
    keys.push(key)
  }
  return keys
}

/**
 * The ring a configuration means: a configuration given as an object (a
 * test's, an embedding's) may name the sealing key alone, or a sealing key
 * and the ring apart; the ring then starts with the sealing key.
 */
export function completeKeyRing (sealing: Buffer | undefined, ring: readonly Buffer[], refuse: (message: string) => Error): Buffer[] {
  if (sealing !== undefined && sealing.length !== 32) throw refuse('MFA_ENCRYPTION_KEY must be 32 bytes')
  if (ring.some(key => key.length !== 32)) throw refuse('every key of MFA_ENCRYPTION_KEY must be 32 bytes')
  if (sealing === undefined || ring[0]?.equals(sealing) === true) return [...ring]
  return [sealing, ...ring.filter(key => !key.equals(sealing))]
}
