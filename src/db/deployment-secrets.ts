import type { Db } from './database.ts'

/**
 * A secret of the deployment kept in the database, so every instance uses the
 * same one: made by whichever instance asks first, read by the others.
 */
export async function deploymentSecret (db: Db, name: string, make: () => string): Promise<string> {
  await db.insertInto('gatehouse_meta').values({ key: name, value: make() })
    .onConflict(oc => oc.column('key').doNothing()).execute()
  const row = await db.selectFrom('gatehouse_meta').select('value').where('key', '=', name).executeTakeFirstOrThrow()
  return row.value
}
