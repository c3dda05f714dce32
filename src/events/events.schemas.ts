import { Type, type Static } from 'typebox'
import { Nullable } from '../lib/openapi.ts'

export const EVENT_TYPES = [
  'user.created', 'user.updated', 'user.deleted',
  'api_key.created', 'api_key.revoked', 'api_key.rotated',
  'user.login_succeeded', 'user.login_failed', 'user.locked', 'user.password_changed', 'session.ended'
] as const
export type EventType = typeof EVENT_TYPES[number]

export const Event = Type.Object({
  id: Type.String({ format: 'uuid', description: 'Time-ordered (UUID v7).' }),
  type: Type.String({ description: 'What happened, e.g. `user.created`. Stable; see docs/api.md#events.', examples: ['user.created'] }),
  occurred_at: Type.String({ format: 'date-time' }),
  actor: Type.Object({
    type: Type.Union([Type.Literal('api_key'), Type.Literal('user'), Type.Literal('system')]),
    id: Nullable(Type.String(), { description: 'The key or user id; null for the system itself.' })
  }),
  target: Type.Union([Type.Object({ type: Type.String(), id: Type.String() }), Type.Null()]),
  request_id: Nullable(Type.String()),
  client_ip: Nullable(Type.String()),
  data: Type.Record(Type.String(), Type.Unknown(), { description: 'The changed fields; secrets appear only as "[redacted]".' })
}, { $id: 'Event', additionalProperties: false })
export type Event = Static<typeof Event>

export const ListEventsQuery = Type.Object({
  type: Type.Optional(Type.String({ maxLength: 64, description: 'Only events of this type.' })),
  actor_id: Type.Optional(Type.String({ maxLength: 64 })),
  target_id: Type.Optional(Type.String({ maxLength: 64 })),
  since: Type.Optional(Type.String({ format: 'date-time', description: 'Only events at or after this time.' })),
  until: Type.Optional(Type.String({ format: 'date-time', description: 'Only events before this time.' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  cursor: Type.Optional(Type.String({ maxLength: 512, description: 'From the `Link: rel="next"` header of the previous page.' }))
}, { additionalProperties: false })
export type ListEventsQuery = Static<typeof ListEventsQuery>
