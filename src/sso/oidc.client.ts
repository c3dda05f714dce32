import type * as oidc from 'openid-client'
import type { Config } from '../config.ts'
import { toBool, toIso, toStringArray } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { digestOf } from '../lib/secrets.ts'
import { guardedFetch } from '../lib/guarded-fetch.ts'
import { RefusedAddressError } from '../lib/ssrf-guard.ts'
import { open, SecretBoxError } from '../lib/secret-box.ts'
import type { ProviderRow } from './oidc.repository.ts'
import { isLoopback, type OidcProviderSettings } from './oidc.settings.ts'

/*
 * The OpenID Connect client side of a provider: its settings as stored, and
 * its discovered configuration (openid-client), kept per provider and
 * forgotten when the provider changes. Shared by the providers service (which
 * changes providers) and the sign-in service and flow (which use them).
 */

/** Discovery documents are read again after this long, so a provider's new endpoints are picked up without a restart. */
const DISCOVERY_TTL_MS = 3_600_000
/** Seconds openid-client waits for the provider's answers. */
const PROVIDER_TIMEOUT_S = 10

/** The context the secret of an API-made provider is sealed in, so a sealed secret copied onto another provider does not open. */
export function secretContext (providerId: string): string {
  return `oidc_provider:${providerId}`
}

/** `keys`: the MFA_ENCRYPTION_KEY ring, any of which may have sealed the secret. */
export function rowToSettings (row: ProviderRow, keys: readonly Buffer[]): OidcProviderSettings {
  let clientSecret: string | undefined
  if (row.client_secret !== null) {
    if (keys.length === 0) throw new AppError('dependency_unavailable', 503, `The client secret of provider "${row.id}" is sealed, and MFA_ENCRYPTION_KEY is not set.`)
    try {
      clientSecret = open(keys, row.client_secret, secretContext(row.id))
    } catch (error) {
      if (!(error instanceof SecretBoxError)) throw error
      throw new AppError('dependency_unavailable', 503, `The client secret of provider "${row.id}" does not open with this MFA_ENCRYPTION_KEY (${error.message}); set it again.`)
    }
  }
  return {
    id: row.id,
    displayName: row.display_name,
    issuer: row.issuer,
    clientId: row.client_id,
    clientSecret,
    scopes: toStringArray(row.scopes),
    enabled: toBool(row.enabled),
    jit: toBool(row.jit),
    linkByEmail: toBool(row.link_by_email),
    groupsClaim: row.groups_claim,
    groupMap: typeof row.group_map === 'string' ? JSON.parse(row.group_map) as Record<string, string[]> : row.group_map,
    adminGroups: toStringArray(row.admin_groups),
    source: 'api',
    createdAt: toIso(row.created_at),
    updatedAt: toIso(row.updated_at)
  }
}

const discovered = new Map<string, { fingerprint: string, at: number, configuration: Promise<oidc.Configuration> }>()

// Loaded by the first OIDC sign-in, not at start-up: a deployment without providers never needs it.
let openidClientModule: Promise<typeof oidc> | undefined
export async function openidClient (): Promise<typeof oidc> {
  return await (openidClientModule ??= import('openid-client'))
}

/**
 * Whether requests to this provider may reach internal addresses: a provider
 * from OIDC_PROVIDERS is the operator's own word; one made through the API
 * only with WEBHOOK_ALLOW_PRIVATE (docs/sso.md).
 */
function mayReachPrivate (config: Pick<Config, 'webhookAllowPrivate'>, provider: OidcProviderSettings): boolean {
  return provider.source === 'environment' || config.webhookAllowPrivate
}

/**
 * The provider's metadata (discovery), read once an hour and whenever its
 * settings change. Every request to the provider (discovery, keys, token,
 * userinfo) goes through the SSRF guard as it connects, so neither the
 * issuer nor an endpoint its metadata names can lead to an internal address.
 */
export async function clientConfiguration (config: Pick<Config, 'webhookAllowPrivate'>, provider: OidcProviderSettings): Promise<oidc.Configuration> {
  const allowPrivate = mayReachPrivate(config, provider)
  const fingerprint = digestOf(JSON.stringify([provider.issuer, provider.clientId, provider.clientSecret ?? '', allowPrivate]))
  const cached = discovered.get(provider.id)
  if (cached !== undefined && cached.fingerprint === fingerprint && Date.now() - cached.at < DISCOVERY_TTL_MS) return await cached.configuration
  const issuer = new URL(provider.issuer)
  // Plain http only where nobody else can see it (settingsProblems refuses it elsewhere).
  const insecure = issuer.protocol === 'http:' && isLoopback(issuer.hostname)
  const configuration = (async () => {
    const client = await openidClient()
    const fetch = guardedFetch(allowPrivate)
    const found = await client.discovery(issuer, provider.clientId, undefined, undefined, {
      timeout: PROVIDER_TIMEOUT_S, [client.customFetch]: fetch, ...(insecure ? { execute: [client.allowInsecureRequests] } : {})
    })
    const metadata = found.serverMetadata()
    const methods = metadata.token_endpoint_auth_methods_supported ?? ['client_secret_basic']
    const auth = provider.clientSecret === undefined
      ? client.None()
      : methods.includes('client_secret_basic') ? client.ClientSecretBasic(provider.clientSecret) : client.ClientSecretPost(provider.clientSecret)
    const ready = new client.Configuration(metadata, provider.clientId, {}, auth)
    ready.timeout = PROVIDER_TIMEOUT_S
    ready[client.customFetch] = fetch
    if (insecure) client.allowInsecureRequests(ready)
    return ready
  })()
  discovered.set(provider.id, { fingerprint, at: Date.now(), configuration })
  try {
    return await configuration
  } catch (error) {
    discovered.delete(provider.id)
    const why = refusedAddress(error) !== undefined ? 'it leads to an internal address' : 'discovery failed'
    throw new AppError('dependency_unavailable', 503, `The identity provider "${provider.displayName}" could not be reached (${provider.issuer}: ${why}).`, {
      cause: error, headers: { 'Retry-After': '5' }
    })
  }
}

/** The SSRF guard's refusal somewhere in an error's causes (openid-client wraps what fetch threw). */
function refusedAddress (error: unknown): RefusedAddressError | undefined {
  for (let e = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    if (e instanceof RefusedAddressError) return e
  }
  return undefined
}

export function forgetProvider (id: string): void {
  discovered.delete(id)
}
