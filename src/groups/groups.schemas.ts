import { Type, type Static } from 'typebox'
import { Nullable, Timestamp, Uuid } from '../lib/openapi.ts'

/** As a member's `groups` array holds it (users.schemas.ts): the same bounds, so every group name fits there. */
export const GroupName = Type.String({ minLength: 1, maxLength: 64, description: 'Unique ignoring case (`Data` and `data` are one name); what a member\'s `groups` array holds, in this spelling.', examples: ['analysts'] })
const ExternalId = Type.String({ minLength: 1, maxLength: 256, description: 'A provisioning client\'s own id for the group (SCIM `externalId`); stored, never interpreted.' })

/** The most users one request adds to a group, or that a new group starts with. */
export const MEMBERS_MAX_PER_REQUEST = 1000

export const Group = Type.Object({
  id: Uuid({ description: 'Server-assigned, immutable; the `group_id` of the other operations.' }),
  display_name: GroupName,
  external_id: Nullable(ExternalId),
  member_count: Type.Integer({ format: 'int32', minimum: 0, maximum: 2_147_483_647, description: 'Users in the group.' }),
  created_at: Timestamp(),
  updated_at: Timestamp({ description: 'Its last rename or change of members.' })
}, { $id: 'Group', additionalProperties: false, description: 'A group of users. Its name is in each member\'s `groups`; renaming or deleting it changes every member.' })
export type Group = Static<typeof Group>

const MemberIds = Type.Array(Uuid({ description: 'A user\'s `id`.' }), { minItems: 1, maxItems: MEMBERS_MAX_PER_REQUEST, uniqueItems: true })

export const GroupCreate = Type.Object({
  display_name: GroupName,
  external_id: Type.Optional(Nullable(ExternalId)),
  member_ids: Type.Optional(Type.Array(Uuid(), { maxItems: MEMBERS_MAX_PER_REQUEST, uniqueItems: true, description: 'Users the group starts with.' }))
}, { $id: 'GroupCreate', additionalProperties: false, description: 'A new group.', examples: [{ display_name: 'analysts' }] })
export type GroupCreate = Static<typeof GroupCreate>

export const GroupPatch = Type.Object({
  display_name: Type.Optional(GroupName),
  external_id: Type.Optional(Nullable(ExternalId))
}, {
  $id: 'GroupPatch',
  additionalProperties: false,
  description: 'A JSON merge patch (RFC 7396). A new `display_name` renames the group in every member\'s `groups`.',
  examples: [{ display_name: 'data-analysts' }]
})
export type GroupPatch = Static<typeof GroupPatch>

export const GroupMembersChange = Type.Object({
  user_ids: MemberIds
}, { $id: 'GroupMembersChange', additionalProperties: false, description: 'Users to add to the group.' })
export type GroupMembersChange = Static<typeof GroupMembersChange>

export const GroupMembersReplace = Type.Object({
  user_ids: Type.Array(Uuid({ description: 'A user\'s `id`.' }), { maxItems: MEMBERS_MAX_PER_REQUEST, uniqueItems: true })
}, { $id: 'GroupMembersReplace', additionalProperties: false, description: 'The group\'s members, all of them: users not listed leave it (`[]` empties it).' })
export type GroupMembersReplace = Static<typeof GroupMembersReplace>

export const GROUP_SCHEMAS = [Group, GroupCreate, GroupPatch, GroupMembersChange, GroupMembersReplace]

export const ListGroupsQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: 1000, default: 100, description: 'Page size; the next page is in the `Link: rel="next"` header.' })),
  cursor: Type.Optional(Type.String({ maxLength: 1024, description: 'From the `Link: rel="next"` header of the previous page.' })),
  display_name: Type.Optional(Type.String({ minLength: 1, maxLength: 64, description: 'The name, ignoring case.' })),
  q: Type.Optional(Type.String({ minLength: 1, maxLength: 64, description: 'Substring of the name, ignoring case.' })),
  external_id: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'Exact external id.' }))
}, { additionalProperties: false })
export type ListGroupsQuery = Static<typeof ListGroupsQuery>

export const ListGroupMembersQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: 1000, default: 100, description: 'Page size; the next page is in the `Link: rel="next"` header.' })),
  cursor: Type.Optional(Type.String({ maxLength: 1024, description: 'From the `Link: rel="next"` header of the previous page.' }))
}, { additionalProperties: false })
export type ListGroupMembersQuery = Static<typeof ListGroupMembersQuery>

export const GroupIdParams = Type.Object({
  group_id: Uuid({ description: 'The `id` of a group.' })
})

export const GroupMemberParams = Type.Object({
  group_id: Uuid({ description: 'The `id` of a group.' }),
  user_id: Uuid({ description: 'The `id` of a user.' })
})

export const GroupIfMatchHeaders = Type.Object({
  'if-match': Type.Optional(Type.String({ maxLength: 256, description: 'The `ETag` you read; the change is refused with 412 if the group changed since.' }))
})
