import type { Db } from '../db/database.ts'
import { executePrepared } from '../db/prepared.ts'

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
}

export async function insertSession (db: Db, row: NewSessionRow): Promise<void> {
  await db.insertInto('sessions').values(row).execute()
}

/** The session check on every cookie or session-token request: one indexed lookup with the user's state. */
export async function findSessionByDigest (db: Db, digest: string) {
  const [row] = await executePrepared(db, 'session_by_digest', param => db.selectFrom('sessions')
    .innerJoin('users', 'users.id', 'sessions.user_id')
    .select([
      'sessions.id', 'sessions.user_id', 'sessions.last_seen_at', 'sessions.expires_at', 'sessions.ended_at',
      'users.username', 'users.role', 'users.groups', 'users.disabled'
    ])
    .where('sessions.digest', '=', param('digest')), { digest })
  return row
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
