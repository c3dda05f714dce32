import { timingSafeEqual } from 'node:crypto'
import type { Config } from '../config.ts'
import { toBool, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import { newId } from '../lib/ids.ts'
import { digestOf } from '../lib/secrets.ts'
import type { SessionsDeps } from '../sessions/sessions.types.ts'
import { deleteLoginsBefore, findProviderRow, insertLogin, listProviderRows, takeLogin } from './oidc.repository.ts'
import { clientConfiguration, openidClient, rowToSettings } from './oidc.client.ts'
import type { OidcProviderSettings } from './oidc.settings.ts'

/** From the redirect to the provider to the callback: long enough to type a password and a code there. */
export const LOGIN_STATE_MS = 10 * 60_000
export type SsoDeps = SessionsDeps & { config: SessionsDeps['config'] & Pick<Config, 'oidcProviders' | 'basePath' | 'webhookAllowPrivate'> }

export function identityProvider (providerId: string): string {
  return `oidc:${providerId}`
}

/** A provider people may sign in through now, or undefined (unknown or disabled). */
async function findEnabledProvider (deps: SsoDeps, id: string): Promise<OidcProviderSettings | undefined> {
  const configured = deps.config.oidcProviders.find(p => p.id === id)
  if (configured !== undefined) return configured.enabled ? configured : undefined
  const row = await findProviderRow(deps.db, id)
  if (row === undefined || !toBool(row.enabled)) return undefined
  return rowToSettings(row, deps.config.mfaKeyRing)
}

/** The buttons of the sign-in page: enabled providers, configured ones first. */
export async function signInProviders (db: Db, config: Pick<Config, 'oidcProviders'>): Promise<Array<{ id: string, displayName: string }>> {
  const configured = config.oidcProviders.filter(p => p.enabled)
  const taken = new Set(config.oidcProviders.map(p => p.id))
  const rows = (await listProviderRows(db, 50)).filter(r => toBool(r.enabled) && !taken.has(r.id))
  return [...configured.map(p => ({ id: p.id, displayName: p.displayName })), ...rows.map(r => ({ id: r.id, displayName: r.display_name }))]
}

function providerNotFound (id: string): AppError {
  return new AppError('sso_provider_not_found', 404, `No enabled sign-in provider has the id "${id}".`)
}

/**
 * The redirect to the provider. What the callback needs to check the answer
 * (PKCE verifier, nonce, where to go next) is kept server-side for ten
 * minutes under the digest of `state`; the browser gets `state` in a cookie
 * too, so the answer is only taken from the browser that set out.
 */
export async function startLogin (deps: SsoDeps, providerId: string, next: string | undefined, redirectUri: string): Promise<{ url: string, state: string }> {
  const provider = await findEnabledProvider(deps, providerId)
  if (provider === undefined) throw providerNotFound(providerId)
  const configuration = await clientConfiguration(deps.config, provider)
  const client = await openidClient()
  const codeVerifier = client.randomPKCECodeVerifier()
  const state = client.randomState()
  const nonce = client.randomNonce()
  const now = new Date()
  // Expired attempts are of no use to anyone; removing them here keeps the table to minutes of traffic.
  await deleteLoginsBefore(deps.db, new Date(now.getTime() - LOGIN_STATE_MS).toISOString())
  await insertLogin(deps.db, {
    id: newId(),
    state_digest: digestOf(state),
    provider_id: provider.id,
    code_verifier: codeVerifier,
    nonce,
    next: next ?? null,
    created_at: now.toISOString(),
    expires_at: new Date(now.getTime() + LOGIN_STATE_MS).toISOString(),
    used_at: null
  })
  const url = client.buildAuthorizationUrl(configuration, {
    redirect_uri: redirectUri,
    scope: provider.scopes.join(' '),
    code_challenge: await client.calculatePKCECodeChallenge(codeVerifier),
    code_challenge_method: 'S256',
    state,
    nonce
  })
  return { url: url.href, state }
}

export type SsoFailureReason = 'state_invalid' | 'provider_error' | 'token_rejected' | 'no_account' | 'email_unverified' | 'disabled' | 'identity_conflict'

/** A refused sign-in; `reason` is for the event log, `detail` for the person. */
export class SsoRefusal extends AppError {
  readonly reason: SsoFailureReason
  readonly next: string | undefined
  constructor (reason: SsoFailureReason, status: 401 | 403, detail: string, next: string | undefined) {
    super(status === 401 ? 'sso_failed' : 'sso_refused', status, detail)
    this.reason = reason
    this.next = next
  }
}

function sameSecret (a: string, b: string): boolean {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}

export type Claims = Record<string, unknown>

export function claimString (claims: Claims, name: string, max: number): string | undefined {
  const value = claims[name]
  return typeof value === 'string' && value !== '' && value.length <= max ? value : undefined
}

/** Only an explicit yes; some providers send it as the string "true". */
export function emailVerified (claims: Claims): boolean {
  return claims.email_verified === true || claims.email_verified === 'true'
}

/** The provider groups a claim lists: an array of strings, or one string. */
function providerGroups (claims: Claims, claim: string | null): string[] {
  if (claim === null) return []
  const value = claims[claim]
  if (typeof value === 'string') return [value]
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : []
}

/**
 * The user's groups and role as the provider's groups make them: groups the
 * map names are held exactly when a provider group gives them, groups it
 * never names are left as they are; the role follows `admin_groups` when
 * that is set.
 */
export function mappedAccess (provider: OidcProviderSettings, claims: Claims, groups: string[], role: 'admin' | 'user'): { groups: string[], role: 'admin' | 'user' } {
  if (provider.groupsClaim === null) return { groups, role }
  const theirs = new Set(providerGroups(claims, provider.groupsClaim))
  const managed = new Set(Object.values(provider.groupMap).flat())
  const given = new Set(Object.entries(provider.groupMap).filter(([group]) => theirs.has(group)).flatMap(([, mapped]) => mapped))
  const kept = groups.filter(g => !managed.has(g))
  const next = [...kept, ...[...given].filter(g => !kept.includes(g)).sort()].slice(0, 100)
  const nextRole = provider.adminGroups.length === 0 ? role : provider.adminGroups.some(g => theirs.has(g)) ? 'admin' : 'user'
  return { groups: next, role: nextRole }
}

/** A refused callback, for the flow to record (`user.sso_login_failed`) and answer. */
export interface CallbackRefusal { reason: SsoFailureReason, status: 401 | 403, detail: string, next: string | undefined, extra: Record<string, unknown> }

export type CallbackAnswer =
  | { kind: 'claims', provider: OidcProviderSettings, source: string, next: string | undefined, claims: Claims }
  | { kind: 'refused', provider: OidcProviderSettings, source: string, refusal: CallbackRefusal }

/**
 * Reads the provider's answer at the callback: the state must be one this
 * browser set out with and not used before; openid-client exchanges the code
 * (PKCE) and checks the ID token (signature, issuer, audience, expiry,
 * nonce), then reads userinfo. Answers the claims, or why they were refused.
 */
export async function readCallback (
  deps: SsoDeps, providerId: string, callbackUrl: URL, browserState: string | undefined, redirectUri: string, now: Date
): Promise<CallbackAnswer> {
  const provider = await findEnabledProvider(deps, providerId)
  if (provider === undefined) throw providerNotFound(providerId)
  const source = identityProvider(provider.id)
  const refuse = (reason: SsoFailureReason, detail: string, next: string | undefined, extra: Record<string, unknown> = {}): CallbackAnswer =>
    ({ kind: 'refused', provider, source, refusal: { reason, status: 401, detail, next, extra } })

  const state = callbackUrl.searchParams.get('state') ?? ''
  const login = state !== '' && browserState !== undefined && sameSecret(state, browserState)
    ? await takeLogin(deps.db, digestOf(state), provider.id, now.toISOString())
    : undefined
  if (login === undefined) {
    return refuse('state_invalid', 'This sign-in has expired, was already used, or was started in another browser. Start it again.', undefined)
  }
  const next = login.next ?? undefined
  const providerError = callbackUrl.searchParams.get('error')
  if (providerError !== null) {
    return refuse('provider_error', `${provider.displayName} did not sign you in (${providerError.slice(0, 64)}).`, next, { error: providerError.slice(0, 64) })
  }

  const configuration = await clientConfiguration(deps.config, provider)
  const client = await openidClient()
  let claims: Claims
  try {
    const tokens = await client.authorizationCodeGrant(configuration, callbackUrl, {
      pkceCodeVerifier: login.code_verifier, expectedState: state, expectedNonce: login.nonce, idTokenExpected: true
    }, { redirect_uri: redirectUri })
    const idClaims = tokens.claims()!
    // Most providers put profile, email and group claims in userinfo rather than the ID token; the ID token's `sub` must match.
    const userinfo = configuration.serverMetadata().userinfo_endpoint !== undefined
      ? await client.fetchUserInfo(configuration, tokens.access_token, idClaims.sub)
      : {}
    claims = { ...userinfo, ...idClaims }
  } catch (error) {
    if (error instanceof AppError) throw error
    // openid-client wraps oauth4webapi's error, which says which check failed (e.g. the claim `nonce`):
    // administrators need that to tell a misconfiguration from an attack.
    const inner = error instanceof Error && error.cause instanceof Error ? error.cause : error
    const message = inner instanceof Error ? inner.message.slice(0, 200) : 'unknown error'
    const cause = (inner as { cause?: { claim?: unknown } }).cause
    const code = (error as { code?: unknown }).code
    return refuse('token_rejected', `The answer from ${provider.displayName} could not be verified. Start the sign-in again.`, next, {
      error: message, ...(typeof code === 'string' ? { error_code: code } : {}), ...(typeof cause?.claim === 'string' ? { claim: cause.claim } : {})
    })
  }
  return { kind: 'claims', provider, source, next, claims }
}
