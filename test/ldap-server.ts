import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import { Attribute, Change, Client } from 'ldapts'
import { DEFAULT_GROUP_FILTER, parseGroupMap, type LdapConfig } from '../src/sso/ldap.config.ts'
import { freePort } from './ports.ts'

const run = promisify(execFile)

/** Debian's slapd and ldap-utils. Tests that need them skip without them; CI installs the packages (.ci/run). */
export const SLAPD = '/usr/sbin/slapd'
export const LDAPADD = '/usr/bin/ldapadd'
export const slapdAvailable = existsSync(SLAPD) && existsSync(LDAPADD)

export const SUFFIX = 'dc=example,dc=org'
export const PEOPLE = `ou=people,${SUFFIX}`
export const GROUPS = `ou=groups,${SUFFIX}`
export const SEARCH_DN = `cn=search,${SUFFIX}`
export const SEARCH_PASSWORD = 'search-account-secret'
const ROOT_DN = `cn=admin,${SUFFIX}`
const ROOT_PASSWORD = 'root-secret'

export interface Directory {
  /** ldap:// (for StartTLS) and ldaps:// URLs of the running slapd, on 127.0.0.1. */
  ldapUrl: string
  ldapsUrl: string
  /** PEM of the test CA that signed slapd's certificate. */
  ca: string
  addUser: (uid: string, password: string, fields?: { mail?: string, givenName?: string, sn?: string }) => Promise<string>
  addGroup: (cn: string, memberDns: string[]) => Promise<string>
  setMembers: (groupDn: string, memberDns: string[]) => Promise<void>
  stop: () => Promise<void>
}

/**
 * A slapd of its own on free 127.0.0.1 ports, from a slapd.conf in a temporary
 * directory (mdb backend; core, cosine, inetorgperson and nis schemas), with
 * a certificate for 127.0.0.1 signed by a CA made here with the openssl CLI,
 * seeded with ldapadd: the base entries and a search account.
 */
export async function startDirectory (): Promise<Directory> {
  const dir = await mkdtemp(join(tmpdir(), 'gatehouse-slapd-'))
  let proc: ChildProcess | undefined
  try {
    await makeCertificates(dir)
    await mkdir(join(dir, 'db'))
    const [ldapPort, ldapsPort] = [await freePort(), await freePort()]
    const path = (name: string): string => JSON.stringify(join(dir, name))
    await writeFile(join(dir, 'slapd.conf'), `include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
pidfile ${path('slapd.pid')}
argsfile ${path('slapd.args')}
modulepath /usr/lib/ldap
moduleload back_mdb
TLSCACertificateFile ${path('ca.pem')}
TLSCertificateFile ${path('server.pem')}
TLSCertificateKeyFile ${path('server.key')}
database mdb
maxsize 10485760
suffix "${SUFFIX}"
rootdn "${ROOT_DN}"
rootpw ${ROOT_PASSWORD}
directory ${path('db')}
index objectClass eq
index uid eq
index member eq
access to attrs=userPassword by anonymous auth by self write by * none
access to * by dn.exact="${SEARCH_DN}" read by users read by * none
`)
    const ldapUrl = `ldap://127.0.0.1:${ldapPort}`
    const ldapsUrl = `ldaps://127.0.0.1:${ldapsPort}`
    // -d keeps slapd in the foreground, so it is this test's child and ends with it.
    proc = spawn(SLAPD, ['-f', join(dir, 'slapd.conf'), '-h', `${ldapUrl}/ ${ldapsUrl}/`, '-d', '0'], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    proc.stderr!.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
    const exited = new Promise<void>(resolve => { proc!.once('exit', () => resolve()) })
    await seed(dir, ldapUrl, proc, () => stderr)
    const ca = await readFile(join(dir, 'ca.pem'), 'utf8')

    const admin = async <T>(work: (client: Client) => Promise<T>): Promise<T> => {
      const client = new Client({ url: ldapUrl, timeout: 5000, connectTimeout: 5000 })
      try {
        await client.bind(ROOT_DN, ROOT_PASSWORD)
        return await work(client)
      } finally {
        await client.unbind()
      }
    }
    const started = proc
    return {
      ldapUrl,
      ldapsUrl,
      ca,
      addUser: async (uid, password, fields = {}) => {
        const dn = `uid=${uid},${PEOPLE}`
        await admin(async c => {
          await c.add(dn, {
            objectClass: ['inetOrgPerson'],
            uid,
            cn: `${fields.givenName ?? 'Test'} ${fields.sn ?? uid}`,
            sn: fields.sn ?? uid,
            ...(fields.givenName !== undefined ? { givenName: fields.givenName } : {}),
            ...(fields.mail !== undefined ? { mail: fields.mail } : {}),
            userPassword: password
          })
        })
        return dn
      },
      addGroup: async (cn, memberDns) => {
        const dn = `cn=${cn},${GROUPS}`
        // groupOfNames needs a member; the search account stands in for "nobody".
        await admin(async c => { await c.add(dn, { objectClass: ['groupOfNames'], cn, member: memberDns.length > 0 ? memberDns : [SEARCH_DN] }) })
        return dn
      },
      setMembers: async (groupDn, memberDns) => {
        await admin(async c => {
          await c.modify(groupDn, new Change({ operation: 'replace', modification: new Attribute({ type: 'member', values: memberDns.length > 0 ? memberDns : [SEARCH_DN] }) }))
        })
      },
      stop: async () => {
        started.kill('SIGTERM')
        await exited
        await rm(dir, { recursive: true, force: true })
      }
    }
  } catch (error) {
    proc?.kill('SIGKILL')
    await rm(dir, { recursive: true, force: true })
    throw error
  }
}

/** A CA, and a certificate for 127.0.0.1 and localhost that it signed. */
async function makeCertificates (dir: string): Promise<void> {
  const at = (name: string): string => join(dir, name)
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  await run('openssl', ['req', '-x509', ...ec, '-keyout', at('ca.key'), '-out', at('ca.pem'), '-days', '2', '-subj', '/CN=gatehouse test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'])
  await run('openssl', ['req', ...ec, '-keyout', at('server.key'), '-out', at('server.csr'), '-subj', '/CN=127.0.0.1'])
  await writeFile(at('server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n')
  await run('openssl', ['x509', '-req', '-in', at('server.csr'), '-CA', at('ca.pem'), '-CAkey', at('ca.key'), '-CAcreateserial',
    '-out', at('server.pem'), '-days', '2', '-extfile', at('server.ext')])
}

/** The base entries and the search account, added with ldapadd as soon as slapd answers. */
async function seed (dir: string, url: string, proc: ChildProcess, stderr: () => string): Promise<void> {
  const ldif = join(dir, 'seed.ldif')
  await writeFile(ldif, `dn: ${SUFFIX}
objectClass: dcObject
objectClass: organization
o: Example
dc: example

dn: ${PEOPLE}
objectClass: organizationalUnit
ou: people

dn: ${GROUPS}
objectClass: organizationalUnit
ou: groups

dn: ${SEARCH_DN}
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: search
userPassword: ${SEARCH_PASSWORD}
`)
  const deadline = Date.now() + 15_000
  let lastError = ''
  while (Date.now() < deadline) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`slapd exited (${proc.exitCode ?? proc.signalCode}):\n${stderr()}`)
    try {
      await run(LDAPADD, ['-x', '-H', url, '-D', ROOT_DN, '-w', ROOT_PASSWORD, '-f', ldif])
      return
    } catch (error) {
      lastError = String((error as { stderr?: string }).stderr ?? error)
      // Not listening yet: ldapadd cannot contact the server (exit 255).
      if (!/Can't contact LDAP server/.test(lastError)) throw error
    }
    await sleep(50)
  }
  throw new Error(`slapd did not answer within 15 s: ${lastError}\n${stderr()}`)
}

/**
 * Settings that sign in against this directory: LDAPS with its CA, the search
 * account, inetOrgPerson users by uid, groups by member, just-in-time users;
 * `groupMap` as LDAP_GROUP_MAP spells it.
 */
export function directorySettings (directory: Directory, groupMap: string, overrides: Partial<LdapConfig> = {}): LdapConfig {
  return {
    url: directory.ldapsUrl,
    startTls: false,
    ca: directory.ca,
    tlsVerify: true,
    bindDn: SEARCH_DN,
    bindPassword: SEARCH_PASSWORD,
    userBase: PEOPLE,
    userFilter: '(&(objectClass=inetOrgPerson)(uid={username}))',
    usernameAttribute: 'uid',
    emailAttribute: 'mail',
    firstNameAttribute: 'givenName',
    lastNameAttribute: 'sn',
    memberOfAttribute: 'memberOf',
    groupBase: GROUPS,
    groupFilter: DEFAULT_GROUP_FILTER,
    groupMap: parseGroupMap(groupMap, (message: string): never => { throw new Error(message) }),
    jit: true,
    timeoutMs: 3000,
    ...overrides
  }
}
