import { sql, type Kysely } from 'kysely'
import { columnTypes, isPostgres } from '../database.ts'
import { newId, nowIso } from '../../lib/ids.ts'

export const phase = 'expand'

/**
 * Groups as a resource (issue 18): a row per group and a row per membership.
 * `users.groups` stays: the user resource and its list pages are read from
 * it, and the user lifecycle writes both in the same transaction
 * (users.lifecycle.ts). `group_members` is what the groups resource, member
 * counts and the users list's `group=` filter read, by index.
 *
 * Names are unique exactly as written, as the labels were: two users holding
 * `Ops` and `ops` held two groups, and still do.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts } = columnTypes(db)
  await db.schema.createTable('groups')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('display_name', 'text', c => c.notNull())
    // What a provisioning client (SCIM) calls the group; gatehouse only stores it.
    .addColumn('external_id', 'text')
    .addColumn('version', 'integer', c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('updated_at', ts, c => c.notNull())
    .execute()
  await db.schema.createIndex('groups_display_name_unique').on('groups').column('display_name').unique().execute()
  await db.schema.createIndex('groups_external_id_idx').on('groups').column('external_id').execute()

  await db.schema.createTable('group_members')
    .addColumn('group_id', uuid, c => c.notNull().references('groups.id').onDelete('cascade'))
    .addColumn('user_id', uuid, c => c.notNull().references('users.id').onDelete('cascade'))
    .addPrimaryKeyConstraint('group_members_pk', ['group_id', 'user_id'])
    .execute()
  await db.schema.createIndex('group_members_user_id_idx').on('group_members').column('user_id').execute()

  // Backfill: one group per distinct label, then every user's memberships.
  const names = isPostgres(db)
    ? await sql<{ name: string }>`select distinct jsonb_array_elements_text(groups) as name from users`.execute(db)
    : await sql<{ name: string }>`select distinct json_each.value as name from users, json_each(users.groups)`.execute(db)
  const now = nowIso()
  const rows = names.rows.map(({ name }) => ({ id: newId(), display_name: name, external_id: null, version: 1, created_at: now, updated_at: now }))
  for (let i = 0; i < rows.length; i += 500) {
    await db.insertInto('groups').values(rows.slice(i, i + 500)).execute()
  }
  if (isPostgres(db)) {
    await sql`insert into group_members (group_id, user_id)
      select g.id, u.id from users u cross join lateral jsonb_array_elements_text(u.groups) as l(name) join groups g on g.display_name = l.name
      on conflict do nothing`.execute(db)
  } else {
    await sql`insert or ignore into group_members (group_id, user_id)
      select g.id, u.id from users u, json_each(u.groups) l join groups g on g.display_name = l.value`.execute(db)
  }
}

export async function down (db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('group_members').execute()
  await db.schema.dropTable('groups').execute()
}
