import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { AppError, logFailure, toAppError, type ErrorCode } from '../errors.ts'
import { jsonParserWithPosition } from '../lib/json-body.ts'
import { checkPasswordPolicy, passwordPolicyOf, type PasswordOwner } from '../lib/password-policy.ts'
import { ref, withHeaders } from '../lib/openapi.ts'
import {
  IfMatchHeaders,
  MAX_RESULTS,
  SCIM_CONTENT_TYPE,
  SCIM_MEDIA_TYPES,
  SCIM_SECURITY,
  ScimAttributesQuery,
  ScimGroup,
  ScimGroupList,
  ScimGroupWrite,
  ScimIdParams,
  ScimListQuery,
  ScimPatchBody,
  ScimResourceType,
  ScimResourceTypeList,
  ScimSchemaDefinition,
  ScimSchemaList,
  ScimServiceProviderConfig,
  ScimUser,
  ScimUserList,
  ScimUserWrite,
  scimErrors,
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
 * Given to Fastify as `rewriteUrl` (system/server-options.ts); any other URL is left as it is.
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
 * are this door's alone. In the OpenAPI document under the tag `scim`, with
 * SCIM's error body and its own security scheme (ScimBearer).
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

  // Answers are written as the service built them: attribute projection
  // (`attributes=`) and the URN-named extension are SCIM's, and a response
  // serializer would drop or coerce what its schema does not foresee. The
  // schemas document the answers; test/openapi-contract.test.ts checks them.
  app.setSerializerCompiler(() => (data: unknown) => JSON.stringify(data))

  const read = { config: { scope: 'scim' as const } }
  const doc = { tags: ['scim'], security: SCIM_SECURITY, produces: ['application/scim+json'] }
  const consumes = SCIM_MEDIA_TYPES
  const UserRef = ref(ScimUser)
  const GroupRef = ref(ScimGroup)
  const write = { config: { scope: 'scim' as const, accepts: SCIM_MEDIA_TYPES } }
  const policy = passwordPolicyOf(app.config)
  const hashPassword = async (password: string, owner: PasswordOwner): Promise<string> => {
    checkPasswordPolicy(password, owner, policy)
    return await app.passwords.hash(password)
  }
  const scimOf = (request: FastifyRequest): ScimContext => ({ ctx: requestContext(request), baseUrl: baseUrlOf(request, app.prefix), hashPassword })
  const send = (reply: FastifyReply, status: number, body: unknown): FastifyReply => reply.code(status).type(SCIM_CONTENT_TYPE).send(body)

  for (const [path, operationId] of [['/ServiceProviderConfig', 'scim_get_service_provider_config'], ['/serviceConfiguration', 'scim_get_service_configuration']] as const) {
    app.get(`${prefix}${path}`, {
      ...read,
      schema: {
        ...doc,
        operationId,
        summary: path === '/ServiceProviderConfig' ? 'Get Service Provider Config' : 'Get Service Provider Config (Microsoft\'s name)',
        description: path === '/ServiceProviderConfig'
          ? 'What this service provider supports (RFC 7643 §5): PATCH, filters (at most 1,000 results a page), sorting, ETags, password changes; no bulk.'
          : 'The same as `/ServiceProviderConfig`, at the name Microsoft\'s reference used.',
        response: { 200: { ...ref(ScimServiceProviderConfig), description: 'The configuration.' }, ...scimErrors(401, 403, 503) }
      }
    }, async (_request, reply) => send(reply, 200, SERVICE_PROVIDER_CONFIG))
  }
  const listOf = (resources: unknown[]): unknown => ({ schemas: [URN.listResponse], totalResults: resources.length, startIndex: 1, itemsPerPage: resources.length, Resources: resources })
  const resourceTypes = [USER_RESOURCE_TYPE, GROUP_RESOURCE_TYPE]
  const schemas = [USER_SCHEMA, ENTERPRISE_USER_SCHEMA, GROUP_SCHEMA]
  app.get(`${prefix}/ResourceTypes`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_list_resource_types',
      summary: 'List Resource Types',
      description: 'User (with the enterprise extension) and Group (RFC 7643 §6).',
      response: { 200: { ...ref(ScimResourceTypeList), description: 'Every resource type.' }, ...scimErrors(401, 403, 503) }
    }
  }, async (_request, reply) => send(reply, 200, listOf(resourceTypes)))
  app.get(`${prefix}/ResourceTypes/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_get_resource_type',
      summary: 'Get Resource Type',
      description: '`User` or `Group`.',
      params: ScimIdParams,
      response: { 200: { ...ref(ScimResourceType), description: 'The resource type.' }, ...scimErrors(401, 403, 404, 503) }
    }
  }, async (request, reply) => {
    const found = resourceTypes.find(type => type.id === request.params.id)
    if (found === undefined) throw new AppError('route_not_found', 404, `No resource type ${request.params.id}.`)
    return send(reply, 200, found)
  })
  app.get(`${prefix}/Schemas`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_list_schemas',
      summary: 'List Schemas',
      description: 'The User schema, the enterprise extension and the Group schema (RFC 7643 §7): exactly the attributes gatehouse stores and returns.',
      response: { 200: { ...ref(ScimSchemaList), description: 'Every schema.' }, ...scimErrors(401, 403, 503) }
    }
  }, async (_request, reply) => send(reply, 200, listOf(schemas)))
  app.get(`${prefix}/Schemas/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_get_schema',
      summary: 'Get Schema',
      description: 'One schema, by its URN.',
      params: ScimIdParams,
      response: { 200: { ...ref(ScimSchemaDefinition), description: 'The schema.' }, ...scimErrors(401, 403, 404, 503) }
    }
  }, async (request, reply) => {
    const found = schemas.find(schema => schema.id === request.params.id)
    if (found === undefined) throw new AppError('route_not_found', 404, `No schema ${request.params.id}.`)
    return send(reply, 200, found)
  })

  app.get(`${prefix}/Users`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_list_users',
      summary: 'List Users (SCIM)',
      description: 'Users matching `filter` (RFC 7644 §3.4.2; the attributes and operators of docs/scim.md, "Filters"), `startIndex` (from 1) and `count` ' +
        '(default 100, at most 1,000) paging, `sortBy` and `sortOrder`; `attributes` and `excludedAttributes` keep or drop attributes. ' +
        'A filter that cannot be parsed, or names what cannot be filtered on, is 400 `invalidFilter`.',
      querystring: ScimListQuery,
      response: { 200: { ...ref(ScimUserList), description: 'A page of users.' }, ...scimErrors(400, 401, 403, 503) }
    }
  }, async (request, reply) => {
    const page = await listScimUsersPage(app.db, scimOf(request).baseUrl, request.query)
    return send(reply, 200, { schemas: [URN.listResponse], ...page })
  })

  app.get(`${prefix}/Users/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_get_user',
      summary: 'Get User (SCIM)',
      description: 'One user, with `attributes` or `excludedAttributes` applied.',
      params: ScimIdParams,
      querystring: ScimAttributesQuery,
      response: { 200: withHeaders({ ...UserRef, description: 'The user; `ETag` versions it.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 503) }
    }
  }, async (request, reply) => {
    const { resource, version } = await getScimUser(app.db, request.params.id, scimOf(request).baseUrl)
    return send(reply.header('ETag', etagOf(version)), 200, project(resource, request.query.attributes, request.query.excludedAttributes))
  })

  app.post(`${prefix}/Users`, {
    schema: {
      ...doc,
      operationId: 'scim_create_user',
      summary: 'Create User (SCIM)',
      description: 'Creates a user (role `user`) through the user lifecycle, as the REST API does: the same rules and events (`source: "scim"`). ' +
        'A `userName` in use (ignoring case) is 409 `uniqueness`; a password is checked against the password rules (400 `invalidValue`).',
      consumes,
      body: ref(ScimUserWrite),
      response: { 201: withHeaders({ ...UserRef, description: 'The created user; `Location` names it and `ETag` versions it.' }, 'ScimLocation', 'ScimETag'), ...scimErrors(400, 401, 403, 409, 413, 415, 422, 503) }
    },
    config: { ...write.config, idempotent: true }
  }, async (request, reply) => {
    const { resource, version } = await createScimUser(app.db, scimOf(request), request.body as Record<string, unknown>)
    const meta = resource.meta as { location: string }
    return send(reply.header('Location', meta.location).header('ETag', etagOf(version)), 201, resource)
  })

  app.put(`${prefix}/Users/:id`, {
    ...write,
    schema: {
      ...doc,
      operationId: 'scim_replace_user',
      summary: 'Replace User (SCIM)',
      description: 'Replaces the user: attributes the body leaves out are cleared (names, `displayName`, `externalId`, `emails`, the enterprise extension), ' +
        'except `active`. `If-Match` with the ETag you read refuses lost updates (412).',
      consumes,
      params: ScimIdParams,
      headers: IfMatchHeaders,
      body: ref(ScimUserWrite),
      response: { 200: withHeaders({ ...UserRef, description: 'The user; `ETag` versions it.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 409, 412, 413, 415, 503) }
    }
  }, async (request, reply) => {
    const { resource, version } = await replaceScimUser(app.db, scimOf(request), request.params.id, request.body as Record<string, unknown>, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  app.patch(`${prefix}/Users/:id`, {
    ...write,
    schema: {
      ...doc,
      operationId: 'scim_patch_user',
      summary: 'Patch User (SCIM)',
      description: 'Applies the operations (RFC 7644 §3.5.2) to the user and stores the result as a PUT of it would be. Answers 200 with the user.',
      consumes,
      params: ScimIdParams,
      headers: IfMatchHeaders,
      body: ref(ScimPatchBody),
      response: { 200: withHeaders({ ...UserRef, description: 'The user; `ETag` versions it.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 409, 412, 413, 415, 503) }
    }
  }, async (request, reply) => {
    const { resource, version } = await patchScimUser(app.db, scimOf(request), request.params.id, request.body, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  app.delete(`${prefix}/Users/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_delete_user',
      summary: 'Delete User (SCIM)',
      description: 'Deletes the user (deactivation is a PATCH or PUT of `active: false`). The last enabled admin is not deleted (409 `mutability`).',
      params: ScimIdParams,
      headers: IfMatchHeaders,
      response: { 204: { type: 'null', description: 'Deleted.' }, ...scimErrors(401, 403, 404, 409, 412, 503) }
    }
  }, async (request, reply) => {
    await deleteScimUser(app.db, scimOf(request), request.params.id, request.headers['if-match'])
    return await reply.code(204).send(null)
  })

  app.get(`${prefix}/Groups`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_list_groups',
      summary: 'List Groups (SCIM)',
      description: 'Groups matching `filter`, paged and sorted as List Users (SCIM) is; in name order by default.',
      querystring: ScimListQuery,
      response: { 200: { ...ref(ScimGroupList), description: 'A page of groups.' }, ...scimErrors(400, 401, 403, 503) }
    }
  }, async (request, reply) => {
    const page = await listScimGroupsPage(app.db, scimOf(request).baseUrl, request.query)
    return send(reply, 200, { schemas: [URN.listResponse], ...page })
  })

  app.get(`${prefix}/Groups/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_get_group',
      summary: 'Get Group (SCIM)',
      description: 'One group with its members, with `attributes` or `excludedAttributes` applied.',
      params: ScimIdParams,
      querystring: ScimAttributesQuery,
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 503) }
    }
  }, async (request, reply) => {
    const { resource, version } = await getScimGroup(app.db, request.params.id, scimOf(request).baseUrl)
    return send(reply.header('ETag', etagOf(version)), 200, project(resource, request.query.attributes, request.query.excludedAttributes))
  })

  app.post(`${prefix}/Groups`, {
    schema: {
      ...doc,
      operationId: 'scim_create_group',
      summary: 'Create Group (SCIM)',
      description: 'Creates a group with the members named (ids that are no user here are passed over). A name in use is 409 `uniqueness`.',
      consumes,
      body: ref(ScimGroupWrite),
      response: { 201: withHeaders({ ...GroupRef, description: 'The created group; `Location` names it and `ETag` versions it.' }, 'ScimLocation', 'ScimETag'), ...scimErrors(400, 401, 403, 409, 413, 415, 422, 503) }
    },
    config: { ...write.config, idempotent: true }
  }, async (request, reply) => {
    const { resource, version } = await createScimGroup(app.db, scimOf(request), request.body as Record<string, unknown>)
    const meta = resource.meta as { location: string }
    return send(reply.header('Location', meta.location).header('ETag', etagOf(version)), 201, resource)
  })

  app.put(`${prefix}/Groups/:id`, {
    ...write,
    schema: {
      ...doc,
      operationId: 'scim_replace_group',
      summary: 'Replace Group (SCIM)',
      description: 'The group\'s name, external id and members become what the body says (no `members`: none).',
      consumes,
      params: ScimIdParams,
      headers: IfMatchHeaders,
      body: ref(ScimGroupWrite),
      response: { 200: withHeaders({ ...GroupRef, description: 'The group; `ETag` versions it.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 409, 412, 413, 415, 503) }
    }
  }, async (request, reply) => {
    const { resource, version } = await replaceScimGroup(app.db, scimOf(request), request.params.id, request.body as Record<string, unknown>, request.headers['if-match'])
    return send(reply.header('ETag', etagOf(version)), 200, resource)
  })

  // 204, as Okta's group push and Microsoft's collection expect: a group's members can be many, and neither reads them back.
  app.patch(`${prefix}/Groups/:id`, {
    ...write,
    schema: {
      ...doc,
      operationId: 'scim_patch_group',
      summary: 'Patch Group (SCIM)',
      description: '`add` members; `remove` `members[value eq "<id>"]`, or `members` with the members to remove as its value (without one, all); ' +
        '`replace` of `members`, `displayName` or `externalId`, also without a path. Answers 204.',
      consumes,
      params: ScimIdParams,
      headers: IfMatchHeaders,
      body: ref(ScimPatchBody),
      response: { 204: withHeaders({ type: 'null', description: 'Changed; `ETag` versions the group.' }, 'ScimETag'), ...scimErrors(400, 401, 403, 404, 409, 412, 413, 415, 503) }
    }
  }, async (request, reply) => {
    const version = await patchScimGroup(app.db, scimOf(request), request.params.id, request.body, request.headers['if-match'])
    return await reply.code(204).header('ETag', etagOf(version)).send()
  })

  app.delete(`${prefix}/Groups/:id`, {
    ...read,
    schema: {
      ...doc,
      operationId: 'scim_delete_group',
      summary: 'Delete Group (SCIM)',
      description: 'Deletes the group; its name leaves every member\'s `groups`.',
      params: ScimIdParams,
      headers: IfMatchHeaders,
      response: { 204: { type: 'null', description: 'Deleted.' }, ...scimErrors(401, 403, 404, 409, 412, 503) }
    }
  }, async (request, reply) => {
    await deleteScimGroup(app.db, scimOf(request), request.params.id, request.headers['if-match'])
    return await reply.code(204).send(null)
  })
}
