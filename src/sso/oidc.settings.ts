import { Value } from 'typebox/value'
import { OidcProviderCreate } from './oidc.schemas.ts'

/** One provider as the service uses it, from OIDC_PROVIDERS or from the database. */
export interface OidcProviderSettings {
  id: string
  displayName: string
  issuer: string
  clientId: string
  /** In the clear: as configured, or opened from its sealed form. */
  clientSecret: string | undefined
  scopes: string[]
  enabled: boolean
  jit: boolean
  linkByEmail: boolean
  groupsClaim: string | null
  groupMap: Record<string, string[]>
  adminGroups: string[]
  source: 'environment' | 'api'
  createdAt: string | null
  updatedAt: string | null
}

export const DEFAULT_SCOPES = ['openid', 'email', 'profile']

/** Problems with one provider's settings beyond their schema; empty when there are none. */
export function settingsProblems (input: { issuer: string, scopes?: string[] | undefined }): Array<{ pointer: string, detail: string }> {
  const found: Array<{ pointer: string, detail: string }> = []
  const url = URL.canParse(input.issuer) ? new URL(input.issuer) : undefined
  if (url === undefined || (url.protocol !== 'https:' && !(url.protocol === 'http:' && isLoopback(url.hostname)))) {
    found.push({ pointer: '/issuer', detail: 'must be an https URL (plain http only on a loopback address)' })
  } else if (url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '') {
    found.push({ pointer: '/issuer', detail: 'must have no query, fragment or credentials' })
  }
  if (input.scopes !== undefined && !input.scopes.includes('openid')) found.push({ pointer: '/scopes', detail: 'must include openid' })
  return found
}

/** 127.0.0.0/8, ::1 and localhost: where plain http cannot be read or altered by anyone else on the network. */
export function isLoopback (hostname: string): boolean {
  return hostname === 'localhost' || hostname === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(hostname)
}

export function toSettings (input: OidcProviderCreate, source: 'environment' | 'api', createdAt: string | null = null, updatedAt: string | null = null): OidcProviderSettings {
  return {
    id: input.id,
    displayName: input.display_name,
    issuer: input.issuer,
    clientId: input.client_id,
    clientSecret: input.client_secret ?? undefined,
    scopes: input.scopes ?? DEFAULT_SCOPES,
    enabled: input.enabled ?? true,
    jit: input.jit ?? false,
    linkByEmail: input.link_by_email ?? false,
    groupsClaim: input.groups_claim ?? null,
    groupMap: input.group_map ?? {},
    adminGroups: input.admin_groups ?? [],
    source,
    createdAt,
    updatedAt
  }
}

/**
 * OIDC_PROVIDERS: a JSON array of provider objects, each shaped like the
 * body of Create SSO Provider (docs/sso.md). Any mistake stops the start with
 * the first problem found, rather than leaving a provider half-working.
 */
export function parseOidcProviders (json: string): OidcProviderSettings[] {
  let parsed: unknown
  try {
    parsed = JSON.parse(json)
  } catch {
    throw new Error('OIDC_PROVIDERS must be a JSON array of provider objects (docs/sso.md)')
  }
  if (!Array.isArray(parsed)) throw new Error('OIDC_PROVIDERS must be a JSON array of provider objects (docs/sso.md)')
  const seen = new Set<string>()
  return parsed.map((entry: unknown, i) => {
    if (!Value.Check(OidcProviderCreate, entry)) {
      const first = Value.Errors(OidcProviderCreate, entry)[0]
      throw new Error(`OIDC_PROVIDERS[${i}]${first?.instancePath ?? ''}: ${first?.message ?? 'is not a provider object'}`)
    }
    const problem = settingsProblems(entry)[0]
    if (problem !== undefined) throw new Error(`OIDC_PROVIDERS[${i}]${problem.pointer}: ${problem.detail}`)
    if (seen.has(entry.id)) throw new Error(`OIDC_PROVIDERS: the id "${entry.id}" is used twice`)
    seen.add(entry.id)
    return toSettings(entry, 'environment')
  })
}
