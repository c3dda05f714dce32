import type { Insertable, Selectable, Updateable } from 'kysely'
import { isPostgres, type Db, type OidcLoginsTable, type OidcProvidersTable } from '../db/database.ts'

export type ProviderRow = Selectable<OidcProvidersTable>
export type NewProviderRow = Insertable<OidcProvidersTable>
export type ProviderRowUpdate = Updateable<OidcProvidersTable>
export type LoginRow = Selectable<OidcLoginsTable>

export async function listProviderRows (db: Db, limit: number): Promise<ProviderRow[]> {
  return await db.selectFrom('oidc_providers').selectAll().orderBy('id').limit(limit).execute()
}

export async function findProviderRow (db: Db, id: string, options: { forUpdate?: boolean } = {}): Promise<ProviderRow | undefined> {
  return await db.selectFrom('oidc_providers').selectAll().where('id', '=', id)
    .$if(options.forUpdate === true && isPostgres(db), q => q.forUpdate())
    .executeTakeFirst()
}

export async function countProviderRows (db: Db): Promise<number> {
  const row = await db.selectFrom('oidc_providers').select(eb => eb.fn.countAll<number | string>().as('n')).executeTakeFirstOrThrow()
  return Number(row.n)
}

export async function insertProviderRow (db: Db, row: NewProviderRow): Promise<ProviderRow> {
  return await db.insertInto('oidc_providers').values(row).returningAll().executeTakeFirstOrThrow()
}

export async function updateProviderRow (db: Db, id: string, changes: ProviderRowUpdate): Promise<ProviderRow | undefined> {
  return await db.updateTable('oidc_providers').set(changes).where('id', '=', id).returningAll().executeTakeFirst()
}

export async function deleteProviderRow (db: Db, id: string): Promise<boolean> {
  const result = await db.deleteFrom('oidc_providers').where('id', '=', id).executeTakeFirst()
  return result.numDeletedRows > 0n
}

export async function insertLogin (db: Db, row: Insertable<OidcLoginsTable>): Promise<void> {
  await db.insertInto('oidc_logins').values(row).execute()
}

/**
 * Takes a pending sign-in by its state, at most once: the row is marked used
 * by the same statement that finds it, so two callbacks racing with one
 * state cannot both get it.
 */
export async function takeLogin (db: Db, stateDigest: string, providerId: string, now: string): Promise<LoginRow | undefined> {
  return await db.updateTable('oidc_logins')
    .set({ used_at: now })
    .where('state_digest', '=', stateDigest)
    .where('provider_id', '=', providerId)
    .where('used_at', 'is', null)
    .where('expires_at', '>', now)
    .returningAll()
    .executeTakeFirst()
}

export async function deleteLoginsBefore (db: Db, before: string): Promise<void> {
  await db.deleteFrom('oidc_logins').where('expires_at', '<', before).execute()
}
