import { toIso, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import {
  addGroupMembersRecorded,
  changeGroupRecorded,
  createGroupRecorded,
  deleteGroupRecorded,
  removeGroupMembersRecorded,
  replaceGroupMembersRecorded
} from '../groups/groups.lifecycle.ts'
import {
  findExistingUserIds,
  findMembersOfGroups,
  findScimGroupById,
  groupSortColumnOf,
  listScimGroups,
  type ScimGroupRow
} from './scim.repository.ts'
import {
  attr,
  etagOf,
  filtered,
  invalidValue,
  isObject,
  listQueryOf,
  optionalString,
  project,
  type Resource,
  type ScimAnswer,
  type ScimContext,
  type ScimListAnswer
} from './scim.resources.ts'
import { URN, type ScimListQuery, type ScimPatchBody, type ScimResourceBody } from './scim.schemas.ts'

function groupNotFound (id: string): AppError {
  return new AppError('group_not_found', 404, `No group has the id ${id}.`)
}

/** The Group resource of a row: core schema, members as user ids with their userName. */
export function groupResource (row: ScimGroupRow, baseUrl: string, members: ReadonlyArray<{ id: string, username: string }>): Resource {
  return {
    schemas: [URN.group],
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    displayName: row.display_name,
    members: members.map(member => ({ value: member.id, display: member.username, $ref: `${baseUrl}/Users/${member.id}` })),
    meta: {
      resourceType: 'Group',
      created: toIso(row.created_at),
      lastModified: toIso(row.updated_at),
      version: etagOf(row.version),
      location: `${baseUrl}/Groups/${row.id}`
    }
  }
}

async function readGroup (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  const row = await findScimGroupById(db, id)
  if (row === undefined) throw groupNotFound(id)
  const members = await findMembersOfGroups(db, [id])
  return { resource: groupResource(row, baseUrl, members.get(id) ?? []), version: row.version }
}

export async function getScimGroup (db: Db, id: string, baseUrl: string): Promise<ScimAnswer> {
  return await readGroup(db, id, baseUrl)
}

/**
 * The user ids a `members` value names: `[{"value": "<id>"}]`, or a bare id
 * string (Microsoft's collection sends one). Ids that are no user are passed
 * over: an identity provider pushes a group with members it has not
 * provisioned here (not assigned to the app), and refusing the whole change
 * would stop that group's memberships from syncing at all.
 */
async function memberIdsOf (db: Db, value: unknown): Promise<string[]> {
  if (value === undefined || value === null) return []
  const entries = Array.isArray(value) ? value : [value]
  const ids = entries.map((entry, i) => {
    const id = isObject(entry) ? attr(entry, 'value') : entry
    if (typeof id !== 'string') throw invalidValue(`members[${i}].value must be a user id.`)
    return id
  })
  return await findExistingUserIds(db, ids)
}

function displayNameOf (resource: Resource): string {
  const name = attr(resource, 'displayName')
  if (typeof name !== 'string' || name.trim() === '') throw invalidValue('displayName is required.')
  if (name.length > 64) throw invalidValue('displayName is longer than 64 characters (a group name is one of a user\'s groups).')
  return name
}

export async function createScimGroup (db: Db, scim: ScimContext, body: ScimResourceBody): Promise<ScimAnswer> {
  const displayName = displayNameOf(body)
  const externalId = optionalString(attr(body, 'externalId'), 'externalId', 255)
  return await db.transaction().execute(async trx => {
    const memberIds = await memberIdsOf(trx, attr(body, 'members'))
    const { group } = await createGroupRecorded(trx, scim.ctx, { display_name: displayName, external_id: externalId ?? null, member_ids: memberIds })
    return await readGroup(trx, group.id, scim.baseUrl)
  })
}

function groupIfMatch (ifMatch: string | undefined): (current: ScimGroupRow) => void {
  return current => {
    if (ifMatch === undefined) return
    const tags = ifMatch.split(',').map(t => t.trim().replace(/^W\//, ''))
    if (!tags.includes('*') && !tags.includes(`"${current.version}"`)) {
      throw new AppError('precondition_failed', 412, 'The group changed since you read it (If-Match does not match its version); read it again and retry.')
    }
  }
}

/** PUT: the name, external id and members become what the resource says (no members: none). */
export async function replaceScimGroup (db: Db, scim: ScimContext, id: string, body: ScimResourceBody, ifMatch: string | undefined): Promise<ScimAnswer> {
  const displayName = displayNameOf(body)
  const externalId = optionalString(attr(body, 'externalId'), 'externalId', 255)
  return await db.transaction().execute(async trx => {
    if (await findScimGroupById(trx, id) === undefined) throw groupNotFound(id)
    const memberIds = await memberIdsOf(trx, attr(body, 'members'))
    await changeGroupRecorded(trx, scim.ctx, id, { display_name: displayName, external_id: externalId ?? null }, { check: groupIfMatch(ifMatch) })
    await replaceGroupMembersRecorded(trx, scim.ctx, id, memberIds)
    return await readGroup(trx, id, scim.baseUrl)
  })
}

const MEMBER_FILTER = /^members\s*\[\s*value\s+eq\s+"([^"]*)"\s*\]$/i

/**
 * PATCH on a group, as Okta and Entra send it, each operation through the
 * group lifecycle: `add` members; `remove` with `members[value eq "<id>"]`,
 * or Entra's `{"op":"Remove","path":"members","value":[{"value":"<id>"}]}`,
 * which removes only those members (a path with no value removes them all);
 * `replace` of members, displayName or externalId, also path-less with an
 * object value.
 */
export async function patchScimGroup (db: Db, scim: ScimContext, id: string, body: ScimPatchBody, ifMatch: string | undefined): Promise<number> {
  return await db.transaction().execute(async trx => {
    const current = await findScimGroupById(trx, id)
    if (current === undefined) throw groupNotFound(id)
    groupIfMatch(ifMatch)(current)
    for (const operation of body.Operations) {
      const op = operation.op.toLowerCase()
      if (op !== 'add' && op !== 'replace' && op !== 'remove') throw invalidValue(`"${operation.op}" is not a PATCH operation (add, replace or remove).`)
      const rawPath = operation.path?.trim() ?? ''
      const path = rawPath.toLowerCase().startsWith(`${URN.group.toLowerCase()}:`) ? rawPath.slice(URN.group.length + 1) : rawPath
      const one = MEMBER_FILTER.exec(path)
      if (one !== null) {
        if (op !== 'remove') throw new AppError('invalid_path', 400, 'members[value eq "…"] is a path for remove; add members with the path members.')
        await removeGroupMembersRecorded(trx, scim.ctx, id, await findExistingUserIds(trx, [one[1]!]))
        continue
      }
      const values: Resource = path === '' ? (isObject(operation.value) ? operation.value : {}) : { [path]: operation.value }
      if (path === '' && !isObject(operation.value)) throw invalidValue(`A ${op} without a path takes an object of attributes.`)
      for (const [name, value] of Object.entries(values)) {
        switch (name.toLowerCase()) {
          case 'members': {
            if (op === 'add') await addGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            else if (op === 'replace') await replaceGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            else if (value === undefined || value === null) await replaceGroupMembersRecorded(trx, scim.ctx, id, [])
            else await removeGroupMembersRecorded(trx, scim.ctx, id, await memberIdsOf(trx, value))
            break
          }
          case 'displayname':
            if (op === 'remove') throw new AppError('invalid_value', 400, 'displayName is required; it cannot be removed.')
            await changeGroupRecorded(trx, scim.ctx, id, { display_name: displayNameOf({ displayName: value }) })
            break
          case 'externalid':
            await changeGroupRecorded(trx, scim.ctx, id, { external_id: op === 'remove' ? null : optionalString(value, 'externalId', 255) ?? null })
            break
          // Okta's rename sends the group's own id with the new name; an id is never changed.
          case 'id':
            if (value !== id) throw new AppError('invalid_value', 400, 'A group\'s id cannot be changed.')
            break
          case 'schemas':
            break
          default:
            throw new AppError('invalid_path', 400, `A group has no attribute "${name}" that can be changed (members, displayName, externalId).`)
        }
      }
    }
    return (await findScimGroupById(trx, id))!.version
  })
}

export async function deleteScimGroup (db: Db, scim: ScimContext, id: string, ifMatch: string | undefined): Promise<void> {
  await db.transaction().execute(async trx => {
    if (await findScimGroupById(trx, id) === undefined) throw groupNotFound(id)
    await deleteGroupRecorded(trx, scim.ctx, id, { check: groupIfMatch(ifMatch) })
  })
}

export async function listScimGroupsPage (db: Db, baseUrl: string, query: ScimListQuery): Promise<ScimListAnswer> {
  const { filter, startIndex, count, descending } = listQueryOf(query)
  const sortColumn = query.sortBy !== undefined ? groupSortColumnOf(query.sortBy) : 'display_name'
  if (sortColumn === undefined) throw invalidValue(`Groups cannot be sorted by "${query.sortBy!}".`)
  const page = await filtered(async () => await listScimGroups(db, { filter, sortColumn, descending, offset: startIndex - 1, limit: count }))
  // Entra asks with excludedAttributes=members when it only wants to know a group is there: no members are read then.
  const wantsMembers = !(query.excludedAttributes ?? '').split(',').some(a => a.trim().toLowerCase() === 'members')
  const members = wantsMembers ? await findMembersOfGroups(db, page.rows.map(row => row.id)) : new Map<string, Array<{ id: string, username: string }>>()
  const Resources = page.rows.map(row => project(groupResource(row, baseUrl, members.get(row.id) ?? []), query.attributes, query.excludedAttributes))
  return { totalResults: page.total, startIndex, itemsPerPage: Resources.length, Resources }
}
