import { createHash, timingSafeEqual } from 'node:crypto'
import type { AccountTokenPurpose, Db } from '../db/database.ts'
import type { PasswordHasher } from '../lib/passwords.ts'
import { randomSecret } from '../lib/secrets.ts'
import { consumeToken, findLiveCodeToken, findTokenHolder, newCode, normaliseCode, settleCodeAttempt, type PreparedCode, type TokenProof, type TokenRow } from './tokens.repository.ts'

/*
 * The mailed `XXXX-XXXX` code holds about 40 bits. A plain digest of so few
 * bits falls to an offline search in seconds, and whoever could read the
 * table could ask for a reset of any account and then read its code from the
 * digest. So the code is stored as an argon2id hash, salted, at the
 * deployment's password cost (OWASP ASVS 5.0, 6.5.2), which puts that search
 * at centuries of a core. Hashing and checking run on the password hasher's
 * bounded pool and never inside a transaction: on SQLite a transaction holds
 * the one connection, and a hash awaited in it would stall every request.
 */

/** A new code and its hash, made before the transaction that issues the token (issueToken). */
export async function prepareCode (hasher: PasswordHasher): Promise<PreparedCode> {
  const code = newCode()
  return { code, codeHash: await hasher.hash(normaliseCode(code)) }
}

/** What a proof comes to once its code is checked, outside a transaction; used in one (useCheckedProof). */
export type CheckedProof =
  | { kind: 'link', token: string }
  | { kind: 'code', tokenId: string, right: boolean }
  | { kind: 'none' }

const dummyHashes = new WeakMap<PasswordHasher, Promise<string>>()

/** A hash no code matches, so that a login with no live token costs what a wrong code costs and its answer says nothing more. */
async function dummyHashOf (hasher: PasswordHasher): Promise<string> {
  let made = dummyHashes.get(hasher)
  if (made === undefined) {
    made = hasher.hash(randomSecret('code_'))
    dummyHashes.set(hasher, made)
  }
  return await made
}

/** Whether `code` is the one `stored` was made from; `stored` may still be a digest from before the hashes (a token lives at most days). */
async function codeMatches (hasher: PasswordHasher, tokenId: string, stored: string, code: string): Promise<boolean> {
  if (stored.startsWith('$argon2')) return await hasher.verify(stored, normaliseCode(code))
  // Tokens issued before codes were hashed with argon2id: SHA-256 of `<token id>:<code>`, hex.
  const given = Buffer.from(createHash('sha256').update(`${tokenId}:${normaliseCode(code)}`, 'utf8').digest('hex'))
  return given.length === stored.length && timingSafeEqual(given, Buffer.from(stored))
}

/**
 * Checks a proof before the transaction that uses it: a link's secret needs
 * no check (its digest is looked up in the transaction); a code is checked
 * against the live token of the account the login names (its username, or
 * for an e-mail confirmation the address the token was sent to). A caller
 * that has already looked that account up (findTokenHolder) passes it as
 * `holderId`, so the lookup is not made twice.
 */
export async function checkTokenProof (db: Db, hasher: PasswordHasher, proof: TokenProof, purpose: AccountTokenPurpose, holderId?: string, now = new Date()): Promise<CheckedProof> {
  if ('token' in proof) return { kind: 'link', token: proof.token }
  const userId = holderId ?? await findTokenHolder(db, proof.login, purpose, now)
  const live = userId !== undefined ? await findLiveCodeToken(db, userId, purpose, now) : undefined
  if (live === undefined) {
    await hasher.verify(await dummyHashOf(hasher), normaliseCode(proof.code))
    return { kind: 'none' }
  }
  return { kind: 'code', tokenId: live.id, right: await codeMatches(hasher, live.id, live.code_digest, proof.code) }
}

/**
 * Uses a checked proof in the caller's transaction: the token it names, if
 * it is still unused and unexpired (of two concurrent uses exactly one
 * wins). Undefined when nothing was used; a wrong code has then been counted
 * against its token.
 */
export async function useCheckedProof (db: Db, checked: CheckedProof, purpose: AccountTokenPurpose, now = new Date()): Promise<TokenRow | undefined> {
  if (checked.kind === 'link') return await consumeToken(db, checked.token, purpose, now)
  if (checked.kind === 'code') return await settleCodeAttempt(db, checked.tokenId, checked.right, now)
  return undefined
}
