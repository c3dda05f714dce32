import { Type, type Static, type TSchema } from 'typebox'
import { Timestamp, Uuid } from '../lib/openapi.ts'
import { STATUS_CODES } from 'node:http'
import { MAX_GROUPS, USERNAME_PATTERN } from '../users/users.schemas.ts'

/** SCIM's URNs (RFC 7643, RFC 7644). */
export const URN = {
  user: 'urn:ietf:params:scim:schemas:core:2.0:User',
  enterpriseUser: 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User',
  group: 'urn:ietf:params:scim:schemas:core:2.0:Group',
  listResponse: 'urn:ietf:params:scim:api:messages:2.0:ListResponse',
  patchOp: 'urn:ietf:params:scim:api:messages:2.0:PatchOp',
  error: 'urn:ietf:params:scim:api:messages:2.0:Error',
  serviceProviderConfig: 'urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig',
  resourceType: 'urn:ietf:params:scim:schemas:core:2.0:ResourceType',
  schema: 'urn:ietf:params:scim:schemas:core:2.0:Schema'
} as const

/** What SCIM clients send and are sent; both are accepted, and SCIM's own type is the one answered. */
export const SCIM_MEDIA_TYPES = ['application/scim+json', 'application/json']
export const SCIM_CONTENT_TYPE = 'application/scim+json; charset=utf-8'

/** The largest page a list answers (ServiceProviderConfig's filter.maxResults); also the default. */
export const MAX_RESULTS = 1000
export const DEFAULT_COUNT = 100

/** `true`/`false`, or the strings `"True"`/`"False"` in any case, as Entra sends them. */
const SCIM_BOOLEAN = { anyOf: [{ type: 'boolean' }, { type: 'string', maxLength: 5, pattern: '^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$' }, { type: 'null' }] }
const nullableText = (maxLength: number, description: string): TSchema => Type.Unsafe({ type: ['string', 'null'], maxLength, description })
const SchemaUris = Type.Array(Type.String({ maxLength: 200 }), { maxItems: 10, description: 'The schemas the resource uses (RFC 7643 §3); read, not checked.' })
/** A user id as a client writes one: ids that are no user here are passed over, so it is bounded, not checked. */
const UserIdText = Type.String({ maxLength: 255 })

const WRITE_NOTE = 'Attribute names are read ignoring case (RFC 7643 §2.1): `UserName` is `userName`. Attributes gatehouse does not keep ' +
  '(addresses, phone numbers, `title`, …) and read-only ones (`id`, `groups`, `meta`) are accepted and ignored, hence `additionalProperties`.'

/**
 * A User as a client writes it (POST and PUT): what the service reads, with
 * the bounds it enforces (scim.service.ts checks each again, in any case of
 * the names). Required in effect: `userName`, which the service asks for in
 * whatever case it comes, so no spelling of it is required here.
 */
export const ScimUserWrite = Type.Object({
  schemas: Type.Optional(SchemaUris),
  userName: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: USERNAME_PATTERN, description: 'Required. Unique ignoring case: 1 to 64 letters, digits and `. _ @ -`.' })),
  externalId: Type.Optional(nullableText(255, 'The identity provider\'s id for the user.')),
  name: Type.Optional(Type.Unsafe({
    type: ['object', 'null'],
    properties: {
      formatted: nullableText(400, 'The full name, as it is to be shown.'),
      familyName: nullableText(200, 'gatehouse\'s `last_name`.'),
      givenName: nullableText(200, 'gatehouse\'s `first_name`.')
    },
    additionalProperties: true
  })),
  displayName: Type.Optional(nullableText(400, 'The name to show for the user.')),
  active: Type.Optional(Type.Unsafe({ ...SCIM_BOOLEAN, description: '`false` disables the user (their sessions end, their API keys are revoked); `true` enables them. Left out of a PUT, unchanged.' })),
  password: Type.Optional(Type.Unsafe({ type: ['string', 'null'], minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: 'Write-only, never returned: the password rules of the REST API apply.' })),
  emails: Type.Optional(Type.Unsafe({
    type: ['array', 'null'],
    maxItems: 20,
    description: 'Kept as sent; the primary (else the first) is the user\'s `email` when it is an address no other user has. At most one primary.',
    items: {
      type: 'object',
      properties: {
        value: { type: 'string', minLength: 1, maxLength: 254, description: 'The address (required).' },
        type: nullableText(64, '`work`, `home`, `other`, or a label of the client.'),
        primary: { ...SCIM_BOOLEAN, description: 'The user\'s main address.' }
      },
      additionalProperties: true
    }
  })),
  [URN.enterpriseUser]: Type.Optional(Type.Unsafe({
    type: ['object', 'null'],
    description: 'The enterprise extension (RFC 7643 §4.3), kept whole.',
    properties: {
      employeeNumber: nullableText(200, 'The number the organization knows the user by.'),
      costCenter: nullableText(200, 'A cost center.'),
      organization: nullableText(200, 'An organization.'),
      division: nullableText(200, 'A division.'),
      department: nullableText(200, 'A department.'),
      manager: {
        anyOf: [
          { type: 'object', properties: { value: { ...UserIdText, type: ['string', 'null'], description: 'The manager\'s `id` here.' } }, additionalProperties: true },
          UserIdText,
          { type: 'array', maxItems: 1, items: { type: 'object', properties: { value: { ...UserIdText, type: ['string', 'null'] } }, additionalProperties: true } },
          { type: 'null' }
        ],
        description: 'The manager: `{"value": "<id>"}`, the id alone, or a list of one. A value that is no user here is passed over; `null`, `""`, `[]` or `{"value": ""}` clears it.'
      }
    },
    additionalProperties: true
  }))
}, { $id: 'ScimUserWrite', additionalProperties: true, description: `A User to create or to replace with (a PUT clears what it leaves out, except \`active\`). ${WRITE_NOTE}` })

const MEMBER = { type: 'object', properties: { value: { ...UserIdText, description: 'A user\'s `id`.' } }, additionalProperties: true }

/** A Group as a client writes it (POST and PUT). */
export const ScimGroupWrite = Type.Object({
  schemas: Type.Optional(SchemaUris),
  displayName: Type.Optional(Type.String({ minLength: 1, maxLength: 64, description: 'Required. Unique as written; the name in each member\'s `groups`.' })),
  externalId: Type.Optional(nullableText(255, 'The identity provider\'s id for the group.')),
  members: Type.Optional(Type.Unsafe({
    description: 'The members: user ids as `{"value": "<id>"}` (or bare ids). Ids that are no user here are passed over.',
    anyOf: [
      { type: 'array', items: { anyOf: [MEMBER, UserIdText] } },
      MEMBER,
      UserIdText,
      { type: 'null' }
    ]
  }))
}, { $id: 'ScimGroupWrite', additionalProperties: true, description: `A Group to create or to replace with (its members become those named). ${WRITE_NOTE}` })

/** A body of a write whose checks are the service's: kept for callers that take any resource. */
export type ScimResourceBody = Record<string, unknown>

export const ScimPatchBody = Type.Object({
  schemas: Type.Optional(Type.Array(Type.String({ maxLength: 200 }), { maxItems: 10, description: `\`["${URN.patchOp}"]\`; read, not checked.` })),
  Operations: Type.Array(Type.Object({
    op: Type.String({ minLength: 1, maxLength: 20, description: '`add`, `replace` or `remove`, in any case.' }),
    path: Type.Optional(Type.String({ maxLength: 1000, description: 'An attribute path (`name.givenName`, `emails[type eq "work"].value`, `members[value eq "<id>"]`, an enterprise attribute with its URN); left out of an add or replace, the value is an object of attributes or paths.' })),
    value: Type.Optional(Type.Unknown({ description: 'The value to add or replace with; for a remove of members, the members to remove.' }))
  }, { additionalProperties: true }), { minItems: 1, maxItems: 1000 })
}, { $id: 'ScimPatchOp', additionalProperties: true, description: 'A PATCH (RFC 7644 §3.5.2), as Okta and Entra send it: operation names, attribute names and paths in any case. The operations apply in order, all or none.' })
export type ScimPatchBody = Static<typeof ScimPatchBody>

export const ScimListQuery = Type.Object({
  filter: Type.Optional(Type.String({ maxLength: 2000 })),
  startIndex: Type.Optional(Type.Integer({ format: 'int32', minimum: -2_147_483_648, maximum: 2_147_483_647, description: 'The 1-based index of the first result; below 1 is 1 (RFC 7644 §3.4.2.4).' })),
  count: Type.Optional(Type.Integer({ format: 'int32', minimum: -2_147_483_648, maximum: 2_147_483_647, description: `Results a page holds: default ${DEFAULT_COUNT}, at most ${MAX_RESULTS}; below 0 is 0.` })),
  sortBy: Type.Optional(Type.String({ maxLength: 200 })),
  sortOrder: Type.Optional(Type.String({ maxLength: 20 })),
  attributes: Type.Optional(Type.String({ maxLength: 2000 })),
  excludedAttributes: Type.Optional(Type.String({ maxLength: 2000 }))
}, { additionalProperties: true })
export type ScimListQuery = Static<typeof ScimListQuery>

export const ScimAttributesQuery = Type.Object({
  attributes: Type.Optional(Type.String({ maxLength: 2000 })),
  excludedAttributes: Type.Optional(Type.String({ maxLength: 2000 }))
}, { additionalProperties: true })
export type ScimAttributesQuery = Static<typeof ScimAttributesQuery>

export const ScimIdParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) })

export const IfMatchHeaders = Type.Object({
  'if-match': Type.Optional(Type.String({ maxLength: 256 }))
})

// ---------------------------------------------------------------------------
// What SCIM answers, as the OpenAPI document states it (tag `scim`). The
// service builds each body itself (scim.service.ts, scim.routes.ts) and the
// SCIM routes write it as built (no response serializer), so these schemas
// describe the answers; test/openapi-contract.test.ts checks real answers
// against them.

const Location = Type.String({ format: 'uri', maxLength: 2048, description: 'The resource\'s absolute URL.' })
/** `W/"<version>"`: the resource's version, as its ETag. */
export const SCIM_VERSION_PATTERN = '^W/"[0-9]+"$'

function metaOf (resourceType: 'User' | 'Group'): TSchema {
  return Type.Object({
    resourceType: Type.Literal(resourceType),
    created: Timestamp(),
    lastModified: Timestamp(),
    version: Type.String({ maxLength: 24, pattern: SCIM_VERSION_PATTERN, description: 'The version, as the `ETag` is; send it as `If-Match`.' }),
    location: Location
  }, { additionalProperties: false })
}

/**
 * A reference's `$ref` (its resource's URL), always there. Stated as a
 * pattern property: a property named `$ref` reads as a reference to tools.
 */
const REFERENCE = { additionalProperties: false, patternProperties: { '^[$]ref$': Location } }

const PROJECTED = 'A list and a read with `attributes` or `excludedAttributes` answer only what those keep, `id` and `schemas` always.'
const ScimEmail = Type.Object({
  value: Type.String({ maxLength: 254, description: 'The address, as sent.' }),
  type: Type.Optional(Type.String({ maxLength: 64 })),
  primary: Type.Optional(Type.Boolean())
}, { additionalProperties: false })

export const ScimUser = Type.Object({
  schemas: Type.Array(Type.Union([Type.Literal(URN.user), Type.Literal(URN.enterpriseUser)]), { minItems: 1, maxItems: 2, description: 'The core User schema, and the enterprise extension when something of it is set.' }),
  id: Uuid({ description: 'gatehouse\'s id of the user: the `user_id` of the REST API.' }),
  externalId: Type.Optional(Type.String({ maxLength: 255, description: 'The identity provider\'s id for the user.' })),
  userName: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: USERNAME_PATTERN, description: 'gatehouse\'s username.' })),
  name: Type.Optional(Type.Object({
    formatted: Type.Optional(Type.String({ maxLength: 400 })),
    familyName: Type.Optional(Type.String({ maxLength: 200 })),
    givenName: Type.Optional(Type.String({ maxLength: 200 }))
  }, { additionalProperties: false })),
  displayName: Type.Optional(Type.String({ maxLength: 400 })),
  active: Type.Optional(Type.Boolean({ description: 'false: the user is disabled.' })),
  emails: Type.Optional(Type.Array(ScimEmail, { maxItems: 21, description: 'As the client sent them; an address set through another door than SCIM comes first, as the primary.' })),
  groups: Type.Optional(Type.Array(Type.Object({
    value: Uuid({ description: 'The group\'s id.' }),
    display: Type.String({ maxLength: 64, description: 'The group\'s name.' })
  }, REFERENCE), { maxItems: MAX_GROUPS, description: 'Read-only: the groups the user belongs to.' })),
  [URN.enterpriseUser]: Type.Optional(Type.Object({
    employeeNumber: Type.Optional(Type.String({ maxLength: 200 })),
    costCenter: Type.Optional(Type.String({ maxLength: 200 })),
    organization: Type.Optional(Type.String({ maxLength: 200 })),
    division: Type.Optional(Type.String({ maxLength: 200 })),
    department: Type.Optional(Type.String({ maxLength: 200 })),
    manager: Type.Optional(Type.Object({
      value: Uuid({ description: 'The manager\'s id.' }),
      displayName: Type.Optional(Type.String({ maxLength: 400, description: 'The manager\'s displayName, else their userName.' }))
    }, REFERENCE))
  }, { additionalProperties: false, description: 'The enterprise extension, when something of it is set.' })),
  meta: Type.Optional(metaOf('User'))
}, { $id: 'ScimUser', additionalProperties: false, description: `A User (RFC 7643 §4.1) as gatehouse keeps it. ${PROJECTED}` })

export const ScimGroup = Type.Object({
  schemas: Type.Array(Type.Literal(URN.group), { minItems: 1, maxItems: 1 }),
  id: Uuid({ description: 'gatehouse\'s id of the group: the `group_id` of the REST API.' }),
  externalId: Type.Optional(Type.String({ maxLength: 255, description: 'The identity provider\'s id for the group.' })),
  displayName: Type.Optional(Type.String({ minLength: 1, maxLength: 64, description: 'The group\'s name.' })),
  members: Type.Optional(Type.Array(Type.Object({
    value: Uuid({ description: 'The member\'s user id.' }),
    display: Type.String({ maxLength: 64, description: 'The member\'s userName.' })
  }, REFERENCE), { description: 'Every member, in userName order.' })),
  meta: Type.Optional(metaOf('Group'))
}, { $id: 'ScimGroup', additionalProperties: false, description: `A Group (RFC 7643 §4.2). ${PROJECTED}` })

function listOf (item: TSchema, id: string, description: string): TSchema {
  return Type.Object({
    schemas: Type.Array(Type.Literal(URN.listResponse), { minItems: 1, maxItems: 1 }),
    totalResults: Type.Integer({ format: 'int32', minimum: 0, maximum: 2_147_483_647, description: 'Every match of the filter, on every page.' }),
    startIndex: Type.Integer({ format: 'int32', minimum: 1, maximum: 2_147_483_647, description: 'The 1-based index of the first resource of this page.' }),
    itemsPerPage: Type.Integer({ format: 'int32', minimum: 0, maximum: MAX_RESULTS, description: 'How many resources this page holds.' }),
    Resources: Type.Array(item, { maxItems: MAX_RESULTS })
  }, { $id: id, additionalProperties: false, description })
}

export const ERROR_SCIM_TYPES = ['invalidFilter', 'tooMany', 'uniqueness', 'mutability', 'invalidSyntax', 'invalidPath', 'noTarget', 'invalidValue', 'invalidVers', 'sensitive'] as const
export type ScimType = typeof ERROR_SCIM_TYPES[number]

/** SCIM's error body (RFC 7644 §3.12): every error of a SCIM operation has this shape, as application/scim+json. */
export const ScimError = Type.Object({
  schemas: Type.Array(Type.Literal(URN.error), { minItems: 1, maxItems: 1 }),
  status: Type.String({ maxLength: 3, pattern: '^[45][0-9]{2}$', description: 'The HTTP status, as a string (RFC 7644 §3.12).' }),
  scimType: Type.Optional(Type.Enum(ERROR_SCIM_TYPES, { description: 'SCIM\'s error type, where one applies.' })),
  detail: Type.String({ description: 'What went wrong, for a person.' })
}, { $id: 'ScimError', additionalProperties: false, description: 'SCIM\'s error body (RFC 7644 §3.12; docs/errors.md). Its `status` is a string.' })

export const ScimUserList = listOf(Type.Unsafe({ $ref: 'ScimUser#' }), 'ScimUserList', 'A page of users (RFC 7644 §3.4.2).')
export const ScimGroupList = listOf(Type.Unsafe({ $ref: 'ScimGroup#' }), 'ScimGroupList', 'A page of groups (RFC 7644 §3.4.2).')

const Supported = Type.Object({ supported: Type.Boolean() }, { additionalProperties: false })
const DiscoveryMeta = (resourceType: string): TSchema => Type.Object({
  resourceType: Type.Literal(resourceType),
  location: Type.String({ maxLength: 200, pattern: '^/', description: 'Relative to the SCIM base URL.' })
}, { additionalProperties: false })
const Urn = Type.String({ maxLength: 200, pattern: '^urn:ietf:params:scim:' })
const Words = (maxLength: number): TSchema => Type.String({ maxLength })

/** /ServiceProviderConfig (RFC 7643 §5): what this service provider supports. */
export const ScimServiceProviderConfig = Type.Object({
  schemas: Type.Array(Type.Literal(URN.serviceProviderConfig), { minItems: 1, maxItems: 1 }),
  documentationUri: Type.String({ format: 'uri', maxLength: 2048 }),
  patch: Supported,
  bulk: Type.Object({ supported: Type.Boolean(), maxOperations: Type.Integer({ format: 'int32', minimum: 0, maximum: 0 }), maxPayloadSize: Type.Integer({ format: 'int32', minimum: 0, maximum: 0 }) }, { additionalProperties: false }),
  filter: Type.Object({ supported: Type.Boolean(), maxResults: Type.Integer({ format: 'int32', minimum: MAX_RESULTS, maximum: MAX_RESULTS }) }, { additionalProperties: false }),
  changePassword: Supported,
  sort: Supported,
  etag: Supported,
  authenticationSchemes: Type.Array(Type.Object({
    type: Type.Literal('oauthbearertoken'),
    name: Words(64),
    description: Words(200),
    primary: Type.Boolean()
  }, { additionalProperties: false }), { maxItems: 1 }),
  meta: DiscoveryMeta('ServiceProviderConfig')
}, { $id: 'ScimServiceProviderConfig', additionalProperties: false, description: 'What this service provider supports (RFC 7643 §5).' })

/** /ResourceTypes/{id} (RFC 7643 §6). */
export const ScimResourceType = Type.Object({
  schemas: Type.Array(Type.Literal(URN.resourceType), { minItems: 1, maxItems: 1 }),
  id: Type.Enum(['User', 'Group']),
  name: Type.Enum(['User', 'Group']),
  endpoint: Type.Enum(['/Users', '/Groups']),
  description: Words(200),
  schema: Urn,
  schemaExtensions: Type.Array(Type.Object({ schema: Urn, required: Type.Boolean() }, { additionalProperties: false }), { maxItems: 1 }),
  meta: DiscoveryMeta('ResourceType')
}, { $id: 'ScimResourceType', additionalProperties: false, description: 'A resource type (RFC 7643 §6): User (with the enterprise extension) or Group.' })

const ATTRIBUTE_TYPES = ['string', 'boolean', 'decimal', 'integer', 'dateTime', 'reference', 'binary', 'complex']
function attributeDefinition (subAttributes: TSchema | undefined): TSchema {
  return Type.Object({
    name: Type.String({ maxLength: 64, pattern: '^[$A-Za-z][A-Za-z0-9_$-]*$' }),
    type: Type.Enum(ATTRIBUTE_TYPES),
    multiValued: Type.Boolean(),
    description: Words(400),
    required: Type.Boolean(),
    caseExact: Type.Boolean(),
    mutability: Type.Enum(['readOnly', 'readWrite', 'immutable', 'writeOnly']),
    returned: Type.Enum(['always', 'never', 'default', 'request']),
    uniqueness: Type.Enum(['none', 'server', 'global']),
    canonicalValues: Type.Optional(Type.Array(Type.String({ maxLength: 64, pattern: '^[a-z]+$' }), { maxItems: 10 })),
    referenceTypes: Type.Optional(Type.Array(Type.Enum(['User', 'Group', 'external', 'uri']), { maxItems: 4 })),
    ...(subAttributes !== undefined ? { subAttributes: Type.Optional(Type.Array(subAttributes, { maxItems: 20 })) } : {})
  }, { additionalProperties: false })
}

/** /Schemas/{id} (RFC 7643 §7): the attributes gatehouse keeps of a resource. */
export const ScimSchemaDefinition = Type.Object({
  schemas: Type.Array(Type.Literal(URN.schema), { minItems: 1, maxItems: 1 }),
  id: Urn,
  name: Type.Enum(['User', 'EnterpriseUser', 'Group']),
  description: Words(200),
  attributes: Type.Array(attributeDefinition(attributeDefinition(undefined)), { maxItems: 50 }),
  meta: DiscoveryMeta('Schema')
}, { $id: 'ScimSchemaDefinition', additionalProperties: false, description: 'A schema (RFC 7643 §7): exactly the attributes gatehouse stores and returns.' })

/** The ListResponse of /ResourceTypes and /Schemas: every item, on one page. */
function discoveryListOf (item: TSchema, id: string, description: string): TSchema {
  return Type.Object({
    schemas: Type.Array(Type.Literal(URN.listResponse), { minItems: 1, maxItems: 1 }),
    totalResults: Type.Integer({ format: 'int32', minimum: 0, maximum: 10 }),
    startIndex: Type.Integer({ format: 'int32', minimum: 1, maximum: 1 }),
    itemsPerPage: Type.Integer({ format: 'int32', minimum: 0, maximum: 10 }),
    Resources: Type.Array(item, { maxItems: 10 })
  }, { $id: id, additionalProperties: false, description })
}
export const ScimResourceTypeList = discoveryListOf(Type.Unsafe({ $ref: 'ScimResourceType#' }), 'ScimResourceTypeList', 'Every resource type.')
export const ScimSchemaList = discoveryListOf(Type.Unsafe({ $ref: 'ScimSchemaDefinition#' }), 'ScimSchemaList', 'Every schema.')

/** How a SCIM client authenticates: an API key with the `scim` scope as a bearer token (components.securitySchemes.ScimBearer). */
export const SCIM_SECURITY: Array<Record<string, string[]>> = [{ ScimBearer: [] }]
export const SCIM_SECURITY_SCHEME = {
  type: 'http' as const,
  scheme: 'bearer',
  description: 'An API key with the `scim` scope (docs/scim.md), as `Authorization: Bearer <key>`. No other key reaches SCIM, an admin key included, and a SCIM key reaches nothing else.'
}

/**
 * Error responses to document for a SCIM operation, each SCIM's error body
 * in application/scim+json; as problems() does for the REST API, also any
 * other 4xx (`4XX`) and 500. Refusals before routing are answered by the
 * app's framework error handlers (errors.ts), as problems.
 */
export function scimErrors (...statuses: number[]): Record<string, TSchema> {
  const out: Record<string, TSchema> = {}
  const scimError = { 'application/scim+json': { schema: { $ref: 'ScimError#' } } }
  for (const status of statuses) out[status] = Type.Unsafe({ description: STATUS_CODES[status] ?? 'Error', content: scimError })
  out['4xx'] = Type.Unsafe({
    description: 'Any other client error (a malformed body, a method the path does not have, …). What is refused before the request reaches SCIM ' +
      '(a URL that cannot be decoded, a path segment over 200 characters, headers over 16 KiB, bytes that are not HTTP) is an RFC 9457 problem, as everywhere in gatehouse.',
    content: { ...scimError, 'application/problem+json': { schema: { $ref: 'Problem#' } } }
  })
  out[500] = Type.Unsafe({ description: STATUS_CODES[500], content: scimError })
  return out
}

/** The named SCIM schemas, registered with app.addSchema so that the document has each once under components.schemas. */
export const SCIM_SCHEMAS = [ScimUserWrite, ScimGroupWrite, ScimPatchBody, ScimUser, ScimGroup, ScimUserList, ScimGroupList, ScimError, ScimServiceProviderConfig, ScimResourceType, ScimResourceTypeList, ScimSchemaDefinition, ScimSchemaList]

/** An attribute definition of /Schemas (RFC 7643 §7), with SCIM's defaults written out. */
function attribute (name: string, type: string, description: string, options: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name,
    type,
    multiValued: false,
    description,
    required: false,
    caseExact: false,
    mutability: 'readWrite',
    returned: 'default',
    uniqueness: 'none',
    ...options
  }
}

/**
 * The User schema as gatehouse keeps it: exactly the attributes stored and
 * returned (docs/scim.md). Others a client sends (addresses, phone numbers,
 * titles) are accepted and not kept; the enterprise extension is a schema of
 * its own (ENTERPRISE_USER_SCHEMA).
 */
export const USER_SCHEMA = {
  schemas: [URN.schema],
  id: URN.user,
  name: 'User',
  description: 'User Account',
  attributes: [
    attribute('userName', 'string', 'Unique ignoring case: 1 to 64 letters, digits and . _ @ -. gatehouse\'s username.', { required: true, uniqueness: 'server' }),
    attribute('name', 'complex', 'The components of the user\'s name.', {
      subAttributes: [
        attribute('formatted', 'string', 'The full name, as it is to be shown.'),
        attribute('familyName', 'string', 'gatehouse\'s last_name (at most 200 characters).'),
        attribute('givenName', 'string', 'gatehouse\'s first_name (at most 200 characters).')
      ]
    }),
    attribute('displayName', 'string', 'The name to show for the user.'),
    attribute('password', 'string', 'Write-only, never returned: the password rules of the REST API apply. Setting one ends the user\'s sessions and API keys.', { mutability: 'writeOnly', returned: 'never' }),
    attribute('active', 'boolean', 'false disables the user (their sessions end and API keys are revoked); true enables them again.'),
    attribute('emails', 'complex', 'Addresses as the client sends them. The primary one (or the first) is gatehouse\'s email when it is an address no other user has.', {
      multiValued: true,
      subAttributes: [
        attribute('value', 'string', 'The address.'),
        attribute('display', 'string', 'A label for the address.'),
        attribute('type', 'string', 'work, home, other, or a label of the client.', { canonicalValues: ['work', 'home', 'other'] }),
        attribute('primary', 'boolean', 'The user\'s main address; at most one.')
      ]
    }),
    attribute('groups', 'complex', 'The groups the user belongs to (read-only: change them through the groups).', {
      multiValued: true,
      mutability: 'readOnly',
      subAttributes: [
        attribute('value', 'string', 'The group.', { mutability: 'readOnly' }),
        attribute('display', 'string', 'The group\'s name.', { mutability: 'readOnly' })
      ]
    })
  ],
  meta: { resourceType: 'Schema', location: `/Schemas/${URN.user}` }
}

/**
 * The enterprise extension (RFC 7643 §4.3) as gatehouse keeps it: all of it
 * (migration 0017). A manager is one of our users: a `value` that is no user
 * here is passed over, and a deleted manager leaves their reports with none.
 */
export const ENTERPRISE_USER_SCHEMA = {
  schemas: [URN.schema],
  id: URN.enterpriseUser,
  name: 'EnterpriseUser',
  description: 'Enterprise User',
  attributes: [
    attribute('employeeNumber', 'string', 'The number the organization knows the user by (at most 200 characters). Filters with eq are index lookups.'),
    attribute('costCenter', 'string', 'The name of a cost center (at most 200 characters).'),
    attribute('organization', 'string', 'The name of an organization (at most 200 characters).'),
    attribute('division', 'string', 'The name of a division (at most 200 characters).'),
    attribute('department', 'string', 'The name of a department (at most 200 characters). Filters with eq are index lookups.'),
    attribute('manager', 'complex', 'The user\'s manager, when they are one of the users here; a value that is no user here is passed over.', {
      subAttributes: [
        attribute('value', 'string', 'The id of the manager\'s user here.', { caseExact: true }),
        attribute('$ref', 'reference', 'The manager\'s location.', { mutability: 'readOnly', referenceTypes: ['User'] }),
        attribute('displayName', 'string', 'The manager\'s displayName, else their userName.', { mutability: 'readOnly' })
      ]
    })
  ],
  meta: { resourceType: 'Schema', location: `/Schemas/${URN.enterpriseUser}` }
}

/** The Group schema as gatehouse keeps it. */
export const GROUP_SCHEMA = {
  schemas: [URN.schema],
  id: URN.group,
  name: 'Group',
  description: 'Group',
  attributes: [
    attribute('displayName', 'string', 'Unique ignoring case, at most 64 characters; the name in each member\'s groups.', { required: true, caseExact: false, uniqueness: 'server' }),
    attribute('members', 'complex', 'The users in the group. Ids that are no user here are passed over.', {
      multiValued: true,
      subAttributes: [
        attribute('value', 'string', 'The id of a user.', { mutability: 'immutable' }),
        attribute('display', 'string', 'The user\'s userName.', { mutability: 'readOnly' }),
        attribute('$ref', 'reference', 'The user\'s location.', { mutability: 'readOnly', referenceTypes: ['User'] })
      ]
    })
  ],
  meta: { resourceType: 'Schema', location: `/Schemas/${URN.group}` }
}
