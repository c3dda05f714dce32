import { isPostgres, keptOrRolledBack, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { findUserById, lockUserRows, type UserRow } from '../users/users.repository.ts'
import { MAX_GROUPS } from '../users/users.schemas.ts'
import { changeUserRecorded } from '../users/users.lifecycle.ts'
import {
  countGroupMembers,
  deleteGroup,
  findGroupById,
  findGroupByName,
  insertGroup,
  listGroupMemberIds,
  toGroup,
  updateGroup,
  type GroupRow,
  type GroupRowUpdate
} from './groups.repository.ts'
import type { Group } from './groups.schemas.ts'

/*
 * The group lifecycle: the only functions that create, rename or delete a
 * group or change its members (the user lifecycle keeps a user's own
 * memberships in step with their `groups` array, users.lifecycle.ts). A
 * group's name is in every member's `groups`, so a change of members, a
 * rename or a delete changes each member through changeUserRecorded: their
 * `user.updated` event, new version and webhooks follow, and the rules of
 * the user lifecycle apply as through any other door.
 *
 * Data-level functions, as the user lifecycle's: they take the request's
 * transaction and context, import only repositories and the user lifecycle,
 * and any service or flow may call them (the REST API, the console, SCIM).
 */

export interface NewGroup {
  display_name: string
  external_id?: string | null | undefined
  member_ids?: string[] | undefined
}

export interface GroupChanges {
  display_name?: string | undefined
  external_id?: string | null | undefined
}

export interface GroupOptions {
  /** Checks the locked group before anything is written (If-Match); throwing rolls back. */
  check?: (current: GroupRow) => void
  /** Checks each member whose `groups` the change rewrites (who may change them); throwing rolls back. */
  checkMember?: (member: UserRow) => void
}

export interface GroupOutcome {
  group: Group
  version: number
  /** Users the call made members. */
  added: string[]
  /** Users the call took out of the group. */
  removed: string[]
}

function groupNotFound (id: string): AppError {
  return new AppError('group_not_found', 404, `No group has the id ${id}.`)
}

function groupExists (name: string, existing: GroupRow): AppError {
  const spelled = existing.display_name === name ? '' : ` as ${JSON.stringify(existing.display_name)} (names are unique ignoring case)`
  return new AppError('group_exists', 409, `A group named ${JSON.stringify(name)} already exists${spelled}.`)
}

/**
 * Locks the users a change will rewrite, then the group (PostgreSQL). Users
 * first, in id order, as the user lifecycle locks a user before the groups
 * it joins: a change of a group and a change of one of its members' arrays
 * then queue rather than deadlock. `members`: also every current member (a
 * rename, a delete, a replacement of the members). `rename`: the lock a
 * change of the group's name or a delete needs; otherwise one that lets
 * users join and leave other groups meanwhile.
 */
async function lockedGroup (trx: Db, id: string, options: { check?: (current: GroupRow) => void, expectedVersion?: number | undefined }, lock: { users?: readonly string[], members?: boolean, rename?: boolean }): Promise<GroupRow> {
  const users = new Set(lock.users ?? [])
  const groupLock = lock.rename === true ? 'update' : 'no_key_update'
  let current: GroupRow | undefined
  if (lock.members === true) {
    current = await lockedWithMembers(trx, id, users, groupLock)
  } else {
    await lockUserRows(trx, [...users])
    current = await findGroupById(trx, id, { lock: groupLock })
  }
  if (current === undefined) throw groupNotFound(id)
  if (options.expectedVersion !== undefined && options.expectedVersion !== current.version) {
    throw new AppError('precondition_failed', 412, 'The group changed since you read it; read it again and retry.')
  }
  options.check?.(current)
  return current
}

/** Rounds of lockedWithMembers before it goes on with what it holds. */
const MEMBER_LOCK_ROUNDS = 3

/**
 * Locks `users` and every member, then the group. The members are read
 * before the group is locked, and that lock waits for the joins under way
 * to commit: one who joined meanwhile would be locked only after the group,
 * out of order, and deadlock against a change of theirs that waits for this
 * group (a change of another group's members asks for every group its
 * members are in). So on PostgreSQL the locks are taken in a savepoint and,
 * when the members read again under the group's lock include someone new,
 * given back and taken again with them. After MEMBER_LOCK_ROUNDS such rounds
 * the newcomers are locked late, and a deadlock left is transactionRetried's.
 */
async function lockedWithMembers (trx: Db, id: string, users: Set<string>, groupLock: 'update' | 'no_key_update'): Promise<GroupRow | undefined> {
  for (const memberId of await listGroupMemberIds(trx, id)) users.add(memberId)
  const lockAll = async (): Promise<GroupRow | undefined> => {
    await lockUserRows(trx, [...users])
    return await findGroupById(trx, id, { lock: groupLock })
  }
  if (!isPostgres(trx)) return await lockAll()
  for (let round = 1; round <= MEMBER_LOCK_ROUNDS; round++) {
    const locked = await keptOrRolledBack(trx, async () => {
      const group = await lockAll()
      if (group === undefined) return { group }
      const newcomers = (await listGroupMemberIds(trx, id)).filter(memberId => !users.has(memberId))
      for (const memberId of newcomers) users.add(memberId)
      return newcomers.length > 0 ? undefined : { group }
    })
    if (locked !== undefined) return locked.group
  }
  return await lockAll()
}

async function outcome (trx: Db, row: GroupRow, added: string[], removed: string[]): Promise<GroupOutcome> {
  return { group: toGroup(row, await countGroupMembers(trx, row.id)), version: row.version, added, removed }
}

/**
 * Rewrites one user's `groups` through the user lifecycle, which also keeps
 * their memberships in step; the caller records the group's own event.
 * Returns whether anything changed.
 */
async function changeMemberGroups (trx: Db, ctx: RequestContext, userId: string, edit: (groups: string[]) => string[], checkMember: GroupOptions['checkMember']): Promise<boolean> {
  const user = await findUserById(trx, userId, { forUpdate: true })
  if (user === undefined) throw new AppError('user_not_found', 404, `No user has the id ${userId}.`)
  const before = toStringArray(user.groups)
  const after = [...new Set(edit(before))]
  if (JSON.stringify(after) === JSON.stringify(before)) return false
  if (after.length > MAX_GROUPS) {
    throw new AppError('too_many_groups', 409, `The user ${user.username} is in ${before.length} groups already; a user is in at most ${MAX_GROUPS}.`)
  }
  const result = await changeUserRecorded(trx, ctx, userId, { groups: after }, { lastAdmin: 'refuse', check: checkMember, recordGroupEvents: false })
  return result.changed
}

/** A new version of the group, for a change of its members. */
async function touched (trx: Db, current: GroupRow): Promise<GroupRow> {
  const updated = await updateGroup(trx, current.id, current.version, { version: current.version + 1, updated_at: nowIso() })
  if (updated === undefined) throw new AppError('precondition_failed', 412, 'The group changed while this request was applied; read it again and retry.')
  return updated
}

async function addMembers (trx: Db, ctx: RequestContext, group: GroupRow, userIds: readonly string[], checkMember: GroupOptions['checkMember']): Promise<string[]> {
  const added: string[] = []
  for (const userId of new Set(userIds)) {
    if (await changeMemberGroups(trx, ctx, userId, groups => [...groups, group.display_name], checkMember)) added.push(userId)
  }
  return added
}

async function removeMembers (trx: Db, ctx: RequestContext, group: GroupRow, userIds: readonly string[], checkMember: GroupOptions['checkMember']): Promise<string[]> {
  // Only members: a user who is not one (or no longer exists) has nothing to lose.
  const members = new Set(await listGroupMemberIds(trx, group.id))
  const removed: string[] = []
  for (const userId of new Set(userIds)) {
    if (!members.has(userId)) continue
    if (await changeMemberGroups(trx, ctx, userId, groups => groups.filter(name => name !== group.display_name), checkMember)) removed.push(userId)
  }
  return removed
}

/** Creates a group with its `group.created` event, and makes `member_ids` its members (each their `user.updated`). */
export async function createGroupRecorded (trx: Db, ctx: RequestContext, input: NewGroup, options: Pick<GroupOptions, 'checkMember'> = {}): Promise<GroupOutcome> {
  const existing = await findGroupByName(trx, input.display_name)
  if (existing !== undefined) throw groupExists(input.display_name, existing)
  // The first members are locked first, in id order, as every change of a group does.
  await lockUserRows(trx, input.member_ids ?? [])
  const now = nowIso()
  let row = await insertGroup(trx, { id: newId(), display_name: input.display_name, external_id: input.external_id ?? null, version: 1, created_at: now, updated_at: now })
  const memberIds = [...new Set(input.member_ids ?? [])]
  await recordEvent(trx, ctx, 'group.created', { type: 'group', id: row.id }, { display_name: row.display_name, external_id: row.external_id, member_ids: memberIds })
  const added = await addMembers(trx, ctx, row, memberIds, options.checkMember)
  if (added.length > 0) row = (await findGroupById(trx, row.id))!
  return await outcome(trx, row, added, [])
}

/**
 * Renames a group or sets its external id: one new version and a
 * `group.updated` event with `{field: {from, to}}`. A new name is written
 * into every member's `groups` (each their `user.updated`).
 */
export async function changeGroupRecorded (trx: Db, ctx: RequestContext, id: string, changes: GroupChanges, options: GroupOptions & { expectedVersion?: number | undefined } = {}): Promise<GroupOutcome> {
  const current = await lockedGroup(trx, id, options, { members: changes.display_name !== undefined, rename: changes.display_name !== undefined })
  const update: GroupRowUpdate = {}
  const diff: Record<string, { from: unknown, to: unknown }> = {}
  if (changes.display_name !== undefined && changes.display_name !== current.display_name) {
    // Itself when only the case changes (`data` to `Data`), which is a rename like any other.
    const existing = await findGroupByName(trx, changes.display_name)
    if (existing !== undefined && existing.id !== id) throw groupExists(changes.display_name, existing)
    update.display_name = changes.display_name
    diff.display_name = { from: current.display_name, to: changes.display_name }
  }
  if (changes.external_id !== undefined && changes.external_id !== current.external_id) {
    update.external_id = changes.external_id
    diff.external_id = { from: current.external_id, to: changes.external_id }
  }
  if (Object.keys(diff).length === 0) return await outcome(trx, current, [], [])
  const updated = await updateGroup(trx, id, current.version, { ...update, version: current.version + 1, updated_at: nowIso() })
  if (updated === undefined) throw new AppError('precondition_failed', 412, 'The group changed while this request was applied; read it again and retry.')
  await recordEvent(trx, ctx, 'group.updated', { type: 'group', id }, { changes: diff })
  if (update.display_name !== undefined) {
    // The row carries the new name first, so the members' arrays find it (and no group is made for it).
    const from = current.display_name
    const to = update.display_name
    for (const userId of await listGroupMemberIds(trx, id)) {
      await changeMemberGroups(trx, ctx, userId, groups => groups.map(name => name === from ? to : name), options.checkMember)
    }
  }
  return await outcome(trx, updated, [], [])
}

/** Makes these users members (each their `user.updated`), with one `group.members_added` event for those not already in. */
export async function addGroupMembersRecorded (trx: Db, ctx: RequestContext, id: string, userIds: readonly string[], options: GroupOptions = {}): Promise<GroupOutcome> {
  let group = await lockedGroup(trx, id, options, { users: userIds })
  const added = await addMembers(trx, ctx, group, userIds, options.checkMember)
  if (added.length > 0) {
    group = await touched(trx, group)
    await recordEvent(trx, ctx, 'group.members_added', { type: 'group', id }, { display_name: group.display_name, user_ids: added })
  }
  return await outcome(trx, group, added, [])
}

/** Takes these users out of the group (each their `user.updated`), with one `group.members_removed` event; non-members are passed over. */
export async function removeGroupMembersRecorded (trx: Db, ctx: RequestContext, id: string, userIds: readonly string[], options: GroupOptions = {}): Promise<GroupOutcome> {
  let group = await lockedGroup(trx, id, options, { users: userIds })
  const removed = await removeMembers(trx, ctx, group, userIds, options.checkMember)
  if (removed.length > 0) {
    group = await touched(trx, group)
    await recordEvent(trx, ctx, 'group.members_removed', { type: 'group', id }, { display_name: group.display_name, user_ids: removed })
  }
  return await outcome(trx, group, [], removed)
}

/** Makes the members exactly these users: a `group.members_removed` for those taken out and a `group.members_added` for those put in. */
export async function replaceGroupMembersRecorded (trx: Db, ctx: RequestContext, id: string, userIds: readonly string[], options: GroupOptions = {}): Promise<GroupOutcome> {
  let group = await lockedGroup(trx, id, options, { users: userIds, members: true })
  const wanted = new Set(userIds)
  const current = await listGroupMemberIds(trx, id)
  const removed = await removeMembers(trx, ctx, group, current.filter(userId => !wanted.has(userId)), options.checkMember)
  const added = await addMembers(trx, ctx, group, [...wanted], options.checkMember)
  if (removed.length > 0 || added.length > 0) group = await touched(trx, group)
  if (removed.length > 0) await recordEvent(trx, ctx, 'group.members_removed', { type: 'group', id }, { display_name: group.display_name, user_ids: removed })
  if (added.length > 0) await recordEvent(trx, ctx, 'group.members_added', { type: 'group', id }, { display_name: group.display_name, user_ids: added })
  return await outcome(trx, group, added, removed)
}

/** Deletes a group with a `group.deleted` event; its name leaves every member's `groups` (each their `user.updated`). */
export async function deleteGroupRecorded (trx: Db, ctx: RequestContext, id: string, options: GroupOptions & { expectedVersion?: number | undefined } = {}): Promise<void> {
  const current = await lockedGroup(trx, id, options, { members: true, rename: true })
  const memberIds = await listGroupMemberIds(trx, id)
  // The row goes first (its memberships with it), so the members' new arrays cannot find it.
  await deleteGroup(trx, id)
  await recordEvent(trx, ctx, 'group.deleted', { type: 'group', id }, { display_name: current.display_name, external_id: current.external_id, member_ids: memberIds })
  for (const userId of memberIds) {
    await changeMemberGroups(trx, ctx, userId, groups => groups.filter(name => name !== current.display_name), options.checkMember)
  }
}
