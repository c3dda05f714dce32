import type { Selectable } from 'kysely'
import type { Db, UserIdentitiesTable } from '../db/database.ts'

export type IdentityRow = Selectable<UserIdentitiesTable>

export async function findIdentity (db: Db, provider: string, subject: string): Promise<IdentityRow | undefined> {
  return await db.selectFrom('user_identities').selectAll().where('provider', '=', provider).where('subject', '=', subject).executeTakeFirst()
}

export async function findIdentityOfUser (db: Db, userId: string, provider: string): Promise<IdentityRow | undefined> {
  return await db.selectFrom('user_identities').selectAll().where('user_id', '=', userId).where('provider', '=', provider).executeTakeFirst()
}

export async function listIdentitiesOfUser (db: Db, userId: string, limit: number): Promise<IdentityRow[]> {
  return await db.selectFrom('user_identities').selectAll().where('user_id', '=', userId).orderBy('created_at').orderBy('id').limit(limit).execute()
}

export async function insertIdentity (db: Db, row: IdentityRow & { created_at: string, last_sign_in_at: string | null }): Promise<void> {
  await db.insertInto('user_identities').values(row).execute()
}

export async function touchIdentity (db: Db, id: string, email: string | null, at: string): Promise<void> {
  await db.updateTable('user_identities').set({ email, last_sign_in_at: at }).where('id', '=', id).execute()
}

export async function deleteIdentity (db: Db, userId: string, id: string): Promise<IdentityRow | undefined> {
  return await db.deleteFrom('user_identities').where('id', '=', id).where('user_id', '=', userId).returningAll().executeTakeFirst()
}
