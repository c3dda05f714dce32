import { sql } from 'kysely'
import { isPostgres, toIso, type Db, type SignInMethod } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { closeSignInChallengesOfUser } from '../mfa/mfa.repository.ts'
import { nowIso } from '../lib/ids.ts'

export interface NewSessionRow {
  id: string
  user_id: string
  digest: string
  created_at: string
  last_seen_at: string
  expires_at: string
  ended_at: null
  client_ip: string | null
  user_agent: string | null
  /** A second factor was shown (X-Auth-MFA). */
  mfa?: boolean
  sign_in_method: SignInMethod | null
  sign_in_provider: string | null
}

const SESSION_COLUMNS = [
  'id', 'user_id', 'digest', 'created_at', 'last_seen_at', 'expires_at', 'ended_at', 'client_ip', 'user_agent', 'mfa', 'sign_in_method', 'sign_in_provider'
] as const

export async function insertSession (db: Db, row: NewSessionRow): Promise<void> {
  await db.insertInto('sessions').values(sessionValues(row)).execute()
}

/** Every column of the session, `mfa` false unless it was shown. */
function sessionValues (row: NewSessionRow): NewSessionRow {
  return Object.fromEntries(SESSION_COLUMNS.map(column => [column, column === 'mfa' ? row.mfa ?? false : row[column]])) as unknown as NewSessionRow
}

/** The session check on every cookie or session-token request: one indexed lookup with the user's state. */
export async function findSessionByDigest (db: Db, digest: string) {
  return await db.selectFrom('sessions')
    .innerJoin('users', 'users.id', 'sessions.user_id')
    .select([
      'sessions.id', 'sessions.user_id', 'sessions.last_seen_at', 'sessions.expires_at', 'sessions.ended_at', 'sessions.mfa',
      'users.username', 'users.role', 'users.groups', 'users.disabled'
    ])
    .where('sessions.digest', '=', digest)
    .executeTakeFirst()
}

/**
 * When the session's person last proved themselves: the sign-in, or a later
 * re-authentication. Read from the table on each use, never from the
 * credential cache, so a proof counts at once and an old one never lingers.
 */
export async function findSessionProof (db: Db, id: string): Promise<{ signedInAt: string, reauthenticatedAt: string | null } | undefined> {
  const row = await db.selectFrom('sessions').select(['created_at', 'reauthenticated_at'])
    .where('id', '=', id).where('ended_at', 'is', null).executeTakeFirst()
  if (row === undefined) return undefined
  return { signedInAt: toIso(row.created_at), reauthenticatedAt: toIso(row.reauthenticated_at) }
}

export async function markSessionReauthenticated (db: Db, id: string, at: string): Promise<void> {
  await db.updateTable('sessions').set({ reauthenticated_at: at }).where('id', '=', id).execute()
}

export async function touchSession (db: Db, id: string, at: string): Promise<void> {
  await db.updateTable('sessions').set({ last_seen_at: at }).where('id', '=', id).execute()
}

/** Ends one live session; false when it had already ended. */
export async function endSession (db: Db, id: string, at: string): Promise<boolean> {
  const result = await db.updateTable('sessions').set({ ended_at: at })
    .where('id', '=', id).where('ended_at', 'is', null).executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * A user's sessions that still work at `now`: not ended, not past their
 * absolute end, and used since `idleSince`. Most recently used first.
 */
export async function listLiveSessionsOfUser (db: Db, userId: string, now: string, idleSince: string, limit: number) {
  return await db.selectFrom('sessions')
    .select(['id', 'created_at', 'last_seen_at', 'expires_at', 'client_ip', 'user_agent', 'mfa', 'sign_in_method', 'sign_in_provider'])
    .where('user_id', '=', userId).where('ended_at', 'is', null)
    .where('expires_at', '>', now).where('last_seen_at', '>', idleSince)
    .orderBy('last_seen_at', 'desc').orderBy('id')
    .limit(limit)
    .execute()
}

/** Ends one live session if it is this user's; false when it is not theirs or had already ended. */
export async function endSessionOfUser (db: Db, userId: string, id: string, at: string): Promise<boolean> {
  const result = await db.updateTable('sessions').set({ ended_at: at })
    .where('id', '=', id).where('user_id', '=', userId).where('ended_at', 'is', null).executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/** Ends the live session with this token digest, if there is one; returns it for the event log. */
export async function endSessionByDigest (db: Db, digest: string, at: string): Promise<{ id: string, user_id: string } | undefined> {
  return await db.updateTable('sessions').set({ ended_at: at })
    .where('digest', '=', digest).where('ended_at', 'is', null)
    .returning(['id', 'user_id']).executeTakeFirst()
}

/** Ends every live session of a user but `exceptId`; returns their ids for the event log. */
export async function endSessionsOfUser (db: Db, userId: string, at: string, exceptId?: string): Promise<string[]> {
  const rows = await db.updateTable('sessions').set({ ended_at: at })
    .where('user_id', '=', userId).where('ended_at', 'is', null)
    .$if(exceptId !== undefined, q => q.where('id', '!=', exceptId!))
    .returning('id').execute()
  return rows.map(r => r.id)
}

/** Deletes sessions that ended, or expired, before `before`; their record stays in the event log. */
export async function deleteSessionsEndedBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('sessions')
    .where(eb => eb.or([eb('ended_at', '<', before), eb('expires_at', '<', before)]))
    .executeTakeFirst()
  return Number(result.numDeletedRows)
}

/** The users a sign-in identifier names: by folded username or folded email. */
export async function findUsersBySignInKey (db: Db, key: string) {
  return await db.selectFrom('users').selectAll()
    .where(eb => eb.or([eb('username_key', '=', key), eb('email_key', '=', key)]))
    .execute()
}

/**
 * Counts one more wrong password against an account that is not locked, in
 * one statement so concurrent failures cannot overwrite each other's count. A
 * lock that has run out starts the count afresh. Returns the new count, or
 * undefined when the account is locked (such attempts are not counted). Run it
 * in the transaction that may lock the account: the row stays locked until then.
 */
export async function countFailedSignIn (db: Db, userId: string, now: string): Promise<number | undefined> {
  const row = await db.updateTable('users')
    .set({ failed_logins: sql<number>`case when locked_until is null then failed_logins + 1 else 1 end`, locked_until: null })
    .where('id', '=', userId)
    .where(eb => eb.or([eb('locked_until', 'is', null), eb('locked_until', '<=', now)]))
    .returning('failed_logins')
    .executeTakeFirst()
  return row?.failed_logins
}

export async function lockAccount (db: Db, userId: string, until: string): Promise<void> {
  await db.updateTable('users').set({ locked_until: until }).where('id', '=', userId).execute()
}

/** Remembers that the user signed in from this address, now. */
export async function recordSignInAddress (db: Db, userId: string, clientIp: string, at: string): Promise<void> {
  await db.insertInto('sign_in_addresses')
    .values({ user_id: userId, client_ip: clientIp, last_sign_in_at: at })
    .onConflict(oc => oc.columns(['user_id', 'client_ip']).doUpdateSet({ last_sign_in_at: at }))
    .execute()
}

const SIGNED_IN_USER_COLUMNS = [
  'id', 'username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'password_sign_in', 'email_verified', 'invitation_pending',
  'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'
] as const

/**
 * A sign-in's bookkeeping on its user (`last_login_at`; the failure count and
 * lock lifted unless `liftLock` is false; a re-made hash), returning the user
 * as the answer shows them. Without a new hash only bookkeeping columns change,
 * which empty no credential cache (the writes plugin, auth/credential-cache.ts,
 * knows them); a new hash empties it.
 */
export async function recordSignInOnUser (db: Db, userId: string, at: string, change: { liftLock: boolean, rehash: string | undefined }) {
  const lift = change.liftLock ? { failed_logins: 0, locked_until: null } : {}
  const rehash = change.rehash !== undefined ? { password_hash: change.rehash } : {}
  const row = await db.updateTable('users').set({ last_login_at: at, ...lift, ...rehash })
    .where('id', '=', userId).returning(SIGNED_IN_USER_COLUMNS).executeTakeFirst()
  if (row === undefined) throw new Error(`no user ${userId} to sign in`)
  return row
}

/**
 * A sign-in's writes before its event: the user's bookkeeping (as
 * recordSignInOnUser, returning the user), the new session and, when
 * `address` is given, the address it came from (recordSignInAddress). On
 * PostgreSQL without a new hash, one statement (data-modifying CTEs): two
 * round trips fewer per sign-in, each a socket write that wakes a backend
 * and a reply the event loop parses. The user's row is updated and the
 * session inserted in the same statement, so a user deleted meanwhile fails
 * the session's foreign key and the transaction as before. Measured: the
 * main thread per sign-in, storm alone, 5 interleaved pairs at load 9 to 10,
 * median 4.67 ms before and 3.94 ms after (bench/README.md before 2 December 2026 (git history), "Issue 20: the
 * storm, fourth pass", with the command).
 */
export async function recordSignInWithSession (
  db: Db, session: NewSessionRow, change: { liftLock: boolean, rehash: string | undefined, address: string | null }
) {
  const { user_id: userId, created_at: at } = session
  if (!isPostgres(db) || change.rehash !== undefined) {
    const user = await recordSignInOnUser(db, userId, at, change)
    await insertSession(db, session)
    if (change.address !== null) await recordSignInAddress(db, userId, change.address, at)
    return user
  }
  const lift = change.liftLock ? { failed_logins: 0, locked_until: null } : {}
  const address = change.address
  const written = db
    .with('signed_in', q => q.updateTable('users').set({ last_login_at: at, ...lift }).where('id', '=', userId).returning(SIGNED_IN_USER_COLUMNS))
    .with('new_session', q => q.insertInto('sessions').values(sessionValues(session)))
  const row = await (address === null
    ? written.selectFrom('signed_in').selectAll()
    : written.with('address', q => q.insertInto('sign_in_addresses')
      .values({ user_id: userId, client_ip: address, last_sign_in_at: at })
      .onConflict(oc => oc.columns(['user_id', 'client_ip']).doUpdateSet({ last_sign_in_at: at })))
      .selectFrom('signed_in').selectAll()
  ).executeTakeFirst()
  if (row === undefined) throw new Error(`no user ${userId} to sign in`)
  return row
}

/** Whether the user signed in from this address at or after `since`. */
export async function hasSignedInFrom (db: Db, userId: string, clientIp: string, since: string): Promise<boolean> {
  const row = await db.selectFrom('sign_in_addresses').select('user_id')
    .where('user_id', '=', userId)
    .where('client_ip', '=', clientIp)
    .where('last_sign_in_at', '>=', since)
    .executeTakeFirst()
  return row !== undefined
}

/** Forgets addresses not signed in from since `before`. */
export async function deleteSignInAddressesBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('sign_in_addresses').where('last_sign_in_at', '<', before).executeTakeFirst()
  return Number(result.numDeletedRows)
}

// Moved below the repositories (db/), so that the mail outbox, which events use, can share it.
export { deploymentSecret } from '../db/deployment-secrets.ts'

/**
 * Ends a user's sessions (all, or all but the current one) with an event
 * each, and the sign-ins still waiting for their second step; used when the
 * user is disabled or deleted, when the password changes, and when an admin
 * or the user ends them all.
 */
export async function endSessionsRecorded (trx: Db, ctx: RequestContext, userId: string, reason: string, exceptId?: string): Promise<number> {
  const at = nowIso()
  // First: on PostgreSQL a second step finishing meanwhile holds its challenge's
  // row until it commits, so the sessions are ended only once its session is there.
  await closeSignInChallengesOfUser(trx, userId, at)
  const ended = await endSessionsOfUser(trx, userId, at, exceptId)
  for (const id of ended) {
    await recordEvent(trx, ctx, 'session.ended', { type: 'session', id }, { reason, user_id: userId })
  }
  return ended.length
}

/**
 * Takes the key of one account's sign-in throttle window (migration 0026):
 * true for the one caller, of every instance, that inserted it. Rows of
 * windows that have ended go first; only a window's first refusal comes here.
 */
export async function claimThrottleWindow (trx: Db, key: string, endsAt: string, now: string): Promise<boolean> {
  await trx.deleteFrom('login_throttle_windows').where('ends_at', '<', now).execute()
  const inserted = await trx.insertInto('login_throttle_windows').values({ key, ends_at: endsAt })
    .onConflict(c => c.column('key').doNothing()).executeTakeFirst()
  return Number(inserted.numInsertedOrUpdatedRows ?? 0) === 1
}
