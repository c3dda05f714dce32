import { sql, type Selectable } from 'kysely'
import { isPostgres, type Db, type MailOutboxTable } from '../db/database.ts'

export type MailRow = Selectable<MailOutboxTable>

export interface NewMailRow {
  id: string
  user_id: string | null
  template: string
  payload: string
  created_at: string
}

/** One pending message, due at once; in the caller's transaction. */
export async function insertMail (trx: Db, row: NewMailRow): Promise<void> {
  await trx.insertInto('mail_outbox').values({
    ...row, status: 'pending', attempts: 0, next_attempt_at: row.created_at
  }).execute()
}

/**
 * Claims up to `limit` due messages for `leaseUntil`, as claimDeliveries does
 * for webhooks: on PostgreSQL FOR UPDATE SKIP LOCKED, so instances claiming at
 * once take disjoint rows without waiting; SQLite runs one writer at a time.
 * A crashed worker's claim runs out and the message is taken again.
 */
export async function claimMails (db: Db, options: { now: string, leaseUntil: string, token: string, limit: number }): Promise<MailRow[]> {
  const { now, leaseUntil, token, limit } = options
  if (isPostgres(db)) {
    const result = await sql<MailRow>`
      update mail_outbox m set locked_until = ${leaseUntil}, lock_token = ${token}
      from (
        select id from mail_outbox
        where status = 'pending' and next_attempt_at <= ${now} and (locked_until is null or locked_until <= ${now})
        order by next_attempt_at
        limit ${limit}
        for update skip locked
      ) c
      where m.id = c.id
      returning m.*`.execute(db)
    return result.rows
  }
  const result = await sql<MailRow>`
    update mail_outbox set locked_until = ${leaseUntil}, lock_token = ${token}
    where id in (
      select id from mail_outbox
      where status = 'pending' and next_attempt_at <= ${now} and (locked_until is null or locked_until <= ${now})
      order by next_attempt_at
      limit ${limit}
    )
    returning *`.execute(db)
  return result.rows
}

export interface MailOutcome {
  status: 'pending' | 'sent' | 'failed'
  at: string
  nextAttemptAt: string
  error: string | null
}

/**
 * Records an attempt and releases the claim, if the claim is still ours;
 * false when it is not (the lease ran out and another worker took the row).
 * A message sent or given up loses its payload: the link it carried is no
 * longer kept anywhere, sealed or not.
 */
export async function completeMail (trx: Db, id: string, token: string, outcome: MailOutcome): Promise<boolean> {
  const finished = outcome.status !== 'pending'
  const updated = await trx.updateTable('mail_outbox')
    .set({
      status: outcome.status,
      attempts: sql`attempts + 1`,
      next_attempt_at: outcome.nextAttemptAt,
      locked_until: null,
      lock_token: null,
      last_error: outcome.error,
      ...(finished ? { payload: null, finished_at: outcome.at } : {})
    })
    .where('id', '=', id).where('lock_token', '=', token)
    .executeTakeFirst()
  return Number(updated.numUpdatedRows) > 0
}

/**
 * Turns a claimed request row (mail.outbox.ts, enqueueMailRequest) into the
 * message it resolved to, keeping the claim (for `leaseUntil`) so the worker
 * that resolved it sends it next; false when the claim is no longer ours.
 */
export async function turnRequestIntoMail (trx: Db, id: string, token: string, mail: { template: string, userId: string | null, payload: string, leaseUntil: string }): Promise<boolean> {
  const updated = await trx.updateTable('mail_outbox')
    .set({ template: mail.template, user_id: mail.userId, payload: mail.payload, locked_until: mail.leaseUntil })
    .where('id', '=', id).where('lock_token', '=', token).where('status', '=', 'pending')
    .executeTakeFirst()
  return Number(updated.numUpdatedRows) > 0
}

/** Removes a claimed request row that resolved to no message; false when the claim is no longer ours. */
export async function deleteClaimedRequest (trx: Db, id: string, token: string): Promise<boolean> {
  const deleted = await trx.deleteFrom('mail_outbox').where('id', '=', id).where('lock_token', '=', token).where('status', '=', 'pending').executeTakeFirst()
  return Number(deleted.numDeletedRows) > 0
}

export async function findMail (db: Db, id: string): Promise<MailRow | undefined> {
  return await db.selectFrom('mail_outbox').selectAll().where('id', '=', id).executeTakeFirst()
}

/** For /metrics: messages waiting and given up, across all instances. */
export async function countMailsByStatus (db: Db): Promise<{ pending: number, failed: number }> {
  const count = async (status: 'pending' | 'failed'): Promise<number> => Number((await db.selectFrom('mail_outbox')
    .select(db.fn.countAll<string | number>().as('n')).where('status', '=', status).executeTakeFirstOrThrow()).n)
  const [pending, failed] = await Promise.all([count('pending'), count('failed')])
  return { pending, failed }
}

/** Forgets messages sent or given up before `before`; pending ones are never removed. */
export async function deleteFinishedMailBefore (db: Db, before: string): Promise<number> {
  const result = await db.deleteFrom('mail_outbox').where('status', 'in', ['sent', 'failed']).where('finished_at', '<', before).executeTakeFirst()
  return Number(result.numDeletedRows)
}

/** Whom a notice about a user goes to, read in the transaction that records the event. */
export async function findMailRecipient (db: Db, userId: string): Promise<{ username: string, email: string | null } | undefined> {
  return await db.selectFrom('users').select(['username', 'email']).where('id', '=', userId).executeTakeFirst()
}

/** Where a session was opened from, for a notice of a sign-in. */
export async function findSessionOrigin (db: Db, sessionId: string): Promise<{ client_ip: string | null, user_agent: string | null } | undefined> {
  return await db.selectFrom('sessions').select(['client_ip', 'user_agent']).where('id', '=', sessionId).executeTakeFirst()
}

/** What the console's mail banner is made of: across all instances, from the outbox itself. */
export interface MailBacklog {
  /** Messages waiting to be sent (or resolved). */
  pending: number
  /** When the oldest of them was queued; null when none waits. */
  oldestPendingAt: Date | string | null
  /** The error of the message waiting longest for a retry after a failed attempt; null when no waiting message has failed. */
  lastError: string | null
}

export async function findMailBacklog (db: Db): Promise<MailBacklog> {
  const waiting = await db.selectFrom('mail_outbox')
    .select([db.fn.countAll<string | number>().as('n'), db.fn.min('created_at').as('oldest')])
    .where('status', '=', 'pending').executeTakeFirstOrThrow()
  const failing = await db.selectFrom('mail_outbox').select('last_error')
    .where('status', '=', 'pending').where('last_error', 'is not', null)
    .orderBy('next_attempt_at', 'desc').limit(1).executeTakeFirst()
  return { pending: Number(waiting.n), oldestPendingAt: (waiting.oldest as Date | string | null) ?? null, lastError: failing?.last_error ?? null }
}

/** How the newest invitation mail of a user fared: for the console's page of a pending user. */
export async function findInvitationMail (db: Db, userId: string): Promise<Pick<MailRow, 'status' | 'attempts' | 'last_error' | 'created_at' | 'finished_at' | 'next_attempt_at'> | undefined> {
  return await db.selectFrom('mail_outbox').select(['status', 'attempts', 'last_error', 'created_at', 'finished_at', 'next_attempt_at'])
    .where('user_id', '=', userId).where('template', '=', 'invitation')
    .orderBy('created_at', 'desc').limit(1).executeTakeFirst()
}
