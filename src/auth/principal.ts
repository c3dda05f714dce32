import { Type } from 'typebox'

export const SCOPES = ['admin', 'users:read', 'users:write', 'events:read', 'webhooks:manage', 'scim'] as const
export type Scope = typeof SCOPES[number]
export const ScopeSchema = Type.Enum(SCOPES, {
  description: '`admin` grants everything except SCIM; the others grant one kind of access. `scim` is for an identity provider\'s provisioning ' +
    '(docs/scim.md): it reaches `/scim/v2` and nothing else, no other scope reaches `/scim/v2`, and a key that has it has no other scope.'
})

/** The user a credential acts for, as /verify reports it. */
export interface PrincipalUser {
  id: string
  username: string
  role: 'admin' | 'user'
  groups: string[]
}

/** Who is calling. Attached to every authenticated request and recorded as the actor of events. */
export interface Principal {
  /** An API key, or a signed-in user's session. */
  type: 'api_key' | 'session'
  /** The key's or session's id (never its secret). */
  id: string
  /** The user the credential acts for, when it belongs to one. */
  userId: string | null
  user: PrincipalUser | null
  /** What the credential may do now, after its owner's role is taken into account. */
  scopes: ReadonlySet<Scope>
  /** A session whose sign-in included a second factor (X-Auth-MFA); never an API key. */
  mfa?: boolean
  /** When the credential ends by itself (expiry, idle time-out), in ms since the epoch: no cache keeps it longer. */
  validUntil?: number
}

export function hasScope (principal: Principal, scope: Scope): boolean {
  // SCIM is a door of its own: an admin key does not reach it (docs/scim.md).
  if (scope === 'scim') return principal.scopes.has('scim')
  return principal.scopes.has('admin') || principal.scopes.has(scope)
}

export function isAdmin (principal: Principal): boolean {
  return principal.scopes.has('admin')
}

/** The actor and request facts every event carries. */
export interface RequestContext {
  actorType: 'api_key' | 'user' | 'system'
  actorId: string | null
  requestId: string | null
  clientIp: string | null
  /**
   * The credential that asked, when a request's credential did: whether it is
   * an admin credential, and the user it acts for. The user and group
   * lifecycles refuse a change of an admin account to any other (absent: the
   * service's own changes, such as a sign-in's group mapping).
   */
  credential?: { admin: boolean, userId: string | null }
}

export const SYSTEM_CONTEXT: RequestContext = { actorType: 'system', actorId: null, requestId: null, clientIp: null }
