import { Type } from 'typebox'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { setNextLink } from '../lib/paging.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import {
  ListAttemptsQuery,
  ListDeliveriesQuery,
  MAX_WEBHOOKS,
  PAGE_MAX,
  Webhook,
  WebhookAttempt,
  WebhookCreate,
  WebhookDelivery,
  WebhookDeliveryParams,
  WebhookIdParams,
  WebhookPatch,
  WebhookReplay,
  WebhookReplayResult,
  WebhookTestResult,
  WebhookWithSecret
} from './webhooks.schemas.ts'
import {
  createWebhook,
  deleteWebhook,
  getWebhook,
  listWebhookAttempts,
  listWebhookDeliveries,
  listWebhooks,
  pingWebhook,
  replayWebhook,
  retryWebhookDelivery,
  rotateWebhookSecret,
  updateWebhook
} from './webhooks.service.ts'
import type { Sender } from './webhooks.sender.ts'

export default async function webhooksRoutes (app: FastifyTypeBox, options: { sender: Sender }): Promise<void> {
  const common = { tags: ['webhooks'], security: SECURITY }
  const config = { scope: 'webhooks:manage' as const, accepts: ['application/json'] }
  const settings = app.config

  app.post('/api/webhooks', {
    schema: {
      ...common,
      operationId: 'create_webhook',
      summary: 'Create Webhook',
      description: 'Registers an endpoint and returns its signing secret once. The URL must be http(s) and, unless WEBHOOK_ALLOW_PRIVATE is set, lead to a public address.',
      body: ref(WebhookCreate),
      response: {
        201: withHeaders({ ...ref(WebhookWithSecret), description: 'The endpoint, with its secret in `secret`.' }, 'Location'),
        ...problems(401, 403, 409, 413, 415, 422, 503)
      }
    },
    config
  }, async (request, reply) => {
    const webhook = await createWebhook(app.db, requestContext(request), settings, request.body)
    return await reply.code(201).header('Location', `${app.config.basePath}/api/webhooks/${webhook.id}`).send(webhook)
  })

  app.get('/api/webhooks', {
    schema: {
      ...common,
      operationId: 'list_webhooks',
      summary: 'List Webhooks',
      description: 'Every endpoint, oldest first, without secrets.',
      response: { 200: { ...Type.Array(ref(Webhook), { maxItems: MAX_WEBHOOKS }), description: 'The endpoints.' }, ...problems(401, 403, 503) }
    },
    config
  }, async () => await listWebhooks(app.db))

  app.get('/api/webhooks/:webhook_id', {
    schema: {
      ...common,
      operationId: 'get_webhook',
      summary: 'Get Webhook',
      description: 'One endpoint, without its secret: its filter, whether it is enabled (and if not, why), and since when it has been failing.',
      params: WebhookIdParams,
      response: { 200: { ...ref(Webhook), description: 'The endpoint, without its secret.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request) => await getWebhook(app.db, request.params.webhook_id))

  app.patch('/api/webhooks/:webhook_id', {
    schema: {
      ...common,
      operationId: 'update_webhook',
      summary: 'Update Webhook',
      description: 'A JSON merge patch (RFC 7396) of `url`, `description`, `event_types` and `enabled`. Enabling a disabled endpoint resumes its queued deliveries.',
      params: WebhookIdParams,
      body: ref(WebhookPatch),
      response: { 200: { ...ref(Webhook), description: 'The updated endpoint.' }, ...problems(401, 403, 404, 413, 415, 422, 503) }
    },
    config: { ...config, accepts: ['application/merge-patch+json', 'application/json'] }
  }, async (request) => await updateWebhook(app.db, requestContext(request), settings, request.params.webhook_id, request.body))

  app.delete('/api/webhooks/:webhook_id', {
    schema: {
      ...common,
      operationId: 'delete_webhook',
      summary: 'Delete Webhook',
      description: 'Removes the endpoint with its queued deliveries and attempt history. Deliveries in flight may still arrive.',
      params: WebhookIdParams,
      response: { 204: { type: 'null', description: 'Deleted.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request, reply) => {
    await deleteWebhook(app.db, requestContext(request), request.params.webhook_id)
    return await reply.code(204).send(null)
  })

  app.post('/api/webhooks/:webhook_id/rotate-secret', {
    schema: {
      ...common,
      operationId: 'rotate_webhook_secret',
      summary: 'Rotate Webhook Secret',
      description: 'A new signing secret, returned once. For WEBHOOK_SECRET_OVERLAP_S (a day by default) deliveries carry a signature with the old secret too, so receivers can switch without losing one.',
      params: WebhookIdParams,
      response: { 200: { ...ref(WebhookWithSecret), description: 'The endpoint, with its new secret in `secret`.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request) => await rotateWebhookSecret(app.db, requestContext(request), settings, request.params.webhook_id))

  app.post('/api/webhooks/:webhook_id/test', {
    schema: {
      ...common,
      operationId: 'test_webhook',
      summary: 'Test Webhook',
      description: 'Sends a signed `webhook.ping` now and reports the answer. It is not queued, retried or recorded.',
      params: WebhookIdParams,
      response: { 200: { ...ref(WebhookTestResult), description: 'What the receiver answered.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request) => await pingWebhook(app.db, requestContext(request), options.sender, request.params.webhook_id))

  app.get('/api/webhooks/:webhook_id/deliveries', {
    schema: {
      ...common,
      operationId: 'list_webhook_deliveries',
      summary: 'List Webhook Deliveries',
      description: 'The events queued for this endpoint, newest first, with their state and next attempt. The next page is in the `Link: rel="next"` header.',
      params: WebhookIdParams,
      querystring: ListDeliveriesQuery,
      response: {
        200: withHeaders({ ...Type.Array(ref(WebhookDelivery), { maxItems: PAGE_MAX }), description: 'Deliveries, newest event first.' }, 'Link'),
        ...problems(401, 403, 404, 422, 503)
      }
    },
    config
  }, async (request, reply) => {
    const page = await listWebhookDeliveries(app.db, request.params.webhook_id, request.query)
    if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
    return page.deliveries
  })

  app.post('/api/webhooks/:webhook_id/deliveries/:event_id/retry', {
    schema: {
      ...common,
      operationId: 'retry_webhook_delivery',
      summary: 'Retry Webhook Delivery',
      description: 'Makes one delivery due now, whatever its state (a failed one gets a fresh retry horizon). It is sent with the same `webhook-id`.',
      params: WebhookDeliveryParams,
      response: { 202: { ...ref(WebhookDelivery), description: 'The delivery, queued.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request, reply) => {
    const delivery = await retryWebhookDelivery(app.db, settings, request.params.webhook_id, request.params.event_id)
    return await reply.code(202).send(delivery)
  })

  app.get('/api/webhooks/:webhook_id/attempts', {
    schema: {
      ...common,
      operationId: 'list_webhook_attempts',
      summary: 'List Webhook Attempts',
      description: 'Every HTTP request made to deliver to this endpoint, newest first: outcome, response code, latency, and when the delivery was scheduled next.',
      params: WebhookIdParams,
      querystring: ListAttemptsQuery,
      response: {
        200: withHeaders({ ...Type.Array(ref(WebhookAttempt), { maxItems: PAGE_MAX }), description: 'Attempts, newest first.' }, 'Link'),
        ...problems(401, 403, 404, 422, 503)
      }
    },
    config
  }, async (request, reply) => {
    const page = await listWebhookAttempts(app.db, request.params.webhook_id, request.query)
    if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
    return page.attempts
  })

  app.post('/api/webhooks/:webhook_id/replay', {
    schema: {
      ...common,
      operationId: 'replay_webhook',
      summary: 'Replay Webhook Events',
      description: 'Queues again every event of a time range that the endpoint\'s filter matches, including events from before the endpoint existed. Each is sent with its usual `webhook-id` (the event id).',
      params: WebhookIdParams,
      body: ref(WebhookReplay),
      response: { 202: { ...ref(WebhookReplayResult), description: 'How many deliveries were queued.' }, ...problems(401, 403, 404, 413, 415, 422, 503) }
    },
    config
  }, async (request, reply) => {
    const result = await replayWebhook(app.db, requestContext(request), settings, request.params.webhook_id, request.body)
    return await reply.code(202).send(result)
  })
}
