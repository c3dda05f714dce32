import { Type, type Static } from 'typebox'
import { Nullable, Timestamp, Uuid } from '../lib/openapi.ts'

/** `*`, an exact type (`user.created`) or a prefix wildcard (`user.*`). */
export const EVENT_FILTER_PATTERN = '^(\\*|[a-z][a-z_]*\\.(\\*|[a-z][a-z_]*))$'
export const MAX_EVENT_FILTERS = 50
/** Endpoints are few (each one is matched on every event): a bound on the list, and on what one deployment may create. */
export const MAX_WEBHOOKS = 100

/** Text on one line or several, without control characters (NUL, escape sequences) that could garble a log or a terminal. */
export const PLAIN_TEXT_PATTERN = '^[^\\x00-\\x08\\x0B-\\x1F\\x7F]*$'
const INT32_MAX = 2_147_483_647
/** Paging cursors are base64url. */
const Cursor = Type.String({ maxLength: 512, pattern: '^[A-Za-z0-9_-]*$', description: 'From the `Link: rel="next"` header of the previous page.' })

const Url = Type.String({
  minLength: 8,
  maxLength: 2048,
  format: 'uri',
  pattern: '^[Hh][Tt][Tt][Pp][Ss]?://',
  description: 'Where deliveries are POSTed: http or https. Internal addresses (loopback, private, link-local…) are refused unless WEBHOOK_ALLOW_PRIVATE is set.',
  examples: ['https://hooks.example.com/gatehouse']
})
const Description = Type.String({ maxLength: 500, pattern: PLAIN_TEXT_PATTERN, description: 'What the endpoint is for.' })
const EventFilter = Type.Array(Type.String({ minLength: 1, maxLength: 64, pattern: EVENT_FILTER_PATTERN }), {
  minItems: 1,
  maxItems: MAX_EVENT_FILTERS,
  uniqueItems: true,
  description: 'Event types to deliver: exact types (`user.created`), a prefix wildcard (`user.*`), or `*` for every type.',
  examples: [['user.*', 'api_key.revoked']]
})
const DisabledReason = Type.Union([Type.Literal('manual'), Type.Literal('gone'), Type.Literal('failing'), Type.Null()], {
  description: 'Why the endpoint is disabled: `manual` (through the API), `gone` (the receiver answered 410) or `failing` (it failed for longer than the retry horizon). Null while enabled.'
})
const Secret = Type.String({
  maxLength: 64,
  pattern: '^whsec_[A-Za-z0-9+/=]+$',
  description: 'The signing secret (Standard Webhooks: `whsec_` and base64 of 32 random bytes). Shown only in this response: store it now.'
})

export const Webhook = Type.Object({
  id: Uuid(),
  url: Url,
  description: Nullable(Description),
  event_types: EventFilter,
  enabled: Type.Boolean(),
  disabled_reason: DisabledReason,
  failing_since: Nullable(Timestamp(), { description: 'Since when it has been failing: the queue time of the oldest event it failed to take since its last success. Null while deliveries succeed.' }),
  previous_secret_expires_at: Nullable(Timestamp(), { description: 'Until then deliveries are also signed with the secret before the last rotation.' }),
  created_at: Timestamp(),
  updated_at: Timestamp()
}, { $id: 'Webhook', additionalProperties: false, description: 'An endpoint that receives events, signed per Standard Webhooks.' })
export type Webhook = Static<typeof Webhook>

export const WebhookWithSecret = Type.Object({
  ...Webhook.properties,
  secret: Secret
}, { $id: 'WebhookWithSecret', additionalProperties: false })
export type WebhookWithSecret = Static<typeof WebhookWithSecret>

export const WebhookCreate = Type.Object({
  url: Url,
  description: Type.Optional(Nullable(Description)),
  event_types: Type.Optional(EventFilter),
  enabled: Type.Optional(Type.Boolean({ default: true }))
}, {
  $id: 'WebhookCreate',
  additionalProperties: false,
  description: 'A new endpoint. `event_types` defaults to `["*"]` (every event).',
  examples: [{ url: 'https://hooks.example.com/gatehouse', description: 'pipeline user sync', event_types: ['user.*'] }]
})
export type WebhookCreate = Static<typeof WebhookCreate>

export const WebhookPatch = Type.Object({
  url: Type.Optional(Url),
  description: Type.Optional(Nullable(Description)),
  event_types: Type.Optional(EventFilter),
  enabled: Type.Optional(Type.Boolean({ description: 'Enabling a disabled endpoint resumes its queued deliveries.' }))
}, { $id: 'WebhookPatch', additionalProperties: false, description: 'A JSON merge patch: only the fields sent change.' })
export type WebhookPatch = Static<typeof WebhookPatch>

export const WebhookIdParams = Type.Object({ webhook_id: Uuid() })
export type WebhookIdParams = Static<typeof WebhookIdParams>

export const WebhookDeliveryParams = Type.Object({ webhook_id: Uuid(), event_id: Uuid() })
export type WebhookDeliveryParams = Static<typeof WebhookDeliveryParams>

const DeliveryStatus = Type.Union([Type.Literal('pending'), Type.Literal('delivered'), Type.Literal('failed')], {
  description: '`pending`: queued or being retried; `delivered`: a 2xx answer; `failed`: given up after the retry horizon.'
})
const ErrorText = Type.String({ maxLength: 512, pattern: PLAIN_TEXT_PATTERN, description: 'Why no usable answer came: a timeout, a refused address, a connection error.' })
const StatusCode = Type.Integer({ format: 'int32', minimum: 100, maximum: 599 })
const EventType = Type.String({ maxLength: 64, pattern: '^[a-z_]+\\.[a-z_]+$' })

export const WebhookDelivery = Type.Object({
  event_id: Uuid({ description: 'The event, and the `webhook-id` of every attempt to deliver it.' }),
  event_type: Nullable(EventType),
  status: DeliveryStatus,
  attempts: Type.Integer({ format: 'int32', minimum: 0, maximum: INT32_MAX }),
  next_attempt_at: Nullable(Timestamp(), { description: 'When it is tried next; null unless pending.' }),
  last_attempt_at: Nullable(Timestamp()),
  last_status_code: Nullable(StatusCode),
  last_error: Nullable(ErrorText),
  created_at: Timestamp(),
  delivered_at: Nullable(Timestamp())
}, { $id: 'WebhookDelivery', additionalProperties: false, description: 'One event queued for one endpoint.' })
export type WebhookDelivery = Static<typeof WebhookDelivery>

export const WebhookAttempt = Type.Object({
  id: Uuid(),
  event_id: Uuid(),
  event_type: Nullable(EventType),
  attempted_at: Timestamp(),
  succeeded: Type.Boolean(),
  status_code: Nullable(StatusCode, { description: 'The receiver\'s HTTP status; null when none came.' }),
  latency_ms: Type.Integer({ format: 'int32', minimum: 0, maximum: INT32_MAX }),
  error: Nullable(ErrorText),
  next_attempt_at: Nullable(Timestamp(), { description: 'When the delivery was scheduled next after this attempt; null when it succeeded or was given up.' })
}, { $id: 'WebhookAttempt', additionalProperties: false, description: 'One HTTP request to deliver an event.' })
export type WebhookAttempt = Static<typeof WebhookAttempt>

export const PAGE_MAX = 1000

export const ListDeliveriesQuery = Type.Object({
  status: Type.Optional(DeliveryStatus),
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: PAGE_MAX, default: 100 })),
  cursor: Type.Optional(Cursor)
}, { additionalProperties: false })
export type ListDeliveriesQuery = Static<typeof ListDeliveriesQuery>

export const ListAttemptsQuery = Type.Object({
  event_id: Type.Optional(Uuid({ description: 'Only the attempts to deliver this event.' })),
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: PAGE_MAX, default: 100 })),
  cursor: Type.Optional(Cursor)
}, { additionalProperties: false })
export type ListAttemptsQuery = Static<typeof ListAttemptsQuery>

export const WebhookReplay = Type.Object({
  since: Timestamp({ description: 'Events at or after this time…' }),
  until: Type.Optional(Timestamp({ description: '…and before this time (default: now).' }))
}, { $id: 'WebhookReplay', additionalProperties: false, description: 'A time range of events to deliver again.' })
export type WebhookReplay = Static<typeof WebhookReplay>

export const WebhookReplayResult = Type.Object({
  queued: Type.Integer({ format: 'int32', minimum: 0, maximum: INT32_MAX, description: 'Deliveries queued (new, or made due again).' })
}, { $id: 'WebhookReplayResult', additionalProperties: false })
export type WebhookReplayResult = Static<typeof WebhookReplayResult>

export const WebhookTestResult = Type.Object({
  ok: Type.Boolean({ description: 'The receiver answered 2xx.' }),
  webhook_id: Uuid({ description: 'The `webhook-id` the ping was sent with.' }),
  status_code: Nullable(StatusCode),
  latency_ms: Type.Integer({ format: 'int32', minimum: 0, maximum: INT32_MAX }),
  error: Nullable(ErrorText)
}, { $id: 'WebhookTestResult', additionalProperties: false, description: 'The outcome of a `webhook.ping` sent now.' })
export type WebhookTestResult = Static<typeof WebhookTestResult>

export const WEBHOOK_SCHEMAS = [Webhook, WebhookWithSecret, WebhookCreate, WebhookPatch, WebhookDelivery, WebhookAttempt, WebhookReplay, WebhookReplayResult, WebhookTestResult]
