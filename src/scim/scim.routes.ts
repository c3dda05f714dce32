import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { AppError, logFailure, toAppError, type ErrorCode } from '../errors.ts'
import { jsonParserWithPosition } from '../lib/json-body.ts'
import { checkPasswordPolicy, passwordPolicyOf, type PasswordOwner } from '../lib/password-policy.ts'
import {
  IfMatchHeaders,
  MAX_RESULTS,
  SCIM_CONTENT_TYPE,
  SCIM_MEDIA_TYPES,
  ScimAttributesQuery,
  ScimIdParams,
  ScimListQuery,
  ScimPatchBody,
  ScimResourceBody,
  URN,
  USER_SCHEMA,
  ENTERPRISE_USER_SCHEMA,
  GROUP_SCHEMA,
  type ScimType
} from './scim.schemas.ts'
import { createScimGroup, deleteScimGroup, getScimGroup, listScimGroupsPage, patchScimGroup, replaceScimGroup } from './scim-groups.service.ts'
import { createScimUser, deleteScimUser, getScimUser, listScimUsersPage, patchScimUser, replaceScimUser } from './scim-users.service.ts'
import { etagOf, project, type ScimContext } from './scim.resources.ts'

const ENDPOINTS = ['Users', 'Groups', 'ServiceProviderConfig', 'serviceConfiguration', 'ResourceTypes', 'Schemas']
const ENDPOINT_BY_CASE = new Map(ENDPOINTS.map(name => [name.toLowerCase(), name]))

/**
 * The URL with the SCIM endpoint's name spelled as routed: clients send
 * `/users` (Microsoft's conformance collection does) as well as `/Users`.
 * Given to Fastify as `rewriteUrl` (app.ts); any other URL is left as it is.
 */
export function canonicalScimUrl (url: string, basePath: string): string {
  const start = `${basePath}/scim/v2/`
  if (!url.startsWith(start)) return url
  const rest = url.slice(start.length)
  const end = rest.search(/[/?]/)
  const name = end === -1 ? rest : rest.slice(0, end)
  const canonical = ENDPOINT_BY_CASE.get(name.toLowerCase())
  return canonical === undefined || canonical === name ? url : start + canonical + (end === -1 ? '' : rest.slice(end))
}

/** Our codes as SCIM's error types (RFC 7644 §3.12); the status follows SCIM where it differs from the REST API's. */
const SCIM_ERRORS: Partial<Record<ErrorCode, { status?: number, scimType?: ScimType }>> = {
  validation_failed: { status: 400, scimType: 'invalidValue' },
  malformed_body: { scimType: 'invalidSyntax' },
  invalid_value: { scimType: 'invalidValue' },
  invalid_filter: { scimType: 'invalidFilter' },
  invalid_path: { scimType: 'invalidPath' },
  username_taken: { scimType: 'uniqueness' },
  email_taken: { scimType: 'uniqueness' },
  conflict: { scimType: 'uniqueness' },
  last_admin: { scimType: 'mutability' },
  group_exists: { scimType: 'uniqueness' },
  password_too_short: { status: 400, scimType: 'invalidValue' },
  password_too_long: { status: 400, scimType: 'invalidValue' },
  password_contains_username: { status: 400, scimType: 'invalidValue' },
  password_contains_email: { status: 400, scimType: 'invalidValue' },
  password_contains_context_word: { status: 400, scimType: 'invalidValue' },
  password_too_common: { status: 400, scimType: 'invalidValue' },
  too_many_groups: { scimType: 'invalidValue' }
}

/** An error as SCIM's error body (RFC 7644 §3.12), with the headers the error carries (WWW-Authenticate, Retry-After). */
function sendScimError (reply: FastifyReply, error: AppError): FastifyReply {
  const mapped = SCIM_ERRORS[error.code]
  const status = mapped?.status ?? error.status
  for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
  return reply.code(status).type(SCIM_CONTENT_TYPE).send({
    schemas: [URN.error],
    status: String(status),
    ...(mapped?.scimType !== undefined ? { scimType: mapped.scimType } : {}),
    detail: error.detail
  })
}

function baseUrlOf (request: FastifyRequest, prefix: string): string {
  return `${request.protocol}://${request.host}${prefix}`
}

const SERVICE_PROVIDER_CONFIG = {
  schemas: [URN.serviceProviderConfig],
  documentationUri: 'https://github.com/gatehouse/gatehouse/blob/main/docs/scim.md',
  patch: { supported: true },
  bulk: { supported: false, maxOperations: 0, maxPayloadSize: 0 },
  filter: { supported: true, maxResults: MAX_RESULTS },
  changePassword: { supported: true },
  sort: { supported: true },
  etag: { supported: true },
  authenticationSchemes: [{
    type: 'oauthbearertoken',
    name: 'Bearer token',
    description: 'An API key with the scim scope, as "Authorization: Bearer <key>".',
    primary: true
  }],
  meta: { resourceType: 'ServiceProviderConfig', location: '/ServiceProviderConfig' }
}

const GROUP_RESOURCE_TYPE = {
  schemas: [URN.resourceType],
  id: 'Group',
  name: 'Group',
  endpoint: '/Groups',
  description: 'Group',
  schema: URN.group,
  schemaExtensions: [],
  meta: { resourceType: 'ResourceType', location: '/ResourceTypes/Group' }
}

const USER_RESOURCE_TYPE = {
  schemas: [URN.resourceType],
  id: 'User',
  name: 'User',
  endpoint: '/Users',
  description: 'User Account',
  schema: URN.user,
  schemaExtensions: [{ schema: URN.enterpriseUser, required: false }],
  meta: { resourceType: 'ResourceType', location: '/ResourceTypes/User' }
}

/**
 * SCIM 2.0 (RFC 7643, RFC 7644) at {base}/scim/v2, for identity providers'
 * provisioning (docs/scim.md). Only a key with the `scim` scope reaches it.
 * In its own plugin: the SCIM media type, SCIM's error bodies and its 404
 * are this door's alone. Hidden from the OpenAPI document, which describes
 * gatehouse's own API; SCIM clients read /Schemas.
 */
export default async function scimRoutes (app: FastifyTypeBox): Promise<void> {
  // Registered at {base}/scim/v2 (app.ts): its own prefix, so that its 404 answers there only.
  const prefix = ''
  const parseJson = jsonParserWithPosition(app)
  // SCIM clients send the JSON type also on bodiless requests (a DELETE): no body is no body, not an empty JSON text.
  const parseScimJson: typeof parseJson = (request, body, done) => { body === '' ? done(null, undefined) : parseJson(request, body, done) }
  app.removeContentTypeParser('application/json')
  for (const type of SCIM_MEDIA_TYPES) app.addContentTypeParser(type, { parseAs: 'string', bodyLimit: app.config.bodyLimitBytes }, parseScimJson)

  app.setErrorHandler((error: unknown, request, reply) => {
    const appError = toAppError(error)
    logFailure(request.log, appError, error)
    return sendScimError(reply, appError)
  })
  app.setNotFoundHandler((request, reply) => {
    return sendScimError(reply, new AppError('route_not_found', 404, `No SCIM endpoint at ${request.method} ${request.url.split('?')[0] ?? ''}.`))
  })

  const read = { config: { scope: 'scim' as const } }
  const write = { config: { scope: 'scim' as const, accepts: SCIM_MEDIA_TYPES } }
  const policy = passwordPolicyOf(app.config)
  const hashPassword = async (password: string, owner: PasswordOwner): Promise<string> => {
    checkPasswordPolicy(password, owner, policy)
    return await app.passwords.hash(password)
  }
  const scimOf = (request: FastifyRequest): ScimContext => ({ ctx: requestContext(request), baseUrl: baseUrlOf(request, app.prefix), hashPassword })
  const send = (reply: FastifyReply, status: number, body: unknown): FastifyReply => reply.code(status).type(SCIM_CONTENT_TYPE).send(body)

  for (const path of ['/ServiceProviderConfig', '/serviceConfiguration']) {
    app.get(`${prefix}${path}`, { ...read, schema: { hide: true } }, async (_request, reply) => send(reply, 200, SERVICE_PROVIDER_CONFIG))
  }
  const listOf = (resources: unknown[]): unknown => ({ schemas: [URN.listResponse], totalResults: resources.length, startIndex: 1, itemsPerPage: resources.length, Resources: resources })
  const resourceTypes = [USER_RESOURCE_TYPE, GROUP_RESOURCE_TYPE]
  const schemas = [USER_SCHEMA, ENTERPRISE_USER_SCHEMA, GROUP_SCHEMA]
  app.get(`${prefix}/ResourceTypes`, { ...read, schema: { hide: true } }, async (_request, reply) => send(reply, 200, listOf(resourceTypes)))
  app.get(`${prefix}/ResourceTypes/:id`, { ...read, schema: { hide: true, params: ScimIdParams } }, async (request, reply) => {
    const found = resourceTypes.find(type => type.id === request.params.id)
    if (found === undefined) throw new AppError('route_not_found', 404, `No resource type ${request.params.id}.`)
    return send(reply, 200, found)
  })
  app.get(`${prefix}/Schemas`, { ...read, schema: { hide: true } }, async (_request, reply) => send(reply, 200, listOf(schemas)))
  app.get(`${prefix}/Schemas/:id`, { ...read, schema: { hide: true, params: ScimIdParams } }, async (request, reply) => {
    const found = schemas.find(schema => schema.id === request.params.id)
    if (found === undefined) throw new AppError('route_not_found', 404, `No schema ${request.params.id}.`)
    return send(reply, 200, found)
  })

  app.get(`${prefix}/Users`, { ...read, schema: { hide: true, querystring: ScimListQuery } }, async (request, reply) => {
    const page = await listScimUsersPage(app.db, scimOf(request).baseUrl, request.query)
    return send(reply, 200, { schemas: [URN.listResponse], ...page })
  })

  app.get(`${prefix}/Users/:id`, { ...read, schema: { hide: true, params: ScimIdParams, querystring: ScimAttributesQuery } }, async (request, reply) => {
    const { resource, version } = await getScimUser(app.db, request.params.id, scimOf(request).baseUrl)
    return send(reply.header('ETag', etagOf(version)), 200, project(resource, request.query.attributes, request.query.excludedAttributes))
  })

  app.post(`${prefix}/Users`, {
    schema: { hide: true, body: ScimResourceBody },
    config: { ...write.config, idempotent: true }
  }, async (request, reply) => {
    const { resource, version } = await createScimUser(app.db, scimOf(request), request.body as Record<string, unknown>)
    const meta = resource.meta as { location: string }
    return send(reply.header('Location', meta.location).header('ETag', etagOf(version)), 201, resource)
  })

  app.put(`${prefix}/Users/:id`, {
    ...write,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders, body: ScimResourceBody }
  }, async (request, reply) => {
    const { resource, version } = await replaceScimUser(app.db, scimOf(request), request.params.id, request.body as Record<string, unknown>, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  app.patch(`${prefix}/Users/:id`, {
    ...write,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders, body: ScimPatchBody }
  }, async (request, reply) => {
    const { resource, version } = await patchScimUser(app.db, scimOf(request), request.params.id, request.body, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  app.delete(`${prefix}/Users/:id`, {
    ...read,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders }
  }, async (request, reply) => {
    await deleteScimUser(app.db, scimOf(request), request.params.id, request.headers['if-match'])
    return await reply.code(204).send()
  })

  app.get(`${prefix}/Groups`, { ...read, schema: { hide: true, querystring: ScimListQuery } }, async (request, reply) => {
    const page = await listScimGroupsPage(app.db, scimOf(request).baseUrl, request.query)
    return send(reply, 200, { schemas: [URN.listResponse], ...page })
  })

  app.get(`${prefix}/Groups/:id`, { ...read, schema: { hide: true, params: ScimIdParams, querystring: ScimAttributesQuery } }, async (request, reply) => {
    const { resource, version } = await getScimGroup(app.db, request.params.id, scimOf(request).baseUrl)
    return send(reply.header('ETag', etagOf(version)), 200, project(resource, request.query.attributes, request.query.excludedAttributes))
  })

  app.post(`${prefix}/Groups`, {
    schema: { hide: true, body: ScimResourceBody },
    config: { ...write.config, idempotent: true }
  }, async (request, reply) => {
    const { resource, version } = await createScimGroup(app.db, scimOf(request), request.body as Record<string, unknown>)
    const meta = resource.meta as { location: string }
    return send(reply.header('Location', meta.location).header('ETag', etagOf(version)), 201, resource)
  })

  app.put(`${prefix}/Groups/:id`, {
    ...write,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders, body: ScimResourceBody }
  }, async (request, reply) => {
    const { resource, version } = await replaceScimGroup(app.db, scimOf(request), request.params.id, request.body as Record<string, unknown>, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  // 204, as Okta's group push and Microsoft's collection expect: a group's members can be many, and neither reads them back.
  app.patch(`${prefix}/Groups/:id`, {
    ...write,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders, body: ScimPatchBody }
  }, async (request, reply) => {
    const version = await patchScimGroup(app.db, scimOf(request), request.params.id, request.body, request.headers['if-match'])
    return await reply.code(204).header('ETag', etagOf(version)).send()
  })

  app.delete(`${prefix}/Groups/:id`, {
    ...read,
    schema: { hide: true, params: ScimIdParams, headers: IfMatchHeaders }
  }, async (request, reply) => {
    await deleteScimGroup(app.db, scimOf(request), request.params.id, request.headers['if-match'])
    return await reply.code(204).send()
  })
}
