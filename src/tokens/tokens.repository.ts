import { randomInt } from 'node:crypto'
import { sql } from 'kysely'
import type { AccountTokenPurpose, Db } from '../db/database.ts'
import { newId } from '../lib/ids.ts'
import { digestOf, randomSecret } from '../lib/secrets.ts'

/*
 * One-time account tokens: the secret of a mailed link (256 bits) and a short
 * code the same mail carries, to type instead of following the link. Only
 * their digests are stored: the link's SHA-256 (256 bits need no more), the
 * code's argon2id hash (token-codes.ts: about 40 bits must not fall to an
 * offline search by whoever reads the table). A token is bound to its purpose and account (and
 * an e-mail verification to the address it confirms); it is consumed by one
 * UPDATE that matches only while it is unused and unexpired, so of two
 * concurrent uses exactly one wins, on SQLite and PostgreSQL alike. Issuing a
 * token ends the account's earlier live token of that purpose.
 */

export type { AccountTokenPurpose }

/** Link secrets start with this, so one found in a log or a paste is recognisable. */
export const TOKEN_PREFIX = 'ght_'
/** Letters and digits that cannot be misread for one another (no 0/O, 1/I/L). */
const CODE_ALPHABET = 'ABCDEFGHJKMNPQRSTUVWXYZ23456789'
const CODE_LENGTH = 8
/** Wrong codes a token takes before it is ended: 5 guesses at 31^8 (about 2^40) codes. */
export const CODE_MAX_FAILURES = 5

export interface IssuedToken {
  id: string
  /** The link's secret; shown once, never stored. */
  token: string
  /** The short code, `XXXX-XXXX`; shown once, never stored. */
  code: string
  expiresAt: string
}

export interface TokenRow {
  id: string
  user_id: string
  purpose: AccountTokenPurpose
  email: string | null
  expires_at: Date | string
}

/** A fresh `XXXX-XXXX` code; token-codes.ts hashes it before the token is issued. */
export function newCode (): string {
  let code = ''
  for (let i = 0; i < CODE_LENGTH; i++) code += CODE_ALPHABET[randomInt(CODE_ALPHABET.length)]
  return `${code.slice(0, 4)}-${code.slice(4)}`
}

/** The code as typed, in its stored form: case, spaces and dashes do not matter. */
export function normaliseCode (typed: string): string {
  return typed.toUpperCase().replace(/[\s-]/g, '')
}

/** A code and its stored hash, made before the issuing transaction opens (token-codes.ts, prepareCode). */
export interface PreparedCode { code: string, codeHash: string }

/**
 * A new token for this account and purpose; the account's earlier live token
 * of the purpose ends (`replaced`), so only the newest link and code work.
 * The caller supplies the transaction that also records and mails it.
 */
export async function issueToken (db: Db, input: { userId: string, purpose: AccountTokenPurpose, email?: string | null, lifetimeMs: number, code: PreparedCode, now?: Date }): Promise<IssuedToken> {
  const now = input.now ?? new Date()
  await endLiveTokens(db, input.userId, input.purpose, 'replaced', now)
  const id = newId()
  const token = randomSecret(TOKEN_PREFIX)
  const code = input.code.code
  const expiresAt = new Date(now.getTime() + input.lifetimeMs).toISOString()
  await db.insertInto('account_tokens').values({
    id,
    user_id: input.userId,
    purpose: input.purpose,
    digest: digestOf(token),
    code_digest: input.code.codeHash,
    email: input.email ?? null,
    created_at: now.toISOString(),
    expires_at: expiresAt,
    used_at: null,
    ended_reason: null
  }).execute()
  return { id, token, code, expiresAt }
}

/** Ends the account's live tokens of a purpose (`replaced`, `revoked`); how many ended. */
export async function endLiveTokens (db: Db, userId: string, purpose: AccountTokenPurpose, reason: string, now = new Date()): Promise<number> {
  const result = await db.updateTable('account_tokens')
    .set({ used_at: now.toISOString(), ended_reason: reason })
    .where('user_id', '=', userId).where('purpose', '=', purpose).where('used_at', 'is', null)
    .executeTakeFirst()
  return Number(result.numUpdatedRows)
}

/**
 * The token this link secret names for this purpose when it ran out unused:
 * its expiry, so the page can say so. Undefined when it is live, was used,
 * replaced or revoked, or never existed (those keep one message).
 */
export async function findExpiredToken (db: Db, token: string, purpose: AccountTokenPurpose, now = new Date()): Promise<{ expires_at: Date | string } | undefined> {
  return await db.selectFrom('account_tokens').select(['expires_at'])
    .where('digest', '=', digestOf(token)).where('purpose', '=', purpose)
    .where('used_at', 'is', null).where('expires_at', '<=', now.toISOString())
    .executeTakeFirst()
}

/** The live token this link secret names for this purpose, without using it (a page shown by GET). */
export async function findLiveToken (db: Db, token: string, purpose: AccountTokenPurpose, now = new Date()): Promise<TokenRow | undefined> {
  return await db.selectFrom('account_tokens').select(['id', 'user_id', 'purpose', 'email', 'expires_at'])
    .where('digest', '=', digestOf(token)).where('purpose', '=', purpose)
    .where('used_at', 'is', null).where('expires_at', '>', now.toISOString())
    .executeTakeFirst()
}

/** The account's live token of a purpose, if any (there is at most one). */
export async function findLiveTokenOfUser (db: Db, userId: string, purpose: AccountTokenPurpose, now = new Date()): Promise<TokenRow | undefined> {
  return await db.selectFrom('account_tokens').select(['id', 'user_id', 'purpose', 'email', 'expires_at'])
    .where('user_id', '=', userId).where('purpose', '=', purpose)
    .where('used_at', 'is', null).where('expires_at', '>', now.toISOString())
    .executeTakeFirst()
}

/**
 * Uses the token this link secret names: one UPDATE that matches only an
 * unused, unexpired token of this purpose. Undefined when there is none (never
 * issued, used, ended, expired, or of another purpose); then nothing changed.
 */
export async function consumeToken (db: Db, token: string, purpose: AccountTokenPurpose, now = new Date()): Promise<TokenRow | undefined> {
  return await db.updateTable('account_tokens')
    .set({ used_at: now.toISOString(), ended_reason: 'used' })
    .where('digest', '=', digestOf(token)).where('purpose', '=', purpose)
    .where('used_at', 'is', null).where('expires_at', '>', now.toISOString())
    .returning(['id', 'user_id', 'purpose', 'email', 'expires_at'])
    .executeTakeFirst()
}

/** The account's live token of a purpose with its code's stored hash, to check a typed code against (token-codes.ts). */
export async function findLiveCodeToken (db: Db, userId: string, purpose: AccountTokenPurpose, now = new Date()): Promise<{ id: string, code_digest: string } | undefined> {
  return await db.selectFrom('account_tokens').select(['id', 'code_digest'])
    .where('user_id', '=', userId).where('purpose', '=', purpose)
    .where('used_at', 'is', null).where('expires_at', '>', now.toISOString())
    .executeTakeFirst()
}

/**
 * Settles a typed code already checked against token `tokenId`: a right one
 * uses the token (one UPDATE that matches only while it is unused, unexpired
 * and under CODE_MAX_FAILURES wrong codes, so a token ended, used or guessed
 * out since the check is not used); a wrong one counts against it, and the
 * CODE_MAX_FAILURES-th ends it (`code_attempts`): a code can be guessed only
 * a handful of times, whoever guesses and from wherever.
 */
export async function settleCodeAttempt (db: Db, tokenId: string, right: boolean, now = new Date()): Promise<TokenRow | undefined> {
  const at = now.toISOString()
  if (right) {
    return await db.updateTable('account_tokens')
      .set({ used_at: at, ended_reason: 'used' })
      .where('id', '=', tokenId).where('used_at', 'is', null).where('expires_at', '>', at)
      .where('code_failures', '<', CODE_MAX_FAILURES)
      .returning(['id', 'user_id', 'purpose', 'email', 'expires_at'])
      .executeTakeFirst()
  }
  await db.updateTable('account_tokens')
    .set({
      code_failures: sql`code_failures + 1`,
      used_at: sql`case when code_failures + 1 >= ${CODE_MAX_FAILURES} then ${at} else used_at end`,
      ended_reason: sql`case when code_failures + 1 >= ${CODE_MAX_FAILURES} then 'code_attempts' else ended_reason end`
    })
    .where('id', '=', tokenId).where('used_at', 'is', null)
    .execute()
  return undefined
}

/** Tokens a day past their end are of use to nobody; the record of what happened is in the event log. */
export async function deleteTokensEndedBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('account_tokens')
    .where(eb => eb.or([eb('expires_at', '<', before), eb('used_at', '<', before)]))
    .executeTakeFirst()
  return Number(result.numDeletedRows)
}

/** How a person shows they hold a token: the link's secret, or the account's name or address with the mailed code. */
export type TokenProof = { token: string } | { login: string, code: string }

/**
 * The account a typed login names for a code: the user whose username or
 * address it is, or for an e-mail confirmation the user whose live token was
 * sent to that address (the new address is not the account's yet).
 */
export async function findTokenHolder (db: Db, login: string, purpose: AccountTokenPurpose, now = new Date()): Promise<string | undefined> {
  const key = login.trim().toLowerCase()
  if (key === '') return undefined
  if (purpose === 'email_verification') {
    const row = await db.selectFrom('account_tokens').select('user_id')
      .where('purpose', '=', purpose).where(sql<string>`lower(email)`, '=', key)
      .where('used_at', 'is', null).where('expires_at', '>', now.toISOString())
      .executeTakeFirst()
    return row?.user_id
  }
  const rows = await db.selectFrom('users').select(['id', 'username_key'])
    .where(eb => eb.or([eb('username_key', '=', key), eb('email_key', '=', key)]))
    .execute()
  // A username match wins over someone else's address that reads the same, as at sign-in.
  return (rows.find(r => r.username_key === key) ?? rows[0])?.id
}
