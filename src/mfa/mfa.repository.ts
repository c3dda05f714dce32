import { sql } from 'kysely'
import type { Db, SignInMethod } from '../db/database.ts'

// ---------------------------------------------------------------------------
// TOTP

export async function findTotp (db: Db, userId: string) {
  return await db.selectFrom('totp_factors').selectAll().where('user_id', '=', userId).executeTakeFirst()
}

/** A new secret awaiting its first code, replacing an earlier unconfirmed one; false when one is confirmed already. */
export async function putPendingTotp (db: Db, userId: string, secret: string, at: string): Promise<boolean> {
  const result = await db.insertInto('totp_factors')
    .values({ user_id: userId, secret, confirmed_at: null, last_time_step: null, created_at: at })
    .onConflict(oc => oc.column('user_id').doUpdateSet({ secret, created_at: at, last_time_step: null, confirm_failures: 0 })
      .where('totp_factors.confirmed_at', 'is', null))
    .executeTakeFirst()
  return (result.numInsertedOrUpdatedRows ?? 0n) > 0n
}

/**
 * Takes a code's time step: accepted only when it is later than every step
 * accepted before, in one statement, so the same code (or an older one) is
 * refused even when two requests bring it at once. `confirm` also marks a
 * pending enrolment confirmed; otherwise only a confirmed factor accepts.
 */
export async function acceptTotpStep (db: Db, userId: string, step: number, at: string, confirm: boolean): Promise<boolean> {
  const row = await db.updateTable('totp_factors')
    .set({ last_time_step: step, ...(confirm ? { confirmed_at: at } : {}) })
    .where('user_id', '=', userId)
    .where(eb => eb.or([eb('last_time_step', 'is', null), eb('last_time_step', '<', step)]))
    .where('confirmed_at', confirm ? 'is' : 'is not', null)
    .returning('user_id')
    .executeTakeFirst()
  return row !== undefined
}

/** Counts one wrong code against a pending set-up; its new count, or undefined when none is pending. */
export async function countTotpConfirmFailure (db: Db, userId: string): Promise<number | undefined> {
  const row = await db.updateTable('totp_factors')
    .set(eb => ({ confirm_failures: eb('confirm_failures', '+', 1) }))
    .where('user_id', '=', userId).where('confirmed_at', 'is', null)
    .returning('confirm_failures')
    .executeTakeFirst()
  return row?.confirm_failures
}

/** Drops a set-up still waiting for its first code; false when none is pending. */
export async function deletePendingTotp (db: Db, userId: string): Promise<boolean> {
  const result = await db.deleteFrom('totp_factors').where('user_id', '=', userId).where('confirmed_at', 'is', null).executeTakeFirst()
  return result.numDeletedRows > 0n
}

export async function deleteTotp (db: Db, userId: string): Promise<boolean> {
  const result = await db.deleteFrom('totp_factors').where('user_id', '=', userId).executeTakeFirst()
  return result.numDeletedRows > 0n
}

// ---------------------------------------------------------------------------
// Recovery codes

export async function replaceRecoveryCodes (db: Db, userId: string, rows: Array<{ id: string, digest: string }>, at: string): Promise<void> {
  await db.deleteFrom('recovery_codes').where('user_id', '=', userId).execute()
  await db.insertInto('recovery_codes').values(rows.map(r => ({ ...r, user_id: userId, used_at: null, created_at: at }))).execute()
}

/** The user's unused codes as stored, to check a typed code against (mfa.service.ts, matchRecoveryCode). */
export async function listUnusedRecoveryCodes (db: Db, userId: string): Promise<Array<{ id: string, digest: string }>> {
  return await db.selectFrom('recovery_codes').select(['id', 'digest'])
    .where('user_id', '=', userId).where('used_at', 'is', null).execute()
}

/** Spends the unused code `id` of the user; false when it is spent already (also by a concurrent request) or gone. */
export async function spendRecoveryCode (db: Db, userId: string, id: string, at: string): Promise<boolean> {
  const row = await db.updateTable('recovery_codes').set({ used_at: at })
    .where('user_id', '=', userId).where('id', '=', id).where('used_at', 'is', null)
    .returning('id').executeTakeFirst()
  return row !== undefined
}

export async function countUnusedRecoveryCodes (db: Db, userId: string): Promise<number> {
  const row = await db.selectFrom('recovery_codes').select(eb => eb.fn.countAll<number | string>().as('n'))
    .where('user_id', '=', userId).where('used_at', 'is', null).executeTakeFirstOrThrow()
  return Number(row.n)
}

// ---------------------------------------------------------------------------
// Passkeys

export async function listPasskeys (db: Db, userId: string) {
  return await db.selectFrom('passkeys').selectAll().where('user_id', '=', userId).orderBy('created_at').orderBy('id').execute()
}

export async function findPasskeyByCredentialId (db: Db, credentialId: string) {
  return await db.selectFrom('passkeys').selectAll().where('credential_id', '=', credentialId).executeTakeFirst()
}

export async function insertPasskey (db: Db, row: {
  id: string, user_id: string, credential_id: string, public_key: string, sign_count: number, transports: string, name: string, created_at: string
}): Promise<void> {
  await db.insertInto('passkeys').values({ ...row, last_used_at: null }).execute()
}

export async function renamePasskey (db: Db, userId: string, id: string, name: string) {
  return await db.updateTable('passkeys').set({ name }).where('id', '=', id).where('user_id', '=', userId)
    .returningAll().executeTakeFirst()
}

export async function deletePasskey (db: Db, userId: string, id: string): Promise<boolean> {
  const result = await db.deleteFrom('passkeys').where('id', '=', id).where('user_id', '=', userId).executeTakeFirst()
  return result.numDeletedRows > 0n
}

/** Records a use, only if no other use moved the signature counter since this one read it. */
export async function recordPasskeyUse (db: Db, id: string, previousCount: number, newCount: number, at: string): Promise<boolean> {
  const result = await db.updateTable('passkeys').set({ sign_count: newCount, last_used_at: at })
    .where('id', '=', id).where('sign_count', '=', previousCount).executeTakeFirst()
  return result.numUpdatedRows > 0n
}

// ---------------------------------------------------------------------------
// All factors

export async function factorCounts (db: Db, userId: string): Promise<{ totp: boolean, passkeys: number }> {
  const row = await db.selectNoFrom(eb => [
    eb.selectFrom('totp_factors').select(sql<number>`1`.as('x')).where('user_id', '=', userId).where('confirmed_at', 'is not', null).as('totp'),
    eb.selectFrom('passkeys').select(eb2 => eb2.fn.countAll<number | string>().as('n')).where('user_id', '=', userId).as('passkeys')
  ]).executeTakeFirst()
  return { totp: row!.totp !== null, passkeys: Number(row!.passkeys ?? 0) }
}

/** Every factor of a user (an admin's reset); how many of each there were. */
export async function deleteAllFactors (db: Db, userId: string): Promise<{ totp: boolean, passkeys: number, recoveryCodes: number }> {
  const totp = await deleteTotp(db, userId)
  const passkeys = await db.deleteFrom('passkeys').where('user_id', '=', userId).executeTakeFirst()
  const codes = await db.deleteFrom('recovery_codes').where('user_id', '=', userId).executeTakeFirst()
  await db.updateTable('mfa_challenges').set({ used_at: new Date().toISOString() })
    .where('user_id', '=', userId).where('used_at', 'is', null).execute()
  return { totp, passkeys: Number(passkeys.numDeletedRows), recoveryCodes: Number(codes.numDeletedRows) }
}

// ---------------------------------------------------------------------------
// Challenges

export async function insertChallenge (db: Db, row: {
  id: string,
  purpose: 'sign_in' | 'register' | 'passkey',
  digest: string | null,
  user_id: string | null,
  webauthn_challenge: string | null,
  enrol: boolean,
  created_at: string,
  expires_at: string,
  sign_in_method?: SignInMethod | null,
  sign_in_provider?: string | null
}): Promise<void> {
  await db.insertInto('mfa_challenges').values({ ...row, used_at: null }).execute()
}

/** A sign-in challenge by its token's digest, if it is still open. */
export async function findOpenSignInChallenge (db: Db, digest: string, now: string) {
  return await db.selectFrom('mfa_challenges').selectAll()
    .where('digest', '=', digest).where('purpose', '=', 'sign_in')
    .where('used_at', 'is', null).where('expires_at', '>', now)
    .executeTakeFirst()
}

export async function setWebauthnChallenge (db: Db, id: string, challenge: string): Promise<void> {
  await db.updateTable('mfa_challenges').set({ webauthn_challenge: challenge }).where('id', '=', id).execute()
}

/** Closes an open challenge; false when it was closed already (by a concurrent request) or has expired. */
export async function closeChallenge (db: Db, id: string, now: string): Promise<boolean> {
  const result = await db.updateTable('mfa_challenges').set({ used_at: now })
    .where('id', '=', id).where('used_at', 'is', null).where('expires_at', '>', now).executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * Closes every open sign-in challenge of a user: a second step begun before
 * their password changed, or their sessions were ended, must not open a
 * session afterwards.
 */
export async function closeSignInChallengesOfUser (db: Db, userId: string, now: string): Promise<void> {
  await db.updateTable('mfa_challenges').set({ used_at: now })
    .where('user_id', '=', userId).where('purpose', '=', 'sign_in').where('used_at', 'is', null)
    .execute()
}

/** Closes the open WebAuthn ceremony with this challenge and returns it (once; null for anyone else). */
export async function takeWebauthnChallenge (db: Db, purpose: 'register' | 'passkey', challenge: string, userId: string | null, now: string) {
  return await db.updateTable('mfa_challenges').set({ used_at: now })
    .where('webauthn_challenge', '=', challenge).where('purpose', '=', purpose)
    .where('user_id', userId === null ? 'is' : '=', userId)
    .where('used_at', 'is', null).where('expires_at', '>', now)
    .returningAll().executeTakeFirst()
}

export async function deleteChallengesBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('mfa_challenges').where('expires_at', '<', before).executeTakeFirst()
  return Number(result.numDeletedRows)
}

export async function deleteRecoveryCodes (db: Db, userId: string): Promise<void> {
  await db.deleteFrom('recovery_codes').where('user_id', '=', userId).execute()
}

export async function findPasskeyOf (db: Db, userId: string, id: string): Promise<{ id: string } | undefined> {
  return await db.selectFrom('passkeys').select('id').where('id', '=', id).where('user_id', '=', userId).executeTakeFirst()
}

/** The user a passkey's credential id belongs to, with what a sign-in checks first. */
export async function findPasskeyOwner (db: Db, credentialId: string) {
  return await db.selectFrom('passkeys').innerJoin('users', 'users.id', 'passkeys.user_id')
    .select(['users.id', 'users.disabled', 'users.locked_until'])
    .where('passkeys.credential_id', '=', credentialId).executeTakeFirst()
}
