import { Type } from 'typebox'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import { ApiKey, ApiKeyCreate, ApiKeyIdParams, ApiKeyWithSecret, ListApiKeysQuery } from './api-keys.schemas.ts'
import { createApiKey, getApiKey, listApiKeysOf, revokeApiKeyById, rotateApiKey } from './api-keys.service.ts'

export default async function apiKeysRoutes (app: FastifyTypeBox): Promise<void> {
  const common = { tags: ['api-keys'], security: SECURITY }
  const config = { scope: 'admin' as const, accepts: ['application/json'] }

  app.post('/api/api-keys', {
    schema: {
      ...common,
      operationId: 'create_api_key',
      summary: 'Create API Key',
      description: 'Creates a key and returns its secret once. Only its SHA-256 digest is stored: a lost secret cannot be shown again; rotate or create another. ' +
        'The key is owned by your user (or by no user, when you call with a key no user owns); one owner holds at most API_KEYS_PER_OWNER (100) live keys, and a create beyond is 409 `too_many_api_keys`.',
      body: ref(ApiKeyCreate),
      response: { 201: withHeaders({ ...ref(ApiKeyWithSecret), description: 'The key, with its secret in `key`.' }, 'Location'), ...problems(401, 403, 409, 413, 415, 422, 503) }
    },
    config
  }, async (request, reply) => {
    const key = await createApiKey(app.db, request.principal!, requestContext(request), request.body, app.config.apiKeysPerOwner)
    return await reply.code(201).header('Location', `${app.config.basePath}/api/api-keys/${key.id}`).send(key)
  })

  app.get('/api/api-keys', {
    schema: {
      ...common,
      operationId: 'list_api_keys',
      summary: 'List API Keys',
      description: 'Every key, without secrets. Revoked keys are left out unless `include_revoked=true`.',
      querystring: ListApiKeysQuery,
      response: { 200: { ...Type.Array(ref(ApiKey)), description: 'The keys, oldest first.' }, ...problems(401, 403, 422, 503) }
    },
    config
  }, async (request) => await listApiKeysOf(app.db, request.query.include_revoked ?? false))

  app.get('/api/api-keys/:key_id', {
    schema: {
      ...common,
      operationId: 'get_api_key',
      summary: 'Get API Key',
      description: 'One key, revoked or not, without its secret.',
      params: ApiKeyIdParams,
      response: { 200: { ...ref(ApiKey), description: 'The key, without its secret.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request) => await getApiKey(app.db, request.params.key_id))

  app.delete('/api/api-keys/:key_id', {
    schema: {
      ...common,
      operationId: 'revoke_api_key',
      summary: 'Revoke API Key',
      description: 'The key is refused from the next request on, by every instance. Revoking a revoked key is not an error.',
      params: ApiKeyIdParams,
      response: { 204: { type: 'null', description: 'Revoked.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config
  }, async (request, reply) => {
    await revokeApiKeyById(app.db, requestContext(request), request.params.key_id)
    return await reply.code(204).send(null)
  })

  app.post('/api/api-keys/:key_id/rotate', {
    schema: {
      ...common,
      operationId: 'rotate_api_key',
      summary: 'Rotate API Key',
      description: 'Gives the key a new secret (same id, name, scopes and expiry). The old secret stops working at once.',
      params: ApiKeyIdParams,
      response: { 200: { ...ref(ApiKeyWithSecret), description: 'The key, with its new secret in `key`.' }, ...problems(401, 403, 404, 409, 422, 503) }
    },
    config
  }, async (request) => await rotateApiKey(app.db, requestContext(request), request.params.key_id))
}
