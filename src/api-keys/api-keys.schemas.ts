import { Type, type Static } from 'typebox'
import { Nullable } from '../lib/openapi.ts'
import { ScopeSchema } from '../auth/principal.ts'

const Timestamp = Type.String({ format: 'date-time' })
const NullableTimestamp = Nullable(Timestamp)

export const ApiKey = Type.Object({
  id: Type.String({ format: 'uuid' }),
  name: Type.String(),
  prefix: Type.String({ description: 'The visible start of the secret, to recognise the key; not enough to use it.' }),
  scopes: Type.Array(ScopeSchema),
  user_id: Nullable(Type.String({ format: 'uuid' }), { description: 'The user the key acts for; null for deployment keys.' }),
  created_at: Timestamp,
  expires_at: NullableTimestamp,
  last_used_at: Nullable(Timestamp, { description: 'Updated at most once a minute.' }),
  revoked_at: NullableTimestamp
}, { $id: 'ApiKey', additionalProperties: false })
export type ApiKey = Static<typeof ApiKey>

export const ApiKeyWithSecret = Type.Object({
  ...ApiKey.properties,
  key: Type.String({ description: 'The secret. Shown only in this response: store it now.' })
}, { $id: 'ApiKeyWithSecret', additionalProperties: false })
export type ApiKeyWithSecret = Static<typeof ApiKeyWithSecret>

export const ApiKeyCreate = Type.Object({
  name: Type.String({ minLength: 1, maxLength: 100, description: 'What the key is for, e.g. "nightly export".' }),
  scopes: Type.Optional(Type.Array(ScopeSchema, { minItems: 1, uniqueItems: true, description: 'Defaults to `admin`, the access of the main API\'s keys.' })),
  expires_at: Type.Optional(Nullable(Timestamp, { description: 'After this instant the key is refused. Null or absent: no expiry.' }))
}, { $id: 'ApiKeyCreate', additionalProperties: false })
export type ApiKeyCreate = Static<typeof ApiKeyCreate>

export const ApiKeyIdParams = Type.Object({
  key_id: Type.String({ format: 'uuid' })
})
export type ApiKeyIdParams = Static<typeof ApiKeyIdParams>

export const ListApiKeysQuery = Type.Object({
  include_revoked: Type.Optional(Type.Boolean({ default: false }))
}, { additionalProperties: false })
export type ListApiKeysQuery = Static<typeof ListApiKeysQuery>
