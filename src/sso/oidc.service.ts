import { timingSafeEqual } from 'node:crypto'
import type * as oidc from 'openid-client'
import type { Config } from '../config.ts'
import { toBool, toIso, toStringArray, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.service.ts'
import { newId } from '../lib/ids.ts'
import { digestOf } from '../lib/secrets.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'
import { mappedRoleKeepingLastAdmin, toUser } from '../users/users.service.ts'
import { findUserById, insertUser, updateUser, type NewUserRow, type UserRow } from '../users/users.repository.ts'
import { openSignInChallenge, secondFactorNeeded, type MfaPending } from '../mfa/mfa.service.ts'
import { openSession, reserveAttempt, type SessionsDeps, type SignIn, type SignInContext } from '../sessions/sessions.service.ts'
import { findIdentity, findIdentityOfUser, insertIdentity, touchIdentity } from './identities.repository.ts'
import { externalUserRow } from './identities.service.ts'
import { deleteLoginsBefore, findProviderRow, insertLogin, listProviderRows, takeLogin, type ProviderRow } from './oidc.repository.ts'
import { open, SecretBoxError } from '../mfa/secret-box.ts'
import { isLoopback, type OidcProviderSettings } from './oidc.settings.ts'
import { guardedFetch } from '../lib/guarded-fetch.ts'
import { RefusedAddressError } from '../lib/ssrf-guard.ts'

/** From the redirect to the provider to the callback: long enough to type a password and a code there. */
export const LOGIN_STATE_MS = 10 * 60_000
/** Discovery documents are read again after this long, so a provider's new endpoints are picked up without a restart. */
const DISCOVERY_TTL_MS = 3_600_000
/** Seconds openid-client waits for the provider's answers. */
const PROVIDER_TIMEOUT_S = 10

export type SsoDeps = SessionsDeps & { config: SessionsDeps['config'] & Pick<Config, 'oidcProviders' | 'basePath' | 'webhookAllowPrivate'> }

/** The context the secret of an API-made provider is sealed in, so a sealed secret copied onto another provider does not open. */
export function secretContext (providerId: string): string {
  return `oidc_provider:${providerId}`
}

export function identityProvider (providerId: string): string {
  return `oidc:${providerId}`
}

export function rowToSettings (row: ProviderRow, key: Buffer | undefined): OidcProviderSettings {
  let clientSecret: string | undefined
  if (row.client_secret !== null) {
    if (key === undefined) throw new AppError('dependency_unavailable', 503, `The client secret of provider "${row.id}" is sealed, and MFA_ENCRYPTION_KEY is not set.`)
    try {
      clientSecret = open(key, row.client_secret, secretContext(row.id))
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

/** A provider people may sign in through now, or undefined (unknown or disabled). */
async function findEnabledProvider (deps: SsoDeps, id: string): Promise<OidcProviderSettings | undefined> {
  const configured = deps.config.oidcProviders.find(p => p.id === id)
  if (configured !== undefined) return configured.enabled ? configured : undefined
  const row = await findProviderRow(deps.db, id)
  if (row === undefined || !toBool(row.enabled)) return undefined
  return rowToSettings(row, deps.config.mfaEncryptionKey)
}

/** The buttons of the sign-in page: enabled providers, configured ones first. */
export async function signInProviders (db: Db, config: Pick<Config, 'oidcProviders'>): Promise<Array<{ id: string, displayName: string }>> {
  const configured = config.oidcProviders.filter(p => p.enabled)
  const taken = new Set(config.oidcProviders.map(p => p.id))
  const rows = (await listProviderRows(db, 50)).filter(r => toBool(r.enabled) && !taken.has(r.id))
  return [...configured.map(p => ({ id: p.id, displayName: p.displayName })), ...rows.map(r => ({ id: r.id, displayName: r.display_name }))]
}

const discovered = new Map<string, { fingerprint: string, at: number, configuration: Promise<oidc.Configuration> }>()

// Loaded by the first OIDC sign-in, not at start-up: a deployment without providers never needs it.
let openidClientModule: Promise<typeof oidc> | undefined
async function openidClient (): Promise<typeof oidc> {
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
async function clientConfiguration (config: Pick<Config, 'webhookAllowPrivate'>, provider: OidcProviderSettings): Promise<oidc.Configuration> {
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

export type SsoResult = { next: string | undefined } & (({ kind: 'session' } & SignIn) | ({ kind: 'mfa' } & MfaPending))

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

type Claims = Record<string, unknown>

function claimString (claims: Claims, name: string, max: number): string | undefined {
  const value = claims[name]
  return typeof value === 'string' && value !== '' && value.length <= max ? value : undefined
}

/** Only an explicit yes; some providers send it as the string "true". */
function emailVerified (claims: Claims): boolean {
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

const USERNAME_RE = new RegExp(USERNAME_PATTERN)

/** A free username for a new user: the provider's preferred_username or email (cleaned up), else the subject; `-2`, `-3`… when taken. */
async function freeUsername (db: Db, claims: Claims, subject: string): Promise<string> {
  const wanted = claimString(claims, 'preferred_username', 254) ?? claimString(claims, 'email', 254) ?? `user-${digestOf(subject).slice(0, 12)}`
  let base = wanted.replace(/[^A-Za-z0-9._@-]+/g, '_').slice(0, 56)
  if (!USERNAME_RE.test(base)) base = `user-${digestOf(subject).slice(0, 12)}`
  const candidates = [base, ...Array.from({ length: 49 }, (_, i) => `${base}-${i + 2}`)]
  const taken = new Set((await db.selectFrom('users').select('username_key')
    .where('username_key', 'in', candidates.map(c => c.toLowerCase())).execute()).map(r => r.username_key))
  // Fifty people of one name are unlikely; past them the subject's digest makes the name unique.
  return candidates.find(c => !taken.has(c.toLowerCase())) ?? `${base.slice(0, 40)}-${digestOf(subject).slice(0, 12)}`
}

async function emailOwner (db: Db, email: string): Promise<UserRow | undefined> {
  return await db.selectFrom('users').selectAll().where('email_key', '=', email.toLowerCase()).executeTakeFirst()
}

interface Who {
  /** The existing user, or the row of the user to create (just-in-time). */
  user: UserRow | undefined
  create: NewUserRow | undefined
  /** How a new identity comes to be: linked by email, or with a new user. */
  link: 'email' | 'jit' | undefined
  identityId: string
}

/**
 * Finishes a sign-in at the callback: the state must be one this browser set
 * out with and not used before; openid-client exchanges the code (PKCE) and
 * checks the ID token (signature, issuer, audience, expiry, nonce). Then the
 * account: the identity linked before, else a user with the same verified
 * email (when the provider allows linking), else a new user (when it allows
 * just-in-time creation). A second factor the user has is still asked for.
 */
export async function finishLogin (
  deps: SsoDeps, ctx: SignInContext, providerId: string, callbackUrl: URL, browserState: string | undefined, redirectUri: string
): Promise<SsoResult> {
  const ip = ctx.clientIp ?? 'unknown'
  const budget = { key: `addr:${ip}`, limit: deps.config.loginMaxFailuresPerAddress }
  // Each refused callback counts against the address like a failed password; a sign-in that succeeds gives its unit back.
  await reserveAttempt(deps, [budget])
  const provider = await findEnabledProvider(deps, providerId)
  if (provider === undefined) throw providerNotFound(providerId)
  const source = identityProvider(provider.id)
  const refuse = async (reason: SsoFailureReason, status: 401 | 403, detail: string, next: string | undefined, userId?: string, extra: Record<string, unknown> = {}): Promise<never> => {
    await recordEvent(deps.db, userId !== undefined ? { ...ctx, actorType: 'user', actorId: userId } : ctx, 'user.sso_login_failed',
      userId !== undefined ? { type: 'user', id: userId } : null, { provider: source, reason, ...extra })
    throw new SsoRefusal(reason, status, detail, next)
  }

  const state = callbackUrl.searchParams.get('state') ?? ''
  const now = new Date()
  const login = state !== '' && browserState !== undefined && sameSecret(state, browserState)
    ? await takeLogin(deps.db, digestOf(state), provider.id, now.toISOString())
    : undefined
  if (login === undefined) {
    return await refuse('state_invalid', 401, 'This sign-in has expired, was already used, or was started in another browser. Start it again.', undefined)
  }
  const next = login.next ?? undefined
  const providerError = callbackUrl.searchParams.get('error')
  if (providerError !== null) {
    return await refuse('provider_error', 401, `${provider.displayName} did not sign you in (${providerError.slice(0, 64)}).`, next, undefined, { error: providerError.slice(0, 64) })
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
    return await refuse('token_rejected', 401, `The answer from ${provider.displayName} could not be verified. Start the sign-in again.`, next, undefined, {
      error: message, ...(typeof code === 'string' ? { error_code: code } : {}), ...(typeof cause?.claim === 'string' ? { claim: cause.claim } : {})
    })
  }
  const subject = String(claims.sub)
  const email = claimString(claims, 'email', 254) ?? null
  const verified = email !== null && emailVerified(claims)

  const linked = await findIdentity(deps.db, source, subject)
  let who: Who
  if (linked !== undefined) {
    who = { user: await findUserById(deps.db, linked.user_id), create: undefined, link: undefined, identityId: linked.id }
  } else {
    const owner = email !== null ? await emailOwner(deps.db, email) : undefined
    if (owner !== undefined && provider.linkByEmail) {
      if (!verified) {
        return await refuse('email_unverified', 403, `An account with the email ${email} exists, but ${provider.displayName} does not say that the email is verified, so it is not linked. Ask an administrator.`,
          next, undefined, { subject })
      }
      if (await findIdentityOfUser(deps.db, owner.id, source) !== undefined) {
        return await refuse('identity_conflict', 403, `The account with the email ${email} is already linked to another ${provider.displayName} account. Ask an administrator.`,
          next, owner.id, { subject })
      }
      who = { user: owner, create: undefined, link: 'email', identityId: newId() }
    } else if (provider.jit) {
      const at = now.toISOString()
      const username = await freeUsername(deps.db, claims, subject)
      const access = mappedAccess(provider, claims, [], 'user')
      who = {
        user: undefined,
        // An email goes onto the account only when the provider vouches for it and nobody else has it.
        create: externalUserRow({
          username,
          email: verified && owner === undefined ? email : null,
          firstName: claimString(claims, 'given_name', 200),
          lastName: claimString(claims, 'family_name', 200),
          role: access.role,
          groups: access.groups,
          at
        }),
        link: 'jit',
        identityId: newId()
      }
    } else {
      return await refuse('no_account', 403, `Your ${provider.displayName} account is not linked to a user here, and new users are not created from it. Ask an administrator for access.`,
        next, undefined, { subject, ...(email !== null ? { email } : {}) })
    }
  }
  if (who.user !== undefined && toBool(who.user.disabled)) {
    return await refuse('disabled', 403, 'This account is disabled.', next, who.user.id, { subject })
  }

  const userId = who.user?.id ?? who.create!.id
  const userCtx: RequestContext = { ...ctx, actorType: 'user', actorId: userId }
  const before = who.user !== undefined ? { groups: toStringArray(who.user.groups), role: who.user.role } : undefined
  const access = before !== undefined ? mappedAccess(provider, claims, before.groups, before.role) : undefined
  const at = now.toISOString()

  /** Everything the sign-in changes, with its events, in one transaction. */
  const apply = async (trx: Db): Promise<void> => {
    if (who.create !== undefined) {
      const created = await insertUser(trx, who.create)
      const { created_at: _c, updated_at: _u, last_login_at: _l, password_changed_at: _p, ...fields } = toUser(created)
      await recordEvent(trx, userCtx, 'user.created', { type: 'user', id: userId }, { ...fields, source })
    }
    if (who.link !== undefined) {
      await insertIdentity(trx, { id: who.identityId, user_id: userId, provider: source, subject, email, created_at: at, last_sign_in_at: at })
      await recordEvent(trx, userCtx, 'user.identity_linked', { type: 'user', id: userId }, {
        identity_id: who.identityId, provider: source, subject, email, during: 'sign_in', match: who.link === 'email' ? 'email' : 'new_user'
      })
    } else {
      await touchIdentity(trx, who.identityId, email, at)
    }
    const kept: Record<string, unknown> = {}
    if (before !== undefined && access !== undefined) {
      const { role, keptLastAdmin } = await mappedRoleKeepingLastAdmin(trx, { id: userId, role: before.role, disabled: toBool(who.user!.disabled) }, access.role)
      if (keptLastAdmin) kept.role_kept = 'last_admin'
      const changes: Record<string, { from: unknown, to: unknown }> = {}
      if (JSON.stringify(before.groups) !== JSON.stringify(access.groups)) changes.groups = { from: before.groups, to: access.groups }
      if (before.role !== role) changes.role = { from: before.role, to: role }
      if (Object.keys(changes).length > 0) {
        const current = await findUserById(trx, userId, { forUpdate: true })
        if (current !== undefined) await updateUser(trx, userId, current.version, { groups: JSON.stringify(access.groups), role, updated_at: at, version: current.version + 1 })
        await recordEvent(trx, userCtx, 'user.updated', { type: 'user', id: userId }, { changes, source })
      }
    }
    await recordEvent(trx, userCtx, 'user.sso_login_succeeded', { type: 'user', id: userId }, {
      provider: source, subject, identity_id: who.identityId, ...kept
    })
  }

  // For the second-factor policy: an admin the mapping would demote may stay one
  // (the last admin rule, decided in `apply` under its lock), so either admin counts.
  const role = who.create?.role ?? (who.user!.role === 'admin' || access?.role === 'admin' ? 'admin' : 'user')
  const secondFactor = await secondFactorNeeded(deps, { id: userId, username: who.user?.username ?? who.create!.username, role })
  let result: SsoResult
  if (secondFactor !== undefined) {
    await deps.db.transaction().execute(apply)
    const pending = await openSignInChallenge(deps, ctx, { id: userId, username: who.user?.username ?? who.create!.username, role }, secondFactor, undefined, now)
    result = { kind: 'mfa', next, ...pending }
  } else {
    const locked = who.user?.locked_until != null && new Date(who.user.locked_until) > now
    // The account lock guards the password against guessing; the provider vouched for this person, so a lock is left in place but does not stop them.
    const signedIn = await openSession(deps, ctx, userId, { locked, now, via: source, within: apply })
    result = { kind: 'session', next, ...signedIn }
  }
  await deps.failures.release([budget.key])
  return result
}
