import type { Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * SCIM provisioning (docs/scim.md): what an identity provider keeps about a
 * user that gatehouse had no place for. `external_id` is the provider's own
 * id for the user (indexed: Entra and Okta look users up by it);
 * `display_name` and `formatted_name` are SCIM's `displayName` and
 * `name.formatted`; `scim_emails` is the `emails` list as the provider sent
 * it (the primary address is also the user's `email` when it is a valid
 * address no other user holds); `provisioned_at` is the last change a SCIM
 * client made, which the console shows.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { ts, json } = columnTypes(db)
  await db.schema.alterTable('users').addColumn('external_id', 'text').execute()
  await db.schema.alterTable('users').addColumn('display_name', 'text').execute()
  await db.schema.alterTable('users').addColumn('formatted_name', 'text').execute()
  await db.schema.alterTable('users').addColumn('scim_emails', json).execute()
  await db.schema.alterTable('users').addColumn('provisioned_at', ts).execute()
  await db.schema.createIndex('users_external_id_idx').on('users').column('external_id').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('users_external_id_idx').execute()
  for (const column of ['provisioned_at', 'scim_emails', 'formatted_name', 'display_name', 'external_id']) {
    await db.schema.alterTable('users').dropColumn(column).execute()
  }
}
