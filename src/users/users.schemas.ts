import { Type, type Static } from 'typebox'
import { Nullable } from '../lib/openapi.ts'

/** Letters, digits and . _ @ -; ASCII so case-folding means the same in every database and client. */
export const USERNAME_PATTERN = '^[A-Za-z0-9._@-]{1,64}$'

const Username = Type.String({
  minLength: 1,
  maxLength: 64,
  pattern: USERNAME_PATTERN,
  description: 'Letters, digits and `._@-`; unique ignoring case; stored as given.',
  examples: ['ada.lovelace']
})
const Email = Type.String({ format: 'email', maxLength: 254, description: 'Unique ignoring case.', examples: ['ada@example.com'] })
const Name = Type.String({ maxLength: 200 })
const Role = Type.Union([Type.Literal('admin'), Type.Literal('user')], { description: 'Only an admin may set it.' })
const Group = Type.String({ minLength: 1, maxLength: 64 })
const Groups = Type.Array(Group, { maxItems: 100, uniqueItems: true, description: 'Labels the main service maps to permissions.' })
const Password = Type.String({
  minLength: 1,
  maxLength: 1024,
  format: 'password',
  writeOnly: true,
  description: 'Write-only: never returned. 8 to 256 characters, not containing the username.'
})
const Timestamp = Type.String({ format: 'date-time' })
const NullableTimestamp = Nullable(Timestamp)

export const User = Type.Object({
  id: Type.String({ format: 'uuid', description: 'Server-assigned, immutable; the `user_id` of the other operations.' }),
  username: Type.String(),
  email: Nullable(Type.String()),
  first_name: Nullable(Type.String()),
  last_name: Nullable(Type.String()),
  role: Role,
  groups: Type.Array(Type.String()),
  disabled: Type.Boolean(),
  created_at: Timestamp,
  updated_at: Timestamp,
  last_login_at: NullableTimestamp,
  password_changed_at: NullableTimestamp
}, { $id: 'User', additionalProperties: false, description: 'A person account of the web UI.' })
export type User = Static<typeof User>

export const UserCreate = Type.Object({
  username: Username,
  password: Type.Optional(Password),
  email: Type.Optional(Nullable(Email)),
  first_name: Type.Optional(Nullable(Name)),
  last_name: Type.Optional(Nullable(Name)),
  role: Type.Optional(Role),
  groups: Type.Optional(Groups),
  disabled: Type.Optional(Type.Boolean())
}, {
  $id: 'UserCreate',
  additionalProperties: false,
  description: 'A new user. Unknown and read-only fields (`id`, timestamps, `password_hash`) are rejected with 422. ' +
    'Without a password the user exists but cannot sign in until one is set.'
})
export type UserCreate = Static<typeof UserCreate>

export const UserPatch = Type.Object({
  username: Type.Optional(Username),
  password: Type.Optional(Password),
  email: Type.Optional(Nullable(Email)),
  first_name: Type.Optional(Nullable(Name)),
  last_name: Type.Optional(Nullable(Name)),
  role: Type.Optional(Role),
  groups: Type.Optional(Groups),
  disabled: Type.Optional(Type.Boolean({ description: 'Disabling ends the user\'s API keys.' }))
}, {
  $id: 'UserPatch',
  additionalProperties: false,
  description: 'A JSON merge patch (RFC 7396): fields present are set, `null` clears an optional field, absent fields stay.'
})
export type UserPatch = Static<typeof UserPatch>

export const SORTS = ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at'] as const
export type Sort = typeof SORTS[number]

export const ListUsersQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'Page size. Without it, every matching user is returned in one streamed array.' })),
  cursor: Type.Optional(Type.String({ maxLength: 1024, description: 'From the `Link: rel="next"` header of the previous page.' })),
  q: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'Substring of username, email, first or last name, ignoring case.' })),
  username: Type.Optional(Type.String({ maxLength: 64, description: 'Exact username, ignoring case.' })),
  email: Type.Optional(Type.String({ maxLength: 254, description: 'Exact email, ignoring case.' })),
  role: Type.Optional(Role),
  group: Type.Optional(Group),
  disabled: Type.Optional(Type.Boolean()),
  sort: Type.Optional(Type.Enum(SORTS, { default: 'created_at', description: 'Field to order by; `-` for descending.' }))
}, { additionalProperties: false })
export type ListUsersQuery = Static<typeof ListUsersQuery>

export const UserIdParams = Type.Object({
  user_id: Type.String({ format: 'uuid', description: 'The `id` of a user, as the list operation returns it.' })
})
export type UserIdParams = Static<typeof UserIdParams>

export const IfMatchHeaders = Type.Object({
  'if-match': Type.Optional(Type.String({ maxLength: 256, description: 'The `ETag` you read; the change is refused with 412 if the user changed since.' }))
})
