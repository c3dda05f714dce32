import { isIP } from 'node:net'
import type { ConnectionOptions } from 'node:tls'
import type { Client, Entry } from 'ldapts'
import { AppError } from '../errors.ts'
import { normaliseDn, type LdapConfig } from './ldap.config.ts'

/** What the directory says of a user it found by the typed identifier. */
export interface DirectoryUser {
  /** As the directory spells it; normalised (normaliseDn) it is the `subject` of the user's `ldap` identity, so a link an admin types matches however the directory capitalises or spaces it. */
  dn: string
  username: string | undefined
  email: string | undefined
  firstName: string | undefined
  lastName: string | undefined
  /** Normalised (normaliseDn) DNs of the groups the user is in. */
  groupDns: string[]
}

export type DirectoryCheck =
  | { kind: 'ok', user: DirectoryUser }
  | { kind: 'wrong_password', dn: string }
  /** No entry, or more than one, matched the filter. */
  | { kind: 'no_entry' }
  | { kind: 'ambiguous' }

/** The identity provider name of LDAP accounts in user_identities. */
export const LDAP_PROVIDER = 'ldap'

/** Bound so a directory holding many groups cannot make one sign-in read without end. */
const MAX_GROUPS_READ = 1000

export function directoryUnavailable (cause: unknown): AppError {
  return new AppError('directory_unavailable', 503, 'The directory (LDAP) that checks this sign-in is unavailable; try again shortly.', {
    cause, headers: { 'Retry-After': '10' }
  })
}

/** `{name}` placeholders of an LDAP filter replaced by RFC 4515-escaped values, so typed text is never filter syntax. */
// Loaded by the first directory sign-in, not at start-up: most deployments have no directory.
let ldaptsModule: Promise<typeof import('ldapts')> | undefined
async function ldapts (): Promise<typeof import('ldapts')> {
  return await (ldaptsModule ??= import('ldapts'))
}

export async function fillFilter (template: string, values: Record<string, string>): Promise<string> {
  const { Filter } = await ldapts()
  return template.replace(/\{(\w+)\}/g, (whole, name: string) => values[name] !== undefined ? Filter.escape(values[name]) : whole)
}

function first (entry: Entry, attribute: string): string | undefined {
  if (attribute === '') return undefined
  // Attribute names are case-insensitive; ldapts keys them as the server wrote them.
  const key = Object.keys(entry).find(k => k.toLowerCase() === attribute.toLowerCase())
  const value = key !== undefined ? entry[key] : undefined
  const text = Array.isArray(value) ? value[0] : value
  if (text === undefined) return undefined
  const s = Buffer.isBuffer(text) ? text.toString('utf8') : text
  return s === '' ? undefined : s
}

function all (entry: Entry, attribute: string): string[] {
  if (attribute === '') return []
  const key = Object.keys(entry).find(k => k.toLowerCase() === attribute.toLowerCase())
  const value = key !== undefined ? entry[key] : undefined
  if (value === undefined) return []
  return (Array.isArray(value) ? value : [value]).map(v => Buffer.isBuffer(v) ? v.toString('utf8') : v)
}

/**
 * Search-then-bind: binds as the search account, finds the one entry the
 * filter names for the typed identifier, reads its groups, then binds as
 * that entry with the typed password. A new connection per sign-in, so no
 * bind state is shared between attempts.
 *
 * An empty password is refused before anything is sent: LDAP reads a bind
 * with a DN and no password as an unauthenticated bind, which succeeds.
 * When no entry matches, a bind to a DN that cannot exist is still made, so
 * an unknown name costs the same round trips as a wrong password.
 *
 * Directory errors of any kind (refused or timed-out connection, a
 * certificate that is not trusted, a search account that cannot bind) are
 * 503 `directory_unavailable`, never a wrong password.
 */
export async function checkWithDirectory (config: LdapConfig, identifier: string, password: string): Promise<DirectoryCheck> {
  const { Client } = await ldapts()
  const client = new Client({
    url: config.url,
    timeout: config.timeoutMs,
    connectTimeout: config.timeoutMs,
    // Only for ldaps://: ldapts opens any connection given TLS options with TLS, which a StartTLS listener does not speak.
    ...(config.startTls ? {} : { tlsOptions: tlsOptionsOf(config) })
  })
  // A deadline for the whole exchange besides each operation's, so a directory that trickles answers cannot hold a sign-in.
  let timer: NodeJS.Timeout | undefined
  const deadline = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => { reject(new Error(`the directory did not finish within ${config.timeoutMs * 2} ms`)) }, config.timeoutMs * 2)
  })
  try {
    return await Promise.race([exchange(client, config, identifier, password), deadline])
  } catch (error) {
    throw directoryUnavailable(error)
  } finally {
    clearTimeout(timer)
    // Unbinding politely waits for nothing; a connection that never opened has nothing to close.
    await client.unbind().catch(() => {})
  }
}

function tlsOptionsOf (config: LdapConfig): ConnectionOptions {
  return { ...(config.ca !== undefined ? { ca: config.ca } : {}), rejectUnauthorized: config.tlsVerify, minVersion: 'TLSv1.2' }
}

async function exchange (client: Client, config: LdapConfig, identifier: string, password: string): Promise<DirectoryCheck> {
  const { ResultCodeError } = await ldapts()
  if (config.startTls) {
    // The certificate is checked against the URL's host (Node would check it against "localhost" otherwise); SNI only for a name.
    const host = new URL(config.url).hostname.replace(/^\[(.*)\]$/, '$1')
    await client.startTLS({ ...tlsOptionsOf(config), host, ...(isIP(host) === 0 ? { servername: host } : {}) })
  }
  if (config.bindDn !== undefined) await client.bind(config.bindDn, config.bindPassword)
  const attributes = [config.usernameAttribute, config.emailAttribute, config.firstNameAttribute, config.lastNameAttribute, config.memberOfAttribute].filter(a => a !== '')
  const { searchEntries } = await client.search(config.userBase, {
    scope: 'sub',
    filter: await fillFilter(config.userFilter, { username: identifier }),
    attributes,
    sizeLimit: 2
  }).catch((error: unknown) => {
    // More than one entry: the server stops at the size limit and says so.
    if (error instanceof Error && error.name === 'SizeLimitExceededError') return { searchEntries: [{ dn: '' }, { dn: '' }] as Entry[] }
    throw error
  })
  if (searchEntries.length !== 1) {
    // Whatever the directory answers (invalidCredentials, or noSuchObject from some), it answered: only that matters.
    await bindAs(client, `cn=gatehouse-no-such-entry,${config.userBase}`, password)
      .catch((error: unknown) => { if (!(error instanceof ResultCodeError)) throw error })
    return { kind: searchEntries.length === 0 ? 'no_entry' : 'ambiguous' }
  }
  const entry = searchEntries[0]!
  const groupDns = new Set(all(entry, config.memberOfAttribute).map(normaliseDn))
  if (config.groupBase !== undefined) {
    const username = first(entry, config.usernameAttribute) ?? identifier
    const groups = await client.search(config.groupBase, {
      scope: 'sub',
      filter: await fillFilter(config.groupFilter, { dn: entry.dn, username }),
      attributes: ['1.1'],
      sizeLimit: MAX_GROUPS_READ
    })
    for (const group of groups.searchEntries) groupDns.add(normaliseDn(group.dn))
  }
  if (!await bindAs(client, entry.dn, password)) return { kind: 'wrong_password', dn: entry.dn }
  return {
    kind: 'ok',
    user: {
      dn: entry.dn,
      username: first(entry, config.usernameAttribute),
      email: first(entry, config.emailAttribute),
      firstName: first(entry, config.firstNameAttribute),
      lastName: first(entry, config.lastNameAttribute),
      groupDns: [...groupDns]
    }
  }
}

/** True when the directory accepts the password for this DN; false for wrong credentials; throws for anything else. */
async function bindAs (client: Client, dn: string, password: string): Promise<boolean> {
  // The anonymous-bind trap: a DN with an empty password "succeeds" as nobody.
  if (password === '') return false
  const { InvalidCredentialsError } = await ldapts()
  try {
    await client.bind(dn, password)
    return true
  } catch (error) {
    if (error instanceof InvalidCredentialsError) return false
    throw error
  }
}

/**
 * The role and groups LDAP_GROUP_MAP gives a directory user. Each is
 * undefined when the map says nothing about it, and then stays as it is: a
 * map with a `role:admin` entry manages the role (admin for members of such a
 * group, user for everyone else), one with group entries manages the groups.
 */
export function mappedAccess (config: Pick<LdapConfig, 'groupMap'>, groupDns: string[]): { role?: 'admin' | 'user', groups?: string[] } {
  const member = new Set(groupDns)
  const roleEntries = config.groupMap.filter(m => m.role !== undefined)
  const groupEntries = config.groupMap.filter(m => m.group !== undefined)
  return {
    ...(roleEntries.length > 0 ? { role: roleEntries.some(m => member.has(m.dn)) ? 'admin' as const : 'user' as const } : {}),
    ...(groupEntries.length > 0 ? { groups: [...new Set(groupEntries.filter(m => member.has(m.dn)).map(m => m.group!))].sort() } : {})
  }
}

/** Why a directory user could not be signed in as a gatehouse user (the `reason` of `user.login_failed`). */
export type ProvisionRefusal = 'not_provisioned' | 'username_taken' | 'invalid_username'
