import { Type, type Static } from 'typebox'
import { Nullable, Timestamp, Uuid } from '../lib/openapi.ts'
import { SCOPES, ScopeSchema } from '../auth/principal.ts'

const NullableTimestamp = Nullable(Timestamp())
const Name = Type.String({ minLength: 1, maxLength: 100, description: 'What the key is for, e.g. "nightly export".' })
// Unique, so never more than there are scopes.
const Scopes = Type.Array(ScopeSchema, { minItems: 1, maxItems: SCOPES.length, uniqueItems: true })

export const ApiKey = Type.Object({
  id: Uuid(),
  name: Name,
  // `gatehouse_` and six more characters, or the first eight of a key given in another form (GATEHOUSE_ADMIN_API_KEY).
  prefix: Type.String({ maxLength: 16, description: 'The visible start of the secret, to recognise the key; not enough to use it.' }),
  scopes: Scopes,
  user_id: Nullable(Uuid(), { description: 'The user the key acts for; null for deployment keys.' }),
  created_at: Timestamp(),
  expires_at: NullableTimestamp,
  last_used_at: Nullable(Timestamp(), { description: 'Updated at most once a minute.' }),
  revoked_at: NullableTimestamp
}, { $id: 'ApiKey', additionalProperties: false })
export type ApiKey = Static<typeof ApiKey>

export const ApiKeyWithSecret = Type.Object({
  ...ApiKey.properties,
  key: Type.String({ maxLength: 53, pattern: '^gatehouse_[0-9A-Za-z]{43}$', description: 'The secret. Shown only in this response: store it now.' })
}, { $id: 'ApiKeyWithSecret', additionalProperties: false })
export type ApiKeyWithSecret = Static<typeof ApiKeyWithSecret>

export const ApiKeyCreate = Type.Object({
  name: Name,
  scopes: Type.Optional(Type.Array(ScopeSchema, { minItems: 1, maxItems: SCOPES.length, uniqueItems: true, description: 'Defaults to `admin`, the access of the main API\'s keys.' })),
  expires_at: Type.Optional(Nullable(Timestamp(), { description: 'After this instant the key is refused. Null or absent: no expiry.' }))
}, { $id: 'ApiKeyCreate', additionalProperties: false })
export type ApiKeyCreate = Static<typeof ApiKeyCreate>

export const ApiKeyIdParams = Type.Object({
  key_id: Uuid()
})
export type ApiKeyIdParams = Static<typeof ApiKeyIdParams>

export const ListApiKeysQuery = Type.Object({
  include_revoked: Type.Optional(Type.Boolean({ default: false }))
}, { additionalProperties: false })
export type ListApiKeysQuery = Static<typeof ListApiKeysQuery>
