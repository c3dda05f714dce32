import { Type, type Static } from 'typebox'
import { Nullable, REQUEST_ID_PATTERN, Timestamp, Uuid } from '../lib/openapi.ts'

export const EVENT_TYPES = [
  'user.created', 'user.updated', 'user.deleted',
  'api_key.created', 'api_key.revoked', 'api_key.rotated',
  'user.login_succeeded', 'user.login_failed', 'user.login_throttled', 'user.locked', 'user.unlocked', 'user.password_changed', 'session.ended',
  'user.mfa_challenged', 'user.mfa_failed', 'user.totp_enrolled', 'user.totp_removed',
  'user.passkey_added', 'user.passkey_renamed', 'user.passkey_removed',
  'user.recovery_codes_generated', 'user.recovery_code_used', 'user.mfa_reset', 'user.reauthenticated', 'user.reauthentication_failed',
  'user.identity_linked',
  'user.identity_unlinked', 'user.sso_login_succeeded', 'user.sso_login_failed',
  'sso_provider.created', 'sso_provider.updated', 'sso_provider.deleted',
  'user.invited', 'user.invitation_revoked', 'user.invitation_accepted',
  'user.password_reset_requested', 'user.password_reset',
  'user.email_verification_sent', 'user.email_verified',
  'group.created', 'group.updated', 'group.deleted', 'group.members_added', 'group.members_removed',
  'webhook.created', 'webhook.updated', 'webhook.deleted', 'webhook.disabled', 'webhook.secret_rotated', 'webhook.replayed',
  'mail.sent', 'mail.failed',
  'database_role.created', 'database_role.dropped'
] as const
export type EventType = typeof EVENT_TYPES[number]

/** `user`, `api_key`, `session`: a kind of record. */
const RecordKind = Type.String({ maxLength: 32, pattern: '^[a-z_]+$' })

export const Event = Type.Object({
  id: Uuid({ description: 'Time-ordered (UUID v7).' }),
  type: Type.String({ maxLength: 64, pattern: '^[a-z_]+\\.[a-z_]+$', description: 'What happened, e.g. `user.created`. Stable; see docs/api.md#events.', examples: ['user.created'] }),
  occurred_at: Timestamp(),
  actor: Type.Object({
    type: Type.Union([Type.Literal('api_key'), Type.Literal('user'), Type.Literal('system')]),
    // A key's or user's UUID, or `cli` for the gatehouse command's local operations.
    id: Nullable(Type.String({ maxLength: 36, pattern: '^[0-9A-Za-z-]+$' }), { description: 'The key or user id; `cli` for the command line; null for the system itself.' })
  }),
  target: Type.Union([Type.Object({ type: RecordKind, id: Uuid() }), Type.Null()]),
  request_id: Nullable(Type.String({ maxLength: 64, pattern: REQUEST_ID_PATTERN })),
  client_ip: Nullable(Type.String({ description: 'The client address as the service saw it (through a trusted proxy: as the proxy reported it).' })),
  data: Type.Record(Type.String(), Type.Unknown(), { description: 'The changed fields; secrets appear only as "[redacted]".' }),
  trace_id: Type.Optional(Type.String({ minLength: 32, maxLength: 32, pattern: '^[0-9a-f]{32}$', description: 'The W3C trace id of the request that recorded it, when this deployment exports traces (docs/operations.md#traces); absent otherwise.' }))
}, { $id: 'Event', additionalProperties: false })
export type Event = Static<typeof Event>

/** The largest page of events. */
export const EVENTS_PAGE_MAX = 1000

export const ListEventsQuery = Type.Object({
  type: Type.Optional(Type.String({ maxLength: 64, description: 'Only events of this type.' })),
  actor_id: Type.Optional(Type.String({ maxLength: 64 })),
  target_id: Type.Optional(Type.String({ maxLength: 64 })),
  since: Type.Optional(Timestamp({ description: 'Only events at or after this time (inclusive). With `since` or `until` the events are ordered by `occurred_at`, then id, newest first, and read through an index on the time.' })),
  until: Type.Optional(Timestamp({ description: 'Only events before this time (exclusive).' })),
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: EVENTS_PAGE_MAX, default: 100 })),
  cursor: Type.Optional(Type.String({ maxLength: 512, description: 'From the `Link: rel="next"` header of the previous page.' }))
}, { additionalProperties: false })
export type ListEventsQuery = Static<typeof ListEventsQuery>
