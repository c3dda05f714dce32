import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

/**
 * Group names are unique ignoring case (PRODUCT.md §11): `name_key` is the
 * name lower-cased as JavaScript does it (every script, not only ASCII as
 * SQLite's lower() and NOCASE would), written by groups.repository.ts, and
 * the unique index moves from the name to it. The name keeps a plain index,
 * for the lists' order and exact lookups.
 *
 * Groups that differ only in case (`Ops` and `ops`, allowed until now) stop
 * the migration before anything is changed, naming each: which of them is
 * the group, and who is in it, is a decision about people's access that no
 * migration should make. Rename or merge them with the release running, then
 * start this one again (docs/api.md#groups).
 */
const CHUNK = 500

/** As groups.repository.ts groupNameKey; a copy, so the migration stays what it was if that changes. */
function nameKey (name: string): string {
  return name.toLowerCase()
}

async function refuseCaseDuplicates (db: Kysely<any>): Promise<Array<{ id: string, display_name: string }>> {
  const rows = await db.selectFrom('groups').select(['id', 'display_name', 'created_at'])
    .select(eb => eb.selectFrom('group_members').select(eb.fn.countAll().as('n')).whereRef('group_members.group_id', '=', 'groups.id').as('members'))
    .orderBy('created_at').orderBy('id').execute() as Array<{ id: string, display_name: string, members: number | string }>
  const byKey = new Map<string, typeof rows>()
  for (const row of rows) byKey.set(nameKey(row.display_name), [...byKey.get(nameKey(row.display_name)) ?? [], row])
  const clashes = [...byKey.values()].filter(same => same.length > 1)
  if (clashes.length > 0) {
    const listed = clashes.slice(0, 20).map(same => same.map(g => `${JSON.stringify(g.display_name)} (id ${g.id}, ${Number(g.members)} members)`).join(' and '))
    throw new Error(`migration 0025_group_name_key: group names are unique ignoring case from this release on, and ${clashes.length} set(s) of groups differ only in case: ` +
      `${listed.join('; ')}${clashes.length > 20 ? '; …' : ''}. Nothing was changed. With the release you are running, rename one of each set ` +
      '(PATCH /auth/api/groups/{id}, the console or `gatehouse groups rename`) or move its members and delete it, then start this release again.')
  }
  return rows
}

// Contract on PostgreSQL: name_key is NOT NULL, so a release before this one cannot insert a group.
export const phase = 'contract'

export async function up (db: Kysely<any>): Promise<void> {
  const rows = await refuseCaseDuplicates(db)
  await db.schema.alterTable('groups').addColumn('name_key', 'text').execute()
  for (let i = 0; i < rows.length; i += CHUNK) {
    const chunk = rows.slice(i, i + CHUNK)
    await db.updateTable('groups')
      .set({ name_key: sql`case ${sql.join(chunk.map(g => sql`when id = ${g.id} then ${nameKey(g.display_name)}`), sql` `)} end` })
      .where('id', 'in', chunk.map(g => g.id)).execute()
  }
  if (isPostgres(db)) await sql`alter table groups alter column name_key set not null`.execute(db)
  await db.schema.dropIndex('groups_display_name_unique').execute()
  await db.schema.createIndex('groups_name_key_unique').on('groups').column('name_key').unique().execute()
  await db.schema.createIndex('groups_display_name_idx').on('groups').column('display_name').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('groups_display_name_idx').execute()
  await db.schema.dropIndex('groups_name_key_unique').execute()
  await db.schema.createIndex('groups_display_name_unique').on('groups').column('display_name').unique().execute()
  await db.schema.alterTable('groups').dropColumn('name_key').execute()
}
