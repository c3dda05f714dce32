import { Type } from 'typebox'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { setNextLink } from '../lib/paging.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import { User } from '../users/users.schemas.ts'
import {
  Group,
  GroupCreate,
  GroupIdParams,
  GroupIfMatchHeaders,
  GroupMemberParams,
  GroupMembersChange,
  GroupMembersReplace,
  GroupPatch,
  ListGroupMembersQuery,
  ListGroupsQuery
} from './groups.schemas.ts'
import {
  addMembers,
  createGroup,
  deleteGroupById,
  getGroup,
  groupEtagOf,
  listGroupsPage,
  listMembersPage,
  removeMember,
  replaceMembers,
  updateGroupById,
  type GroupsDeps
} from './groups.service.ts'

const JSON_TYPES = ['application/json']
const PATCH_TYPES = ['application/merge-patch+json', 'application/json']

export default async function groupsRoutes (app: FastifyTypeBox): Promise<void> {
  const deps: GroupsDeps = { db: app.db }
  const common = { tags: ['groups'], security: SECURITY }
  const GroupRef = ref(Group)
  const location = (id: string): string => `${app.config.basePath}/api/groups/${id}`

  app.get('/api/groups', {
    schema: {
      ...common,
      operationId: 'list_groups',
      summary: 'List Groups',
      description: 'Groups in name order, each with its member count; one page at a time, the next in the `Link: rel="next"` header.',
      querystring: ListGroupsQuery,
      response: { 200: withHeaders({ ...Type.Array(GroupRef, { maxItems: 1000 }), description: 'Groups, in name order.' }, 'Link'), ...problems(401, 403, 422, 503) }
    },
    config: { scope: 'users:read' }
  }, async (request, reply) => {
    const { limit = 100, cursor, ...filter } = request.query
    const page = await listGroupsPage(deps, filter, limit, cursor)
    if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
    return page.groups
  })

  app.post('/api/groups', {
    schema: {
      ...common,
      operationId: 'create_group',
      summary: 'Create Group',
      description: 'Creates a group, with `member_ids` as its first members (their `groups` gain its name). A name that a group has is refused (409 `group_exists`). ' +
        'A group is also made when a user is given a `groups` name no group has yet (as release 3.6.1 clients do).',
      consumes: JSON_TYPES,
      body: ref(GroupCreate),
      response: {
        201: withHeaders({ ...GroupRef, description: 'The created group; `Location` names it and `ETag` versions it.' }, 'Location', 'ETag'),
        ...problems(401, 403, 404, 409, 413, 415, 422, 503)
      }
    },
    config: { scope: 'users:write', accepts: JSON_TYPES, idempotent: true }
  }, async (request, reply) => {
    const { group, version } = await createGroup(deps, requestContext(request), request.body)
    return await reply.code(201).header('Location', location(group.id)).header('ETag', groupEtagOf(version)).send(group)
  })

  app.get('/api/groups/:group_id', {
    schema: {
      ...common,
      operationId: 'get_group',
      summary: 'Get Group',
      description: 'One group, with its member count.',
      params: GroupIdParams,
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it (a rename or a change of members makes a new version).' }, 'ETag'), ...problems(401, 403, 404, 422, 503) }
    },
    config: { scope: 'users:read' }
  }, async (request, reply) => {
    const { group, version } = await getGroup(deps, request.params.group_id)
    return await reply.header('ETag', groupEtagOf(version)).send(group)
  })

  app.patch('/api/groups/:group_id', {
    schema: {
      ...common,
      operationId: 'update_group',
      summary: 'Rename Group',
      description: 'A JSON merge patch (RFC 7396). A new `display_name` is written into every member\'s `groups` (a `user.updated` each). ' +
        'Send `If-Match` with the ETag you read to refuse lost updates (412). Only an admin may rename a group that has an admin as a member.',
      consumes: PATCH_TYPES,
      params: GroupIdParams,
      headers: GroupIfMatchHeaders,
      body: ref(GroupPatch),
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 404, 409, 412, 413, 415, 422, 503) }
    },
    config: { scope: 'users:write', accepts: PATCH_TYPES }
  }, async (request, reply) => {
    const { group, version } = await updateGroupById(deps, requestContext(request), request.params.group_id, request.body, request.headers['if-match'])
    return await reply.header('ETag', groupEtagOf(version)).send(group)
  })

  app.delete('/api/groups/:group_id', {
    schema: {
      ...common,
      operationId: 'delete_group',
      summary: 'Delete Group',
      description: 'Deletes the group; its name leaves every member\'s `groups` (a `user.updated` each). Only an admin may delete a group that has an admin as a member.',
      params: GroupIdParams,
      headers: GroupIfMatchHeaders,
      response: { 204: { type: 'null', description: 'Deleted.' }, ...problems(401, 403, 404, 409, 412, 422, 503) }
    },
    config: { scope: 'users:write' }
  }, async (request, reply) => {
    await deleteGroupById(deps, requestContext(request), request.params.group_id, request.headers['if-match'])
    return await reply.code(204).send(null)
  })

  app.get('/api/groups/:group_id/members', {
    schema: {
      ...common,
      operationId: 'list_group_members',
      summary: 'List Group Members',
      description: 'The group\'s members as users, in username order; one page at a time, the next in the `Link: rel="next"` header.',
      params: GroupIdParams,
      querystring: ListGroupMembersQuery,
      response: { 200: withHeaders({ ...Type.Array(ref(User), { maxItems: 1000 }), description: 'Members, in username order.' }, 'Link'), ...problems(401, 403, 404, 422, 503) }
    },
    config: { scope: 'users:read' }
  }, async (request, reply) => {
    const { limit = 100, cursor } = request.query
    const page = await listMembersPage(deps, request.params.group_id, limit, cursor)
    if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
    return page.users
  })

  app.post('/api/groups/:group_id/members', {
    schema: {
      ...common,
      operationId: 'add_group_members',
      summary: 'Add Group Members',
      description: 'Makes these users members; each one not already in gains the group\'s name in `groups` (a `user.updated` each), and one `group.members_added` lists them. ' +
        'Users already in are left as they are. A user who would be in more than 100 groups is refused (409 `too_many_groups`), and nothing is changed.',
      consumes: JSON_TYPES,
      params: GroupIdParams,
      headers: GroupIfMatchHeaders,
      body: ref(GroupMembersChange),
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 404, 409, 412, 413, 415, 422, 503) }
    },
    config: { scope: 'users:write', accepts: JSON_TYPES }
  }, async (request, reply) => {
    const { group, version } = await addMembers(deps, requestContext(request), request.params.group_id, request.body.user_ids, request.headers['if-match'])
    return await reply.header('ETag', groupEtagOf(version)).send(group)
  })

  app.put('/api/groups/:group_id/members', {
    schema: {
      ...common,
      operationId: 'replace_group_members',
      summary: 'Replace Group Members',
      description: 'Makes the members exactly these users: those not listed leave the group, those listed join it (each a `user.updated`), ' +
        'with one `group.members_removed` and one `group.members_added`.',
      consumes: JSON_TYPES,
      params: GroupIdParams,
      headers: GroupIfMatchHeaders,
      body: ref(GroupMembersReplace),
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 404, 409, 412, 413, 415, 422, 503) }
    },
    config: { scope: 'users:write', accepts: JSON_TYPES }
  }, async (request, reply) => {
    const { group, version } = await replaceMembers(deps, requestContext(request), request.params.group_id, request.body.user_ids, request.headers['if-match'])
    return await reply.header('ETag', groupEtagOf(version)).send(group)
  })

  app.delete('/api/groups/:group_id/members/:user_id', {
    schema: {
      ...common,
      operationId: 'remove_group_member',
      summary: 'Remove Group Member',
      description: 'Takes the user out of the group (the name leaves their `groups`, a `user.updated` and a `group.members_removed`). A user who is not a member is not an error.',
      params: GroupMemberParams,
      headers: GroupIfMatchHeaders,
      response: { 204: { type: 'null', description: 'The user is not a member (any more).' }, ...problems(401, 403, 404, 409, 412, 422, 503) }
    },
    config: { scope: 'users:write' }
  }, async (request, reply) => {
    await removeMember(deps, requestContext(request), request.params.group_id, request.params.user_id, request.headers['if-match'])
    return await reply.code(204).send(null)
  })
}
