import type { Config } from '../config.ts'
import type { Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent, REDACTED } from '../events/events.repository.ts'
import { nowIso } from '../lib/ids.ts'
import { checkDestination } from '../lib/ssrf-guard.ts'
import { seal } from '../lib/secret-box.ts'
import { countProviderRows, deleteProviderRow, findProviderRow, insertProviderRow, listProviderRows, updateProviderRow, type ProviderRowUpdate } from './oidc.repository.ts'
import { MAX_PROVIDERS, type OidcProvider, type OidcProviderCreate, type OidcProviderPatch } from './oidc.schemas.ts'
import { forgetProvider, rowToSettings, secretContext } from './oidc.client.ts'
import { DEFAULT_SCOPES, settingsProblems, type OidcProviderSettings } from './oidc.settings.ts'

type ProvidersConfig = Pick<Config, 'oidcProviders' | 'mfaEncryptionKey' | 'basePath' | 'webhookAllowPrivate'>

function toProvider (p: OidcProviderSettings, basePath: string, secretSet: boolean): OidcProvider {
  return {
    id: p.id,
    display_name: p.displayName,
    issuer: p.issuer,
    client_id: p.clientId,
    scopes: p.scopes,
    enabled: p.enabled,
    jit: p.jit,
    link_by_email: p.linkByEmail,
    groups_claim: p.groupsClaim,
    group_map: p.groupMap,
    admin_groups: p.adminGroups,
    client_secret_set: secretSet,
    source: p.source,
    redirect_path: `${basePath}/sso/${p.id}/callback`,
    created_at: p.createdAt,
    updated_at: p.updatedAt
  }
}

/** A row as the API shows it: the secret is never opened for this, only reported as set. */
function rowToProvider (row: Parameters<typeof rowToSettings>[0], basePath: string): OidcProvider {
  return toProvider(rowToSettings({ ...row, client_secret: null }, []), basePath, row.client_secret !== null)
}

function notFound (id: string): AppError {
  return new AppError('sso_provider_not_found', 404, `No sign-in provider has the id "${id}".`)
}

function assertValid (input: { issuer: string, scopes?: string[] | undefined }): void {
  const found = settingsProblems(input)
  if (found.length > 0) {
    throw new AppError('validation_failed', 422, 'The provider settings are not usable.', { errors: found.map(f => ({ in: 'body', ...f })) })
  }
}

/**
 * The SSRF guard for an issuer typed through the API: its host must resolve,
 * and only to public addresses unless WEBHOOK_ALLOW_PRIVATE is set. Requests
 * to the provider check again as they connect (guarded-fetch.ts).
 */
async function assertReachableIssuer (config: ProvidersConfig, issuer: string): Promise<void> {
  // The same answer as the issuer's other problems (settingsProblems): the value is not usable here.
  const refuse = (detail: string): AppError => new AppError('validation_failed', 422, `The issuer ${detail}.`, {
    errors: [{ in: 'body', pointer: '/issuer', detail }]
  })
  try {
    await checkDestination(new URL(issuer), config.webhookAllowPrivate)
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'EADDRREFUSED') throw refuse(`leads to an internal address (${(error as Error).message}); set WEBHOOK_ALLOW_PRIVATE to allow it`)
    throw refuse(`host name does not resolve (${code ?? 'lookup failed'})`)
  }
}

function sealSecret (config: ProvidersConfig, id: string, secret: string): string {
  if (config.mfaEncryptionKey === undefined) {
    throw new AppError('validation_failed', 422, 'A client secret is kept encrypted with MFA_ENCRYPTION_KEY, which is not set.', {
      errors: [{ in: 'body', pointer: '/client_secret', detail: 'needs MFA_ENCRYPTION_KEY to be set' }]
    })
  }
  return seal(config.mfaEncryptionKey, secret, secretContext(id))
}

function assertNotConfigured (config: ProvidersConfig, id: string): void {
  if (config.oidcProviders.some(p => p.id === id)) {
    throw new AppError('sso_provider_read_only', 409, `The provider "${id}" comes from OIDC_PROVIDERS; change it there.`)
  }
}

/** Providers from OIDC_PROVIDERS, then those made through the API. */
export async function listProviders (db: Db, config: ProvidersConfig): Promise<OidcProvider[]> {
  const configured = config.oidcProviders.map(p => toProvider(p, config.basePath, p.clientSecret !== undefined))
  const taken = new Set(configured.map(p => p.id))
  const rows = await listProviderRows(db, MAX_PROVIDERS)
  return [...configured, ...rows.filter(r => !taken.has(r.id)).map(r => rowToProvider(r, config.basePath))]
}

export async function getProvider (db: Db, config: ProvidersConfig, id: string): Promise<OidcProvider> {
  const configured = config.oidcProviders.find(p => p.id === id)
  if (configured !== undefined) return toProvider(configured, config.basePath, configured.clientSecret !== undefined)
  const row = await findProviderRow(db, id)
  if (row === undefined) throw notFound(id)
  return rowToProvider(row, config.basePath)
}

/** What an event says about a provider's settings: everything but the secret, which is only said to be set. */
function describe (input: Partial<OidcProviderCreate>): Record<string, unknown> {
  const { client_secret: secret, ...rest } = input
  return { ...rest, ...(secret !== undefined ? { client_secret: secret === null ? null : REDACTED } : {}) }
}

export async function createProvider (db: Db, ctx: RequestContext, config: ProvidersConfig, input: OidcProviderCreate): Promise<OidcProvider> {
  assertValid(input)
  if (config.oidcProviders.some(p => p.id === input.id)) {
    throw new AppError('sso_provider_exists', 409, `A provider with the id "${input.id}" is configured in OIDC_PROVIDERS.`)
  }
  await assertReachableIssuer(config, input.issuer)
  const secret = input.client_secret != null ? sealSecret(config, input.id, input.client_secret) : null
  const at = nowIso()
  return await db.transaction().execute(async trx => {
    if (await findProviderRow(trx, input.id) !== undefined) throw new AppError('sso_provider_exists', 409, `A provider with the id "${input.id}" exists.`)
    if (await countProviderRows(trx) >= MAX_PROVIDERS) throw new AppError('conflict', 409, `There are ${MAX_PROVIDERS} providers already; remove one first.`)
    const row = await insertProviderRow(trx, {
      id: input.id,
      display_name: input.display_name,
      issuer: input.issuer,
      client_id: input.client_id,
      client_secret: secret,
      scopes: JSON.stringify(input.scopes ?? DEFAULT_SCOPES),
      enabled: input.enabled ?? true,
      jit: input.jit ?? false,
      link_by_email: input.link_by_email ?? false,
      groups_claim: input.groups_claim ?? null,
      group_map: JSON.stringify(input.group_map ?? {}),
      admin_groups: JSON.stringify(input.admin_groups ?? []),
      created_at: at,
      updated_at: at
    })
    await recordEvent(trx, ctx, 'sso_provider.created', null, describe(input))
    return rowToProvider(row, config.basePath)
  })
}

export async function updateProvider (db: Db, ctx: RequestContext, config: ProvidersConfig, id: string, patch: OidcProviderPatch): Promise<OidcProvider> {
  assertNotConfigured(config, id)
  // Before the transaction: a name lookup can take seconds, and the row stays locked meanwhile.
  if (patch.issuer !== undefined) {
    assertValid({ issuer: patch.issuer, scopes: patch.scopes })
    await assertReachableIssuer(config, patch.issuer)
  }
  const updated = await db.transaction().execute(async trx => {
    const current = await findProviderRow(trx, id, { forUpdate: true })
    if (current === undefined) throw notFound(id)
    assertValid({ issuer: patch.issuer ?? current.issuer, scopes: patch.scopes })
    const changes: ProviderRowUpdate = { updated_at: nowIso() }
    if (patch.display_name !== undefined) changes.display_name = patch.display_name
    if (patch.issuer !== undefined) changes.issuer = patch.issuer
    if (patch.client_id !== undefined) changes.client_id = patch.client_id
    if (patch.client_secret !== undefined) changes.client_secret = patch.client_secret === null ? null : sealSecret(config, id, patch.client_secret)
    if (patch.scopes !== undefined) changes.scopes = JSON.stringify(patch.scopes)
    if (patch.enabled !== undefined) changes.enabled = patch.enabled
    if (patch.jit !== undefined) changes.jit = patch.jit
    if (patch.link_by_email !== undefined) changes.link_by_email = patch.link_by_email
    if (patch.groups_claim !== undefined) changes.groups_claim = patch.groups_claim
    if (patch.group_map !== undefined) changes.group_map = JSON.stringify(patch.group_map)
    if (patch.admin_groups !== undefined) changes.admin_groups = JSON.stringify(patch.admin_groups)
    const row = await updateProviderRow(trx, id, changes)
    if (row === undefined) throw notFound(id)
    await recordEvent(trx, ctx, 'sso_provider.updated', null, { id, changes: describe(patch) })
    return row
  })
  forgetProvider(id)
  return rowToProvider(updated, config.basePath)
}

/** Removes a provider made through the API. Its users keep their accounts; their links to it stay, unused, until unlinked or the provider is made again. */
export async function deleteProvider (db: Db, ctx: RequestContext, config: ProvidersConfig, id: string): Promise<void> {
  assertNotConfigured(config, id)
  await db.transaction().execute(async trx => {
    if (!await deleteProviderRow(trx, id)) throw notFound(id)
    await recordEvent(trx, ctx, 'sso_provider.deleted', null, { id })
  })
  forgetProvider(id)
}
