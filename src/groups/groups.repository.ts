import { sql, type Selectable, type Updateable } from 'kysely'
import { isPostgres, toIso, type Db, type GroupsTable } from '../db/database.ts'
import { PUBLIC_USER_COLUMNS, toUser } from '../users/users.repository.ts'
import type { User } from '../users/users.schemas.ts'
import type { Group } from './groups.schemas.ts'

export type GroupRow = Selectable<GroupsTable>
export type GroupRowUpdate = Updateable<GroupsTable>
export interface NewGroupRow {
  id: string
  display_name: string
  external_id: string | null
  version: number
  created_at: string
  updated_at: string
}

/** Rows per statement: well under SQLite's and PostgreSQL's limits on bound parameters. */
const CHUNK = 500

/**
 * What makes two group names the same name: names are unique ignoring case
 * (`Data` and `data` are one group), in every script (JavaScript's
 * lower-casing, not SQLite's, which folds only ASCII). Kept in `name_key`
 * (migration 0025), which holds the unique index.
 */
export function groupNameKey (name: string): string {
  return name.toLowerCase()
}

export function toGroup (row: GroupRow | NewGroupRow, memberCount: number): Group {
  return {
    id: row.id,
    display_name: row.display_name,
    external_id: row.external_id,
    member_count: memberCount,
    created_at: toIso(row.created_at),
    updated_at: toIso(row.updated_at)
  }
}

/**
 * `lock` on PostgreSQL: `update` for a rename or a delete (which change the
 * row's key, the unique name); `no_key_update` for a change of members, which
 * lets the users' own changes (their memberships' foreign keys take `key
 * share`) go on meanwhile.
 */
export async function findGroupById (db: Db, id: string, options: { lock?: 'update' | 'no_key_update' } = {}): Promise<GroupRow | undefined> {
  return await db.selectFrom('groups').selectAll().where('id', '=', id)
    .$if(options.lock === 'update' && isPostgres(db), q => q.forUpdate())
    .$if(options.lock === 'no_key_update' && isPostgres(db), q => q.forNoKeyUpdate())
    .executeTakeFirst()
}

/** The group of this name, ignoring case (names are unique so). */
export async function findGroupByName (db: Db, displayName: string): Promise<GroupRow | undefined> {
  return await db.selectFrom('groups').selectAll().where('name_key', '=', groupNameKey(displayName)).executeTakeFirst()
}

/**
 * How a user's `groups` array spells these names: a name an existing group
 * has, ignoring case, in that group's spelling (naming `DATA` joins `data`);
 * a name no group has as first given here. By groupNameKey. Read without
 * locks: the memberships are found again, locked, by name_key.
 */
export async function storedGroupSpellings (db: Db, names: readonly string[]): Promise<Map<string, string>> {
  const spelling = new Map<string, string>()
  const keys = [...new Set(names.map(groupNameKey))]
  for (let i = 0; i < keys.length; i += CHUNK) {
    const rows = await db.selectFrom('groups').select(['name_key', 'display_name']).where('name_key', 'in', keys.slice(i, i + CHUNK)).execute()
    for (const row of rows) spelling.set(row.name_key, row.display_name)
  }
  for (const name of names) if (!spelling.has(groupNameKey(name))) spelling.set(groupNameKey(name), name)
  return spelling
}

/** A `groups` array spelled as storedGroupSpellings says, names that differ only in case given once. */
export function spelledGroups (names: readonly string[], spelling: ReadonlyMap<string, string>): string[] {
  return [...new Set(names.map(name => spelling.get(groupNameKey(name)) ?? name))]
}

/**
 * The groups of these names. `lock` (PostgreSQL), taken in id order: a group
 * being renamed or deleted is waited for, and then found only if it still has
 * the name, so a user's array never names a group that has just been renamed
 * away. `no_key_update` when the caller will also write the rows (a new
 * version for a change of members): taken at once rather than raised from
 * `key_share` later, which can deadlock against a rename waiting in between.
 * `alsoIds`: groups locked with them in the same statement, and so in the
 * same id order (a user's groups they leave); at most a user's groups, so
 * they go with the first chunk of names.
 */
export async function findGroupsByNames (db: Db, names: readonly string[], options: { lock?: 'key_share' | 'no_key_update', alsoIds?: readonly string[] } = {}): Promise<GroupRow[]> {
  const rows: GroupRow[] = []
  const sorted = [...new Set(names.map(groupNameKey))].sort()
  const alsoIds = [...new Set(options.alsoIds ?? [])]
  for (let i = 0; i < Math.max(sorted.length, alsoIds.length > 0 ? 1 : 0); i += CHUNK) {
    const chunk = sorted.slice(i, i + CHUNK)
    const ids = i === 0 ? alsoIds : []
    rows.push(...await db.selectFrom('groups').selectAll()
      .where(eb => eb.or([
        ...chunk.length > 0 ? [eb('name_key', 'in', chunk)] : [],
        ...ids.length > 0 ? [eb('id', 'in', ids)] : []
      ]))
      .$if(options.lock === 'key_share' && isPostgres(db), q => q.orderBy('id').forKeyShare())
      .$if(options.lock === 'no_key_update' && isPostgres(db), q => q.orderBy('id').forNoKeyUpdate())
      .execute())
  }
  return rows
}

export async function findGroupsByIds (db: Db, ids: readonly string[]): Promise<GroupRow[]> {
  if (ids.length === 0) return []
  return await db.selectFrom('groups').selectAll().where('id', 'in', [...ids]).execute()
}

export async function insertGroup (db: Db, row: NewGroupRow): Promise<GroupRow> {
  return await db.insertInto('groups').values({ ...row, name_key: groupNameKey(row.display_name) }).returningAll().executeTakeFirstOrThrow()
}

/**
 * Inserts the groups whose names no group has yet and returns those it
 * inserted; a name another transaction takes first is skipped (on
 * PostgreSQL the insert waits for that transaction and then skips it).
 */
export async function insertGroupsIfAbsent (db: Db, rows: NewGroupRow[]): Promise<GroupRow[]> {
  const inserted: GroupRow[] = []
  for (let i = 0; i < rows.length; i += CHUNK) {
    inserted.push(...await db.insertInto('groups').values(rows.slice(i, i + CHUNK).map(row => ({ ...row, name_key: groupNameKey(row.display_name) })))
      .onConflict(oc => oc.column('name_key').doNothing())
      .returningAll().execute())
  }
  return inserted
}

/** Applies a change only if the row is still at `expectedVersion`; undefined when it is not. */
export async function updateGroup (db: Db, id: string, expectedVersion: number, changes: GroupRowUpdate): Promise<GroupRow | undefined> {
  const keyed = changes.display_name !== undefined ? { ...changes, name_key: groupNameKey(changes.display_name as string) } : changes
  return await db.updateTable('groups').set(keyed)
    .where('id', '=', id).where('version', '=', expectedVersion)
    .returningAll().executeTakeFirst()
}

/** A new version of each group, for a change of its members. */
export async function touchGroups (db: Db, ids: readonly string[], now: string): Promise<void> {
  const sorted = [...new Set(ids)].sort()
  for (let i = 0; i < sorted.length; i += CHUNK) {
    // Locked in id order by the inner select, so two transactions touching the
    // same groups queue rather than deadlock: an UPDATE alone locks its rows in
    // the order its plan meets them (a bitmap or sequential scan: the heap's).
    const locked = db.selectFrom('groups').select('id').where('id', 'in', sorted.slice(i, i + CHUNK))
      .$if(isPostgres(db), q => q.orderBy('id').forNoKeyUpdate())
    await db.updateTable('groups').set({ version: sql`version + 1`, updated_at: now }).where('id', 'in', locked).execute()
  }
}

/** Deletes the group; its memberships go with it (ON DELETE CASCADE). */
export async function deleteGroup (db: Db, id: string): Promise<boolean> {
  const result = await db.deleteFrom('groups').where('id', '=', id).executeTakeFirst()
  return result.numDeletedRows > 0n
}

export async function countGroupMembers (db: Db, groupId: string): Promise<number> {
  const row = await db.selectFrom('group_members').select(eb => eb.fn.countAll<number | string>().as('n')).where('group_id', '=', groupId).executeTakeFirstOrThrow()
  return Number(row.n)
}

/** Every member's id, in id order. */
export async function listGroupMemberIds (db: Db, groupId: string): Promise<string[]> {
  const rows = await db.selectFrom('group_members').select('user_id').where('group_id', '=', groupId).orderBy('user_id').execute()
  return rows.map(r => r.user_id)
}

/** The ids of the groups a user is in. */
export async function listGroupIdsOfUser (db: Db, userId: string): Promise<string[]> {
  const rows = await db.selectFrom('group_members').select('group_id').where('user_id', '=', userId).execute()
  return rows.map(r => r.group_id)
}

/** Adds memberships; one that exists already is left as it is. */
export async function insertMemberships (db: Db, rows: Array<{ group_id: string, user_id: string }>): Promise<void> {
  for (let i = 0; i < rows.length; i += CHUNK) {
    await db.insertInto('group_members').values(rows.slice(i, i + CHUNK)).onConflict(oc => oc.columns(['group_id', 'user_id']).doNothing()).execute()
  }
}

export async function deleteMemberships (db: Db, userId: string, groupIds: readonly string[]): Promise<void> {
  if (groupIds.length === 0) return
  await db.deleteFrom('group_members').where('user_id', '=', userId).where('group_id', 'in', [...groupIds]).execute()
}

export type GroupFilter = { display_name?: string | undefined, q?: string | undefined, external_id?: string | undefined }

function escapeLike (value: string): string {
  return value.replace(/[\\%_]/g, c => `\\${c}`)
}

/**
 * One keyset page of groups in name order (then id), each with its member
 * count (read from the primary key of group_members, which starts with the
 * group). One row more than `limit` when another page follows.
 */
export async function listGroups (db: Db, filter: GroupFilter, limit: number, after: [string, string] | undefined): Promise<Array<GroupRow & { member_count: number }>> {
  const rows = await db.selectFrom('groups')
    .selectAll('groups')
    .select(eb => eb.selectFrom('group_members').select(eb.fn.countAll<number | string>().as('n')).whereRef('group_members.group_id', '=', 'groups.id').as('member_count'))
    .$if(filter.display_name !== undefined, q => q.where('name_key', '=', groupNameKey(filter.display_name!)))
    .$if(filter.external_id !== undefined, q => q.where('external_id', '=', filter.external_id!))
    .$if(filter.q !== undefined, q => q.where(sql<boolean>`lower(display_name) like ${`%${escapeLike(filter.q!.toLowerCase())}%`} escape '\\'`))
    .$if(after !== undefined, q => q.where(({ eb, refTuple, tuple }) => eb(refTuple('display_name', 'id'), '>', tuple(after![0], after![1]))))
    .orderBy('display_name')
    .orderBy('id')
    .limit(limit + 1)
    .execute()
  return rows.map(row => ({ ...row, member_count: Number(row.member_count ?? 0) }))
}

/**
 * One keyset page of a group's members as users, in username order (then id);
 * one more than `limit` when another page follows. Walked on the memberships'
 * copy of the username (migration 0018), so a page reads only its members.
 */
export async function listGroupMembers (db: Db, groupId: string, limit: number, after: [string, string] | undefined): Promise<Array<{ user: User, username_key: string }>> {
  const rows = await db.selectFrom('group_members')
    .innerJoin('users', 'users.id', 'group_members.user_id')
    .select([...PUBLIC_USER_COLUMNS, 'users.username_key'])
    .where('group_members.group_id', '=', groupId)
    .$if(after !== undefined, q => q.where(({ eb, refTuple, tuple }) => eb(refTuple('group_members.username_key', 'group_members.user_id'), '>', tuple(after![0], after![1]))))
    .orderBy('group_members.username_key')
    .orderBy('group_members.user_id')
    .limit(limit + 1)
    .execute()
  return rows.map(row => ({ user: toUser(row), username_key: row.username_key }))
}
