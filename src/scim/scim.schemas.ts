import { Type, type Static } from 'typebox'

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

/**
 * A User or Group body: an object, checked field by field by the service,
 * because SCIM attribute names are case-insensitive (RFC 7643 §2.1) and
 * attributes a service provider does not keep are ignored, not refused.
 */
export const ScimResourceBody = Type.Object({}, { additionalProperties: true })
export type ScimResourceBody = Record<string, unknown>

export const ScimPatchBody = Type.Object({
  schemas: Type.Optional(Type.Array(Type.String({ maxLength: 200 }), { maxItems: 10 })),
  Operations: Type.Array(Type.Object({
    op: Type.String({ minLength: 1, maxLength: 20 }),
    path: Type.Optional(Type.String({ maxLength: 1000 })),
    value: Type.Optional(Type.Unknown())
  }, { additionalProperties: true }), { minItems: 1, maxItems: 1000 })
}, { additionalProperties: true })
export type ScimPatchBody = Static<typeof ScimPatchBody>

export const ScimListQuery = Type.Object({
  filter: Type.Optional(Type.String({ maxLength: 2000 })),
  startIndex: Type.Optional(Type.Integer({ format: 'int32' })),
  count: Type.Optional(Type.Integer({ format: 'int32' })),
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

export const ERROR_SCIM_TYPES = ['invalidFilter', 'tooMany', 'uniqueness', 'mutability', 'invalidSyntax', 'invalidPath', 'noTarget', 'invalidValue', 'invalidVers', 'sensitive'] as const
export type ScimType = typeof ERROR_SCIM_TYPES[number]
