import { toIso, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { findPublicUserById } from '../users/users.repository.ts'
import { deleteIdentity, listIdentitiesOfUser, type IdentityRow } from './identities.repository.ts'
import { MAX_IDENTITIES, type UserIdentity } from './oidc.schemas.ts'

function toIdentity (row: IdentityRow): UserIdentity {
  return {
    id: row.id,
    provider: row.provider,
    subject: row.subject,
    email: row.email,
    created_at: toIso(row.created_at),
    last_sign_in_at: toIso(row.last_sign_in_at)
  }
}

async function assertUser (db: Db, userId: string): Promise<void> {
  if (await findPublicUserById(db, userId) === undefined) throw new AppError('user_not_found', 404, `No user has the id ${userId}.`)
}

export async function listIdentities (db: Db, userId: string): Promise<UserIdentity[]> {
  await assertUser(db, userId)
  return (await listIdentitiesOfUser(db, userId, MAX_IDENTITIES)).map(toIdentity)
}

/** After unlinking, the next sign-in of that provider account is treated as a first one (email linking, just-in-time creation or refusal). */
export async function unlinkIdentity (db: Db, ctx: RequestContext, userId: string, identityId: string): Promise<void> {
  await db.transaction().execute(async trx => {
    const removed = await deleteIdentity(trx, userId, identityId)
    if (removed === undefined) {
      await assertUser(trx, userId)
      throw new AppError('identity_not_found', 404, `The user has no linked identity with the id ${identityId}.`)
    }
    await recordEvent(trx, ctx, 'user.identity_unlinked', { type: 'user', id: userId }, {
      identity_id: removed.id, provider: removed.provider, subject: removed.subject
    })
  })
}
