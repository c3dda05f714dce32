import { readFileSync } from 'node:fs'

/** LDAP / Active Directory sign-in (docs/sso.md); undefined in Config when LDAP_URL is unset. */
export interface LdapConfig {
  /** ldap://host:389 or ldaps://host:636. */
  url: string
  /** Upgrade an ldap:// connection with StartTLS before anything is sent. */
  startTls: boolean
  /** PEM certificates to trust instead of the system's (LDAP_CA_FILE), read at start-up. */
  ca: string | undefined
  /** Check the directory's certificate and name; off only for a directory you reach over a trusted network. */
  tlsVerify: boolean
  /** The search account; anonymous search when unset. */
  bindDn: string | undefined
  bindPassword: string | undefined
  userBase: string
  /** Has `{username}`, replaced by the typed identifier with RFC 4515 escaping. */
  userFilter: string
  usernameAttribute: string
  emailAttribute: string
  firstNameAttribute: string
  lastNameAttribute: string
  /** The entry's attribute that lists its groups' DNs (AD, OpenLDAP's memberof overlay); '' to not read one. */
  memberOfAttribute: string
  /** Where to search for the groups that list the user as a member; unset: only memberOfAttribute counts. */
  groupBase: string | undefined
  /** Has `{dn}` (the user's DN) and/or `{username}`, both escaped. */
  groupFilter: string
  groupMap: GroupMapping[]
  /** Create the gatehouse user at a directory user's first sign-in. */
  jit: boolean
  /** Deadline for connecting and for each directory operation. */
  timeoutMs: number
}

/** One LDAP_GROUP_MAP entry: members of the group (by normalised DN) get the role admin, or a gatehouse group. */
export interface GroupMapping { dn: string, role?: 'admin', group?: string }

export const DEFAULT_USER_FILTER = '(uid={username})'
export const DEFAULT_GROUP_FILTER = '(|(member={dn})(uniqueMember={dn}))'

/**
 * A DN in the form group DNs are compared in: lower case, no spaces around
 * `,` and `=`. Directories differ in how they spell the same DN in `memberOf`
 * and in the group's own entry; this makes the usual variants match.
 */
export function normaliseDn (dn: string): string {
  return dn.trim().toLowerCase().replace(/\s*([,=+])\s*/g, '$1')
}

type Reader = {
  str: (name: string) => string | undefined
  bool: (name: string, fallback: boolean) => boolean
  int: (name: string, fallback: number) => number
  fail: (message: string) => never
}

/** Reads the LDAP_* variables (the readers are config.ts's, so errors look the same). */
export function readLdapConfig ({ str, bool, int, fail }: Reader): LdapConfig | undefined {
  const url = str('LDAP_URL')
  if (url === undefined) return undefined
  if (!/^ldaps?:\/\/[^/]+\/?$/i.test(url)) fail(`LDAP_URL must look like ldaps://ldap.example.com or ldap://ldap.example.com:389, got "${url}"`)
  const startTls = bool('LDAP_START_TLS', false)
  const secure = url.toLowerCase().startsWith('ldaps:') || startTls
  // Passwords would cross the network in the clear: only on an explicit say-so.
  if (!secure && !bool('LDAP_ALLOW_PLAINTEXT', false)) {
    fail('LDAP_URL is ldap:// without LDAP_START_TLS=on: passwords would be sent in the clear (set LDAP_ALLOW_PLAINTEXT=on to allow it anyway)')
  }
  if (startTls && url.toLowerCase().startsWith('ldaps:')) fail('LDAP_START_TLS is for ldap:// URLs; ldaps:// is TLS already')
  const caFile = str('LDAP_CA_FILE')
  let ca: string | undefined
  if (caFile !== undefined) {
    try {
      ca = readFileSync(caFile, 'utf8')
    } catch (error) {
      fail(`LDAP_CA_FILE could not be read: ${(error as Error).message}`)
    }
  }
  const userBase = str('LDAP_USER_BASE') ?? fail('LDAP_USER_BASE is required with LDAP_URL (e.g. ou=people,dc=example,dc=org)')
  const userFilter = str('LDAP_USER_FILTER') ?? DEFAULT_USER_FILTER
  if (!userFilter.includes('{username}')) fail('LDAP_USER_FILTER must contain {username}, e.g. (uid={username})')
  const bindDn = str('LDAP_BIND_DN')
  const bindPassword = str('LDAP_BIND_PASSWORD')
  if ((bindDn === undefined) !== (bindPassword === undefined)) fail('LDAP_BIND_DN and LDAP_BIND_PASSWORD go together')
  const groupFilter = str('LDAP_GROUP_FILTER') ?? DEFAULT_GROUP_FILTER
  const timeoutMs = int('LDAP_TIMEOUT_MS', 5000)
  if (timeoutMs < 1) fail('LDAP_TIMEOUT_MS must be at least 1')
  return {
    url,
    startTls,
    ca,
    tlsVerify: bool('LDAP_TLS_VERIFY', true),
    bindDn,
    bindPassword,
    userBase,
    userFilter,
    usernameAttribute: str('LDAP_USERNAME_ATTRIBUTE') ?? 'uid',
    emailAttribute: str('LDAP_EMAIL_ATTRIBUTE') ?? 'mail',
    firstNameAttribute: str('LDAP_FIRST_NAME_ATTRIBUTE') ?? 'givenName',
    lastNameAttribute: str('LDAP_LAST_NAME_ATTRIBUTE') ?? 'sn',
    memberOfAttribute: env('LDAP_MEMBER_OF_ATTRIBUTE', str) ?? 'memberOf',
    groupBase: str('LDAP_GROUP_BASE'),
    groupFilter,
    groupMap: parseGroupMap(str('LDAP_GROUP_MAP') ?? '', fail),
    jit: bool('LDAP_JIT', true),
    timeoutMs
  }
}

/** `none` switches the memberOf attribute off (an empty variable means unset everywhere else). */
function env (name: string, str: Reader['str']): string | undefined {
  const value = str(name)
  return value?.toLowerCase() === 'none' ? '' : value
}

/**
 * `<group DN> => role:admin` or `<group DN> => <gatehouse group>`, entries
 * separated by `;` (DNs have commas of their own).
 */
export function parseGroupMap (text: string, fail: (message: string) => never): GroupMapping[] {
  const mappings: GroupMapping[] = []
  for (const raw of text.split(';')) {
    const entry = raw.trim()
    if (entry === '') continue
    const at = entry.lastIndexOf('=>')
    if (at === -1) fail(`LDAP_GROUP_MAP entries look like "cn=admins,ou=groups,dc=example,dc=org => role:admin", got "${entry}"`)
    const dn = normaliseDn(entry.slice(0, at))
    const target = entry.slice(at + 2).trim()
    if (dn === '' || !dn.includes('=')) fail(`LDAP_GROUP_MAP: "${entry}" does not start with a group DN`)
    if (target === 'role:admin') {
      mappings.push({ dn, role: 'admin' })
    } else if (/^[^\s:][^\s]{0,63}$/.test(target) && !target.startsWith('role:')) {
      mappings.push({ dn, group: target })
    } else {
      fail(`LDAP_GROUP_MAP: the target of "${entry}" must be role:admin or a group name (1 to 64 characters, no spaces)`)
    }
  }
  return mappings
}
