import { transactionRetried, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { decodeCursor, encodeCursor } from '../lib/paging.ts'
import type { User } from '../users/users.schemas.ts'
import {
  addGroupMembersRecorded,
  changeGroupRecorded,
  createGroupRecorded,
  deleteGroupRecorded,
  removeGroupMembersRecorded,
  replaceGroupMembersRecorded
} from './groups.lifecycle.ts'
import { countGroupMembers, findGroupById, listGroupMembers, listGroups, toGroup, type GroupFilter } from './groups.repository.ts'
import type { Group, GroupCreate, GroupPatch } from './groups.schemas.ts'

export interface GroupsDeps { db: Db }

/** A group plus the version its ETag is made from. */
export interface VersionedGroup { group: Group, version: number }

export function groupEtagOf (version: number): string {
  return `"${version}"`
}

/** RFC 9110 If-Match: `*` or a list of strong tags; weak tags never match. */
function assertIfMatch (ifMatch: string | undefined, version: number): void {
  if (ifMatch === undefined) return
  const tags = ifMatch.split(',').map(t => t.trim())
  if (!tags.includes('*') && !tags.includes(groupEtagOf(version))) {
    throw new AppError('precondition_failed', 412, 'The group changed since you read it (If-Match does not match the current ETag); read it again and retry.')
  }
}

function groupNotFound (id: string): AppError {
  return new AppError('group_not_found', 404, `No group has the id ${id}.`)
}

const PAGE_SORT = 'display_name'
const MEMBERS_SORT = 'username'

export interface GroupsPage { groups: Group[], nextCursor: string | undefined }

export async function listGroupsPage (deps: GroupsDeps, filter: GroupFilter, limit: number, cursor: string | undefined): Promise<GroupsPage> {
  const after = cursor !== undefined ? decodeCursor(cursor, PAGE_SORT, ['text', 'uuid']) as [string, string] : undefined
  const rows = await listGroups(deps.db, filter, limit, after)
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return {
    groups: page.map(row => toGroup(row, row.member_count)),
    nextCursor: rows.length > limit && last !== undefined ? encodeCursor(PAGE_SORT, [last.display_name, last.id]) : undefined
  }
}

export async function getGroup (deps: GroupsDeps, id: string): Promise<VersionedGroup> {
  const row = await findGroupById(deps.db, id)
  if (row === undefined) throw groupNotFound(id)
  return { group: toGroup(row, await countGroupMembers(deps.db, id)), version: row.version }
}

export interface MembersPage { users: User[], nextCursor: string | undefined }

export async function listMembersPage (deps: GroupsDeps, id: string, limit: number, cursor: string | undefined): Promise<MembersPage> {
  const after = cursor !== undefined ? decodeCursor(cursor, MEMBERS_SORT, ['text', 'uuid']) as [string, string] : undefined
  if (await findGroupById(deps.db, id) === undefined) throw groupNotFound(id)
  const rows = await listGroupMembers(deps.db, id, limit, after)
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return {
    users: page.map(row => row.user),
    nextCursor: rows.length > limit && last !== undefined ? encodeCursor(MEMBERS_SORT, [last.username_key, last.user.id]) : undefined
  }
}

export async function createGroup (deps: GroupsDeps, ctx: RequestContext, input: GroupCreate): Promise<VersionedGroup> {
  return await transactionRetried(deps.db, async trx => {
    const { group, version } = await createGroupRecorded(trx, ctx, input)
    return { group, version }
  })
}

export async function updateGroupById (deps: GroupsDeps, ctx: RequestContext, id: string, patch: GroupPatch, ifMatch: string | undefined): Promise<VersionedGroup> {
  return await transactionRetried(deps.db, async trx => {
    const { group, version } = await changeGroupRecorded(trx, ctx, id, patch, { check: current => { assertIfMatch(ifMatch, current.version) } })
    return { group, version }
  })
}

export async function deleteGroupById (deps: GroupsDeps, ctx: RequestContext, id: string, ifMatch: string | undefined): Promise<void> {
  await transactionRetried(deps.db, async trx => {
    await deleteGroupRecorded(trx, ctx, id, { check: current => { assertIfMatch(ifMatch, current.version) } })
  })
}

export async function addMembers (deps: GroupsDeps, ctx: RequestContext, id: string, userIds: string[], ifMatch: string | undefined): Promise<VersionedGroup> {
  return await transactionRetried(deps.db, async trx => {
    const { group, version } = await addGroupMembersRecorded(trx, ctx, id, userIds, { check: current => { assertIfMatch(ifMatch, current.version) } })
    return { group, version }
  })
}

export async function replaceMembers (deps: GroupsDeps, ctx: RequestContext, id: string, userIds: string[], ifMatch: string | undefined): Promise<VersionedGroup> {
  return await transactionRetried(deps.db, async trx => {
    const { group, version } = await replaceGroupMembersRecorded(trx, ctx, id, userIds, { check: current => { assertIfMatch(ifMatch, current.version) } })
    return { group, version }
  })
}

export async function removeMember (deps: GroupsDeps, ctx: RequestContext, id: string, userId: string, ifMatch: string | undefined): Promise<VersionedGroup> {
  return await transactionRetried(deps.db, async trx => {
    const { group, version } = await removeGroupMembersRecorded(trx, ctx, id, [userId], { check: current => { assertIfMatch(ifMatch, current.version) } })
    return { group, version }
  })
}
