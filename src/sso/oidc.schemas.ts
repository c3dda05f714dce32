import { Type, type Static } from 'typebox'
import { Nullable, Timestamp, Uuid } from '../lib/openapi.ts'

/** Becomes part of paths (`/auth/sso/{id}/start`) and of `user_identities.provider` (`oidc:<id>`). */
export const PROVIDER_ID_PATTERN = '^[a-z0-9][a-z0-9_-]{0,31}$'
/** Providers are few: each is a button on the sign-in page. */
export const MAX_PROVIDERS = 50
const MAX_MAPPED_GROUPS = 200
/** Text on one line without control characters. */
const ONE_LINE = '^[^\\x00-\\x1F\\x7F]*$'

export const ProviderId = Type.String({ minLength: 1, maxLength: 32, pattern: PROVIDER_ID_PATTERN, description: 'Lower-case letters, digits, `_` and `-`; part of the sign-in paths.', examples: ['corp'] })
const DisplayName = Type.String({ minLength: 1, maxLength: 64, pattern: ONE_LINE, description: 'Shown on the sign-in page as "Sign in with <display name>".', examples: ['Corporate SSO'] })
const Issuer = Type.String({
  minLength: 8,
  maxLength: 2048,
  format: 'uri',
  pattern: '^https?://',
  description: 'The issuer URL; its `/.well-known/openid-configuration` is read (discovery). Must be https, except on a loopback address. Through the API it must lead to a public address (not loopback, private, link-local such as 169.254.169.254, or otherwise internal) unless WEBHOOK_ALLOW_PRIVATE is set; every request to the provider is checked again as it connects.',
  examples: ['https://login.example.com/realms/staff']
})
const ClientId = Type.String({ minLength: 1, maxLength: 255, pattern: ONE_LINE, examples: ['gatehouse'] })
const ClientSecret = Type.String({
  minLength: 1,
  maxLength: 1024,
  format: 'password',
  writeOnly: true,
  description: 'Write-only: never returned. Kept encrypted with MFA_ENCRYPTION_KEY, which must be set to store one. Omit (or null) for a public client.'
})
const Scope = Type.String({ minLength: 1, maxLength: 64, pattern: '^[\\x21\\x23-\\x5B\\x5D-\\x7E]+$' })
const Scopes = Type.Array(Scope, { minItems: 1, maxItems: 20, uniqueItems: true, description: 'Must include `openid`. Default `["openid", "email", "profile"]`.', examples: [['openid', 'email', 'profile', 'groups']] })
const Group = Type.String({ minLength: 1, maxLength: 64, pattern: ONE_LINE })
const ProviderGroup = Type.String({ minLength: 1, maxLength: 256, pattern: ONE_LINE })
const GroupsClaim = Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:/-]+$', description: 'The ID-token or userinfo claim that lists the person\'s groups at the provider, e.g. `groups`.', examples: ['groups'] })
const GroupMap = Type.Record(ProviderGroup, Type.Array(Group, { maxItems: 100, uniqueItems: true }), {
  maxProperties: MAX_MAPPED_GROUPS,
  description: 'Provider group → gatehouse groups. At each sign-in the user holds exactly the mapped groups their provider groups give, among all groups this map names; groups the map never names are left alone.',
  examples: [{ 'data-engineers': ['pipelines', 'analysts'] }]
})
const AdminGroups = Type.Array(ProviderGroup, {
  maxItems: MAX_MAPPED_GROUPS,
  uniqueItems: true,
  description: 'Provider groups that make the user an admin. When not empty, the role is set at each sign-in: `admin` with one of these groups, `user` without.',
  examples: [['gatehouse-admins']]
})

const settings = {
  display_name: DisplayName,
  issuer: Issuer,
  client_id: ClientId,
  scopes: Scopes,
  enabled: Type.Boolean({ description: 'Disabled providers keep their links but no one signs in through them.' }),
  jit: Type.Boolean({ description: 'Create a user at the first sign-in of someone gatehouse does not know (just-in-time). Default false.' }),
  link_by_email: Type.Boolean({ description: 'Link a first sign-in to the existing user with the same email, only when the provider says the email is verified. Default false.' }),
  groups_claim: Nullable(GroupsClaim),
  group_map: GroupMap,
  admin_groups: AdminGroups
}

export const OidcProvider = Type.Object({
  id: ProviderId,
  ...settings,
  client_secret_set: Type.Boolean({ description: 'Whether a client secret is stored (it is never shown).' }),
  source: Type.Union([Type.Literal('environment'), Type.Literal('api')], { description: '`environment`: from OIDC_PROVIDERS, read-only here. `api`: created through this API.' }),
  redirect_path: Type.String({ maxLength: 128, pattern: '^/', description: 'The callback path to register at the provider, under the origin browsers reach gatehouse at.', examples: ['/auth/sso/corp/callback'] }),
  created_at: Nullable(Timestamp()),
  updated_at: Nullable(Timestamp())
}, { $id: 'OidcProvider', additionalProperties: false, description: 'An OpenID Connect provider people can sign in through.' })
export type OidcProvider = Static<typeof OidcProvider>

const CREATE_EXAMPLE = {
  id: 'corp',
  display_name: 'Corporate SSO',
  issuer: 'https://login.example.com/realms/staff',
  client_id: 'gatehouse',
  client_secret: 'change-me',
  scopes: ['openid', 'email', 'profile', 'groups'],
  jit: true,
  link_by_email: true,
  groups_claim: 'groups',
  group_map: { 'data-engineers': ['pipelines'] },
  admin_groups: ['gatehouse-admins']
}

/** The fields that are optional both when a provider is created and when it is patched. */
const optionalProviderFields = {
  client_secret: Type.Optional(Nullable(ClientSecret)),
  scopes: Type.Optional(Scopes),
  jit: Type.Optional(settings.jit),
  link_by_email: Type.Optional(settings.link_by_email),
  groups_claim: Type.Optional(Nullable(GroupsClaim)),
  group_map: Type.Optional(GroupMap),
  admin_groups: Type.Optional(AdminGroups)
}

export const OidcProviderCreate = Type.Object({
  id: ProviderId,
  display_name: DisplayName,
  issuer: Issuer,
  client_id: ClientId,
  enabled: Type.Optional(Type.Boolean({ default: true })),
  ...optionalProviderFields
}, {
  $id: 'OidcProviderCreate',
  additionalProperties: false,
  description: 'A new provider; also the shape of each entry of OIDC_PROVIDERS. Register `<origin>/auth/sso/<id>/callback` as its redirect URI.',
  examples: [CREATE_EXAMPLE]
})
export type OidcProviderCreate = Static<typeof OidcProviderCreate>

export const OidcProviderPatch = Type.Object({
  display_name: Type.Optional(DisplayName),
  issuer: Type.Optional(Issuer),
  client_id: Type.Optional(ClientId),
  enabled: Type.Optional(settings.enabled),
  ...optionalProviderFields
}, {
  $id: 'OidcProviderPatch',
  additionalProperties: false,
  description: 'A JSON merge patch: only the fields sent change; `client_secret: null` removes the secret.',
  examples: [{ display_name: 'Staff sign-in', jit: false }]
})
export type OidcProviderPatch = Static<typeof OidcProviderPatch>

export const ProviderParams = Type.Object({ provider_id: ProviderId }, { additionalProperties: false })

export const UserIdentity = Type.Object({
  id: Uuid(),
  provider: Type.String({ maxLength: 64, pattern: '^[a-z]+(:[a-z0-9_-]+)?$', description: '`oidc:<provider id>` or `ldap`.', examples: ['oidc:corp'] }),
  subject: Type.String({ maxLength: 1024, pattern: ONE_LINE, description: 'The provider\'s permanent name for the account: an ID token\'s `sub`, an LDAP DN.' }),
  email: Nullable(Type.String({ maxLength: 254, format: 'email', description: 'As the provider last reported it; for display only.' })),
  created_at: Timestamp(),
  last_sign_in_at: Nullable(Timestamp())
}, { $id: 'UserIdentity', additionalProperties: false, description: 'An account at an identity provider that signs in as this user.' })
export type UserIdentity = Static<typeof UserIdentity>

export const MAX_IDENTITIES = 100

export const UserIdentityParams = Type.Object({ user_id: Uuid(), identity_id: Uuid() }, { additionalProperties: false })
export const UserParams = Type.Object({ user_id: Uuid() }, { additionalProperties: false })

export const SSO_SCHEMAS = [OidcProvider, OidcProviderCreate, OidcProviderPatch, UserIdentity]
