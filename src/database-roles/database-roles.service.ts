import type { Db } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { AppError } from '../errors.ts'
import { findEventsByIds, recordEvent, type EventRow } from '../events/events.repository.ts'
import { DATABASE_ROLE_PRIVILEGES, roleNameProblem } from '../lib/pg-role-name.ts'
import type { DatabaseRoleChange } from './database-roles.schemas.ts'

function invalid (pointer: string, detail: string): AppError {
  return new AppError('validation_failed', 422, `The change cannot be recorded: ${pointer.slice(1)} ${detail}.`, { errors: [{ in: 'body', pointer, detail }] })
}

/**
 * Records a role change in the service's database as an event
 * (`database_role.created` or `.dropped`), with the reporting credential as
 * its actor, so that role-CLI runs are in the same audit trail as every
 * other admin action (ASVS 16.3.2). gatehouse did not make the change and
 * cannot see that database: the event says what the CLI reported once
 * PostgreSQL had confirmed it.
 */
export async function recordDatabaseRoleChange (db: Db, ctx: RequestContext, change: DatabaseRoleChange): Promise<EventRow> {
  const problem = roleNameProblem(change.role)
  if (problem !== undefined) throw invalid('/role', problem)
  if (change.action === 'created' && change.privileges?.includes('login') !== true) {
    throw invalid('/privileges', 'must list the created role\'s privileges, login among them (every database user has LOGIN)')
  }
  if (change.action === 'dropped' && change.privileges !== undefined) throw invalid('/privileges', 'is only for a created role')
  const data: Record<string, unknown> = { role: change.role, database: change.database }
  // In the order the CLI prints them, whatever order they came in.
  if (change.privileges !== undefined) data.privileges = DATABASE_ROLE_PRIVILEGES.filter(p => change.privileges!.includes(p))
  if (change.user_id !== undefined) data.user_id = change.user_id
  // The role is data: targets are gatehouse's own records. The user it belongs to, when there is one, is the target, so
  // that the user's events (`?target_id=`) show it too.
  const target = change.user_id !== undefined ? { type: 'user', id: change.user_id } : null
  const id = await db.transaction().execute(async trx =>
    await recordEvent(trx, ctx, change.action === 'created' ? 'database_role.created' : 'database_role.dropped', target, data))
  const [row] = await findEventsByIds(db, [id])
  return row!
}
