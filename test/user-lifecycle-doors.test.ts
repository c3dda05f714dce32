/**
 * Issue 17: one lifecycle for users, whichever door is used. Every door that
 * creates, changes, disables or deletes a user is one entry of a table; one
 * set of assertions runs against each entry and compares what it recorded
 * (events, webhook deliveries) and what it left (the user as the API shows
 * it, and whether the user's old credentials still work) with the API's own
 * door. A new door (SCIM, invitations) is one more entry.
 *
 * Every door goes through the user lifecycle (src/users/users.lifecycle.ts,
 * docs/architecture.md); before it, LDAP's just-in-time users and mapping
 * recorded a `system` actor and a `user.updated` for a kept role, which these
 * cases caught.
 *
 * What legitimately differs between doors, and is not compared:
 * - `actor`: who used the door (an API key, the signed-in admin, the CLI's
 *   `system`/`cli`, or the person signing in for just-in-time users);
 *   each door states the actor type it records.
 * - `request_id`, `client_ip`: null for the CLI's database mode, which has no request.
 * - `source` in `user.created`/`user.updated` data: the identity provider that
 *   made or changed the user (`oidc:<id>`, `ldap`).
 * - `password: "[redacted]"` in `user.created` data: present exactly when a password was set.
 * - `last_login_at` of the user: set by the sign-in that created a just-in-time user.
 */
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { generate } from 'otplib'
import type { LightMyRequestResponse } from 'fastify'
import { toSettings } from '../src/sso/oidc.settings.ts'
import type { LdapConfig } from '../src/sso/ldap.config.ts'
import { REDACTED } from '../src/events/events.repository.ts'
import type { Config } from '../src/config.ts'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type Dialect } from './helpers.ts'
import { listen, runCli } from './cli-helpers.ts'
import { signInAtOp, startTestOp, type AccountClaims, type TestOp } from './oidc-op.ts'
import { directorySettings, slapdAvailable, startDirectory, type Directory } from './ldap-server.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'

/** Where browsers reach gatehouse; the provider redirects there and the test hands the callback to app.inject. */
const ORIGIN = 'http://gatehouse.test'
const OIDC_STATE_COOKIE = 'gatehouse_oidc_state'
const DIRECTORY_PASSWORD = 'directory pass phrase 42'
const FORM = 'application/x-www-form-urlencoded'
/** The group every door gives the users it creates (the identity providers through their group maps). */
const GROUP = 'analysts'
/** Longer than any test waits: only an invalidation, never expiry, can make an old credential stop working. */
const CREDENTIAL_TTL_MS = 60_000
const LAST_ADMIN_DETAIL = 'This is the last enabled admin; make another user an admin first.'

interface User {
  id: string
  username: string
  email: string | null
  first_name: string | null
  last_name: string | null
  role: 'admin' | 'user'
  groups: string[]
  disabled: boolean
  password_sign_in: boolean
  created_at: string | null
  updated_at: string | null
  last_login_at: string | null
  password_changed_at: string | null
}

interface Event {
  id: string
  type: string
  occurred_at: string
  actor: { type: string, id: string | null }
  target: { type: string, id: string } | null
  request_id: string | null
  client_ip: string | null
  data: Record<string, unknown>
}

type ActorType = 'api_key' | 'user' | 'system'

/** What a create door is asked to make. Doors that cannot set a field (a provider's claims, the CLI's admin create) say what they set instead. */
interface NewUser { username: string, email: string, first_name: string, last_name: string }

interface Created {
  id: string
  /** Fields the door was asked to set and must show on the user. */
  expected: Partial<User>
  /** Whether a password was set (then `user.created` carries `password: "[redacted]"`). */
  password: boolean
}

interface CreateDoor {
  name: string
  actor: ActorType
  /** Data keys of `user.created` this door adds, beyond the API's (see the file's comment). */
  extraKeys: string[]
  create: (input: NewUser) => Promise<Created>
}

/** A user a change door can act on, and a credential they held before the change. */
interface Subject { id: string, token: string }

interface ChangeDoor {
  name: string
  actor: ActorType
  extraKeys: string[]
  /** A user of the door's kind: role user, signed in (the token). */
  prepare: () => Promise<Subject>
  setRole: (subject: Subject, role: 'admin' | 'user') => Promise<void>
}

interface RemoveDoor {
  name: string
  actor: ActorType
  /** What the door adds to its `user.updated` data (SCIM's `source`). */
  extraData?: Record<string, unknown>
  disable: (user: User) => Promise<void>
  delete: (user: User) => Promise<void>
  /** A door whose credential is no admin credential changes no admin account: its victim is a user, who holds no API key. */
  changesNoAdmin?: true
}

interface LastAdminDoor {
  name: string
  /** Each way the door can take admin rights away; each must be refused and change nothing. */
  attempts: (admin: User) => Array<{ what: string, run: () => Promise<void> }>
}

const sortedKeys = (record: object): string[] => Object.keys(record).sort()
const without = (keys: string[], drop: string[]): string[] => keys.filter(k => !drop.includes(k))

function form (fields: Record<string, string>): string {
  return new URLSearchParams(fields).toString()
}

function sessionCookieOf (res: LightMyRequestResponse): string | undefined {
  return res.cookies.find(c => c.name === 'gatehouse_session' && c.value !== '')?.value
}

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-doors-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

const op: TestOp = await startTestOp([`${ORIGIN}/auth/sso/corp/callback`])
after(async () => { await op.close() })
const directory: Directory | undefined = slapdAvailable ? await startDirectory() : undefined
after(async () => { await directory?.stop() })
const adminsDn = await directory?.addGroup('gatehouse-admins', [])
const analystsDn = await directory?.addGroup(GROUP, [])

const receiver = new Receiver()
const receiverUrl = await receiver.listen()
after(async () => { await receiver.close() })

function ldapSettings (): LdapConfig | undefined {
  if (directory === undefined) return undefined
  return directorySettings(directory, `${adminsDn!} => role:admin; ${analystsDn!} => ${GROUP}`)
}

/**
 * A deployment for one suite: an app with every door open (OIDC provider
 * `corp`, LDAP when slapd is there, webhooks to the file's receiver), and the
 * helpers that drive and read it.
 */
function deployment (dialect: Dialect, overrides: Partial<Config> = {}) {
  // corp: creates users just in time, maps the provider's groups to ours and `gh-admins` to the admin role.
  const corp = toSettings({
    id: 'corp',
    display_name: 'Corporate SSO',
    issuer: op.issuer,
    client_id: op.clientId,
    client_secret: op.clientSecret,
    scopes: ['openid', 'email', 'profile', 'groups'],
    jit: true,
    groups_claim: 'groups',
    group_map: { [GROUP]: [GROUP] },
    admin_groups: ['gh-admins']
  }, 'environment')
  const ldap = ldapSettings()
  const t = useTestApp(dialect, {
    credentialCacheTtlMs: CREDENTIAL_TTL_MS,
    oidcRedirectOrigin: ORIGIN,
    oidcProviders: [corp],
    ...(ldap !== undefined ? { ldap } : {}),
    webhookAllowPrivate: true,
    webhookPollIntervalMs: 50,
    webhookRetryBaseMs: 50,
    webhookRetryMaxDelayMs: 200,
    webhookTimeoutMs: 2000,
    ...overrides
  })
  /** Filled in by the suite's before hook: the console admin's session cookie, the CLI's environment against the running service. */
  const state = { consoleCookie: '', cliEnv: {} as Record<string, string> }

  const api = async (method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object): Promise<LightMyRequestResponse> =>
    await t.app.inject({ method, url, headers: auth(t.adminKey), ...(payload !== undefined ? { payload } : {}) })
  const getUser = async (id: string): Promise<User> => {
    const res = await api('GET', `/auth/api/users/${id}`)
    assert.equal(res.statusCode, 200, res.body)
    return res.json()
  }
  const versionOf = async (id: string): Promise<string> => {
    const res = await api('GET', `/auth/api/users/${id}`)
    return String(res.headers.etag).replaceAll('"', '')
  }
  const events = async (query: string): Promise<Event[]> => {
    const res = await api('GET', `/auth/api/events?${query}&limit=1000`)
    assert.equal(res.statusCode, 200, res.body)
    return (res.json() as Event[]).reverse()
  }
  const eventsOfUser = async (type: string, userId: string): Promise<Event[]> => {
    // session.ended and api_key.revoked target the session or key; data.user_id names the user.
    const all = await events(`type=${type}`)
    return all.filter(e => e.target?.id === userId || e.data.user_id === userId)
  }
  const cli = async (args: string[], input?: string): Promise<{ code: number | null, stdout: string, stderr: string }> =>
    await runCli(args, { env: state.cliEnv, ...(input !== undefined ? { input } : {}) })
  const cliOk = async (args: string[], input?: string): Promise<string> => {
    const r = await cli(args, input)
    assert.equal(r.code, 0, r.stderr)
    return r.stdout
  }
  const consolePost = async (url: string, fields: Record<string, string>): Promise<LightMyRequestResponse> =>
    await t.app.inject({ method: 'POST', url, headers: { cookie: state.consoleCookie, 'content-type': FORM, origin: 'http://localhost:80' }, payload: form(fields) })
  /** The console's edit form as it is filled for `user` (what the page shows, and the `was_*` copy it was read at). */
  const editForm = async (user: User): Promise<Record<string, string>> => {
    const values: Record<string, string> = {
      username: user.username,
      email: user.email ?? '',
      first_name: user.first_name ?? '',
      last_name: user.last_name ?? '',
      role: user.role,
      groups: user.groups.join(', '),
      ...(user.disabled ? { disabled: 'on' } : {})
    }
    const was = Object.fromEntries(Object.entries({ ...values, disabled: String(user.disabled) }).map(([k, v]) => [`was_${k}`, v]))
    return { ...values, ...was, version: await versionOf(user.id) }
  }
  const passwordSignIn = async (username: string, password = GOOD_PASSWORD): Promise<string> => {
    const res = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password } })
    assert.equal(res.statusCode, 200, res.body)
    return res.json().token
  }
  const meWith = async (headers: Record<string, string>): Promise<LightMyRequestResponse> =>
    await t.app.inject({ url: '/auth/api/me', headers })

  /** A whole OIDC sign-in at the test provider as `subject`: gatehouse's answer to the callback. */
  const oidcCallback = async (subject: string): Promise<LightMyRequestResponse> => {
    const start = await t.app.inject({ url: '/auth/sso/corp/start' })
    assert.equal(start.statusCode, 303, start.body)
    const oidcState = start.cookies.find(c => c.name === OIDC_STATE_COOKIE)!.value
    const callback = await signInAtOp(op, String(start.headers.location), subject)
    return await t.app.inject({ url: callback.pathname + callback.search, cookies: { [OIDC_STATE_COOKIE]: oidcState } })
  }
  /** An OIDC sign-in that opens a session; its token. */
  const oidcSignIn = async (subject: string): Promise<string> => {
    const res = await oidcCallback(subject)
    assert.equal(res.statusCode, 303, res.body)
    const token = sessionCookieOf(res)
    assert.ok(token !== undefined, 'the sign-in made a session')
    return token
  }
  const oidcAccount = (claims: AccountClaims): string => {
    const subject = `sub-${randomBytes(6).toString('hex')}`
    op.accounts.set(subject, claims)
    return subject
  }
  /** A directory sign-in: gatehouse's answer. */
  const ldapLogin = async (uid: string): Promise<LightMyRequestResponse> =>
    await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: uid, password: DIRECTORY_PASSWORD } })
  /** A directory sign-in that opens a session; the user as the login answer shows it, and the session token. */
  const ldapSignIn = async (uid: string): Promise<{ user: User, token: string }> => {
    const res = await ldapLogin(uid)
    assert.equal(res.statusCode, 200, res.body)
    return { user: res.json().user, token: res.json().token }
  }
  return {
    t,
    state,
    api,
    getUser,
    versionOf,
    events,
    eventsOfUser,
    cli,
    cliOk,
    consolePost,
    editForm,
    passwordSignIn,
    meWith,
    oidcCallback,
    oidcSignIn,
    oidcAccount,
    ldapLogin,
    ldapSignIn
  }
}

for (const dialect of dialects()) {
  describe(`one user lifecycle through every door (${dialect.name})`, () => {
    const {
      t, state, api, getUser, versionOf, eventsOfUser, cli, cliOk, consolePost, editForm,
      passwordSignIn, meWith, oidcSignIn, oidcAccount, ldapSignIn
    } = deployment(dialect, {
      // A file, not memory, for SQLite: the CLI's database mode opens the same database from its own process.
      ...(dialect.url === undefined ? { databaseUrl: `sqlite:${join(tmp, `doors-${randomBytes(4).toString('hex')}.db`)}` } : {})
    })
    /** The console's admin: a user, signed in, whose session the console form posts carry. */
    let consoleAdmin: User
    /** The CLI's environment against the service's database (its database mode). */
    let localEnv: Record<string, string>
    /** What the API's own door records and shows: the reference every other door is compared with. */
    let reference: { event: Event, user: User }

    before(async () => {
      const hook = await api('POST', '/auth/api/webhooks', { url: receiverUrl, event_types: ['user.*', 'session.*', 'api_key.*'], description: 'lifecycle doors' })
      assert.equal(hook.statusCode, 201, hook.body)
      const made = await api('POST', '/auth/api/users', { username: uniqueName('console'), password: GOOD_PASSWORD, role: 'admin' })
      assert.equal(made.statusCode, 201, made.body)
      consoleAdmin = made.json()
      state.consoleCookie = `gatehouse_session=${await passwordSignIn(consoleAdmin.username)}`
      state.cliEnv = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
      localEnv = { DATABASE_URL: t.config.databaseUrl, ...(t.config.databaseSchema !== undefined ? { DATABASE_SCHEMA: t.config.databaseSchema } : {}) }
      const input = newUser('reference')
      const res = await api('POST', '/auth/api/users', { ...input, groups: [GROUP] })
      assert.equal(res.statusCode, 201, res.body)
      const [event] = await eventsOfUser('user.created', res.json().id)
      reference = { event: event!, user: await getUser(res.json().id) }
    })

    const newUser = (stem: string): NewUser => {
      const username = uniqueName(stem)
      return { username, email: `${username}@example.org`, first_name: 'Ada', last_name: 'Lovelace' }
    }
    /** SCIM requests with a key of the `scim` scope, made on first use. */
    let scimKey: string | undefined
    const scim = async (method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', path: string, payload?: object): Promise<LightMyRequestResponse> => {
      if (scimKey === undefined) {
        const made = await api('POST', '/auth/api/api-keys', { name: 'scim door', scopes: ['scim'] })
        assert.equal(made.statusCode, 201, made.body)
        scimKey = made.json().key as string
      }
      return await t.app.inject({
        method,
        url: `/auth/scim/v2${path}`,
        headers: { authorization: `Bearer ${scimKey}`, 'content-type': 'application/scim+json' },
        ...(payload !== undefined ? { payload: JSON.stringify(payload) } : {})
      })
    }
    const scimDeactivate = { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Replace', path: 'active', value: 'False' }] }
    const asCreated = (input: NewUser): Created['expected'] => ({ ...input, role: 'user', groups: [GROUP], disabled: false, password_sign_in: true })
    const viaApi = (url: string) => async (input: NewUser): Promise<Created> => {
      const res = await api('POST', url, { ...input, groups: [GROUP] })
      assert.equal(res.statusCode, 201, res.body)
      return { id: res.json().id, expected: asCreated(input), password: false }
    }

    // -----------------------------------------------------------------------
    // Doors that create a user

    const createDoors: CreateDoor[] = [
      { name: 'the API (POST /auth/api/users)', actor: 'api_key', extraKeys: [], create: viaApi('/auth/api/users') },
      { name: 'the 3.6.1 path (POST /auth/users)', actor: 'api_key', extraKeys: [], create: viaApi('/auth/users') },
      {
        // The invited user is pending until they accept; `invited: true` marks the door in the event.
        name: 'an invitation (POST /auth/api/users with invite: true)',
        actor: 'api_key',
        extraKeys: ['invited'],
        create: async (input) => {
          const res = await api('POST', '/auth/api/users', { ...input, groups: [GROUP], invite: true })
          assert.equal(res.statusCode, 201, res.body)
          return { id: res.json().id, expected: { ...asCreated(input), invitation_pending: true }, password: false }
        }
      },
      {
        name: 'the console\'s create form',
        actor: 'user',
        extraKeys: [],
        create: async (input) => {
          const res = await consolePost('/auth/admin/users', { ...input, role: 'user', groups: GROUP })
          assert.equal(res.statusCode, 303, res.body)
          const id = /\/auth\/admin\/users\/([0-9a-f-]{36})\?done=created$/.exec(String(res.headers.location))?.[1]
          assert.ok(id !== undefined, String(res.headers.location))
          return { id, expected: asCreated(input), password: false }
        }
      },
      {
        name: 'the CLI (gatehouse users create)',
        actor: 'api_key',
        extraKeys: [],
        create: async (input) => {
          const out = await cliOk(['users', 'create', input.username, '--email', input.email, '--first-name', input.first_name, '--last-name', input.last_name, '--group', GROUP, '--json'])
          return { id: JSON.parse(out).id, expected: asCreated(input), password: false }
        }
      },
      {
        // The database mode creates admins only, with a password, and takes no names or groups.
        name: 'the CLI on the database (gatehouse admin create --username)',
        actor: 'system',
        extraKeys: [],
        create: async (input) => {
          const r = await runCli(['admin', 'create', '--username', input.username, '--email', input.email, '--password-stdin', '--json'], { env: localEnv, input: `${GOOD_PASSWORD}\n` })
          assert.equal(r.code, 0, r.stderr)
          const { username, email } = input
          return { id: JSON.parse(r.stdout).id, expected: { username, email, first_name: null, last_name: null, role: 'admin', groups: [], disabled: false, password_sign_in: true }, password: true }
        }
      },
      {
        name: 'the import operation (POST /auth/api/users/import)',
        actor: 'api_key',
        extraKeys: [],
        create: async (input) => {
          const res = await api('POST', '/auth/api/users/import', { users: [{ ...input, groups: [GROUP] }] })
          assert.equal(res.statusCode, 200, res.body)
          return { id: res.json().results[0].id, expected: asCreated(input), password: false }
        }
      },
      {
        name: 'the CLI import (gatehouse users import)',
        actor: 'api_key',
        extraKeys: [],
        create: async (input) => {
          const out = await cliOk(['users', 'import', '-', '--format', 'jsonl', '--json'], `${JSON.stringify({ ...input, groups: [GROUP] })}\n`)
          const id = await userIdNamed(input.username)
          assert.ok(id !== undefined, out)
          return { id, expected: asCreated(input), password: false }
        }
      },
      {
        name: 'OIDC just-in-time (a first sign-in at the provider)',
        actor: 'user',
        extraKeys: ['source'],
        create: async (input) => {
          const subject = oidcAccount({ preferred_username: input.username, email: input.email, email_verified: true, given_name: input.first_name, family_name: input.last_name, groups: [GROUP] })
          const token = await oidcSignIn(subject)
          const me = await meWith({ authorization: `Bearer ${token}` })
          return { id: me.json().id, expected: asCreated(input), password: false }
        }
      },
      {
        name: 'SCIM (POST /auth/scim/v2/Users)',
        actor: 'api_key',
        // SCIM keeps the provider's id and emails list with the user, and says it was the door.
        extraKeys: ['source', 'external_id', 'scim_emails'],
        create: async (input) => {
          const res = await scim('POST', '/Users', {
            schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'],
            userName: input.username,
            externalId: `okta-${input.username}`,
            name: { givenName: input.first_name, familyName: input.last_name },
            emails: [{ value: input.email, type: 'work', primary: true }],
            active: true
          })
          assert.equal(res.statusCode, 201, res.body)
          // A user's groups come from /Groups in SCIM, not with the user: it is created in none.
          return { id: res.json().id, expected: { ...asCreated(input), groups: [] }, password: false }
        }
      },
      ...(directory !== undefined
        ? [{
            name: 'LDAP just-in-time (a first sign-in against the directory)',
            // As for OIDC just-in-time users: the person signing in made their account.
            actor: 'user' as const,
            extraKeys: ['source'],
            create: async (input: NewUser): Promise<Created> => {
              const dn = await directory.addUser(input.username, DIRECTORY_PASSWORD, { mail: input.email, givenName: input.first_name, sn: input.last_name })
              await directory.setMembers(analystsDn!, [dn])
              const { user } = await ldapSignIn(input.username)
              return { id: user.id, expected: asCreated(input), password: false }
            }
          }]
        : [])
    ]
    const userIdNamed = async (username: string): Promise<string | undefined> =>
      ((await api('GET', `/auth/api/users?username=${username}`)).json() as User[])[0]?.id

    /** A webhook delivery of `event`, as the receiver got it. */
    const deliveryOf = async (event: Event): Promise<unknown> => {
      await waitFor(`the webhook delivery of ${event.type} ${event.id}`, () => receiver.accepted().has(event.id))
      return JSON.parse(receiver.received.find(r => r.id === event.id)!.body)
    }

    for (const door of createDoors) {
      it(`a user created through ${door.name} records the same user.created event, webhook and user as one created through the API`, async () => {
        const input = newUser('door')
        const created = await door.create(input)
        const user = await getUser(created.id)
        for (const [field, value] of Object.entries(created.expected)) assert.deepEqual(user[field as keyof User], value, `the user's ${field}`)
        assert.deepEqual(sortedKeys(user), sortedKeys(reference.user), 'the user has the same fields')
        assert.ok(user.created_at !== null && user.updated_at !== null, 'created_at and updated_at are set')
        assert.equal(user.updated_at, user.created_at, 'a new user was updated when it was created')
        assert.equal(user.password_changed_at !== null, created.password, 'password_changed_at is set exactly when a password was')

        const recorded = await eventsOfUser('user.created', user.id)
        assert.equal(recorded.length, 1, 'one user.created event')
        const event = recorded[0]!
        assert.deepEqual(sortedKeys(event), sortedKeys(reference.event))
        assert.deepEqual(event.target, { type: 'user', id: user.id })
        assert.equal(event.actor.type, door.actor, 'the actor type')
        const expectedKeys = [...sortedKeys(reference.event.data), ...(created.password ? ['password'] : [])].sort()
        assert.deepEqual(without(sortedKeys(event.data), door.extraKeys), expectedKeys, 'the data keys, beyond the door\'s own')
        for (const key of sortedKeys(reference.event.data)) assert.deepEqual(event.data[key], user[key as keyof User], `data.${key} is the user's ${key}`)
        if (created.password) assert.equal(event.data.password, REDACTED)
        assert.deepEqual(await deliveryOf(event), event, 'the webhook delivers the event as GET /api/events shows it')
      })
    }

    // -----------------------------------------------------------------------
    // Doors that change a user: a promotion to admin and a demotion back

    const localSubject = async (): Promise<Subject> => {
      const res = await api('POST', '/auth/api/users', { username: uniqueName('change'), password: GOOD_PASSWORD, groups: [GROUP] })
      assert.equal(res.statusCode, 201, res.body)
      return { id: res.json().id, token: await passwordSignIn(res.json().username) }
    }
    const patchRole = (prefix: string) => async (subject: Subject, role: 'admin' | 'user'): Promise<void> => {
      const res = await api('PATCH', `${prefix}/users/${subject.id}`, { role })
      assert.equal(res.statusCode, 200, res.body)
    }
    const oidcSubjects = new Map<string, string>()
    const ldapSubjects = new Map<string, string>()

    const changeDoors: ChangeDoor[] = [
      { name: 'the API (PATCH /auth/api/users/{id})', actor: 'api_key', extraKeys: [], prepare: localSubject, setRole: patchRole('/auth/api') },
      { name: 'the 3.6.1 path (PATCH /auth/users/{id})', actor: 'api_key', extraKeys: [], prepare: localSubject, setRole: patchRole('/auth') },
      {
        name: 'the console\'s edit form',
        actor: 'user',
        extraKeys: [],
        prepare: localSubject,
        setRole: async (subject, role) => {
          const res = await consolePost(`/auth/admin/users/${subject.id}`, { ...await editForm(await getUser(subject.id)), role })
          assert.equal(res.statusCode, 303, res.body)
          assert.match(String(res.headers.location), /\?done=saved$/)
        }
      },
      {
        name: 'the CLI (gatehouse users update)',
        actor: 'api_key',
        extraKeys: [],
        prepare: localSubject,
        setRole: async (subject, role) => { await cliOk(['users', 'update', subject.id, '--role', role, '--json']) }
      },
      {
        name: 'OIDC group mapping at a later sign-in',
        actor: 'user',
        extraKeys: ['source'],
        prepare: async () => {
          const subject = oidcAccount({ preferred_username: uniqueName('oidc'), groups: [GROUP] })
          const token = await oidcSignIn(subject)
          const id = (await meWith({ authorization: `Bearer ${token}` })).json().id
          oidcSubjects.set(id, subject)
          return { id, token }
        },
        setRole: async ({ id }, role) => {
          const subject = oidcSubjects.get(id)!
          op.accounts.set(subject, { ...op.accounts.get(subject), groups: role === 'admin' ? [GROUP, 'gh-admins'] : [GROUP] })
          await oidcSignIn(subject)
        }
      },
      ...(directory !== undefined
        ? [{
            name: 'LDAP group mapping at a later sign-in',
            actor: 'user' as const,
            extraKeys: ['source'],
            prepare: async (): Promise<Subject> => {
              const uid = uniqueName('ldap')
              const dn = await directory.addUser(uid, DIRECTORY_PASSWORD, { mail: `${uid}@example.org` })
              await directory.setMembers(analystsDn!, [dn])
              await directory.setMembers(adminsDn!, [])
              const { user, token } = await ldapSignIn(uid)
              ldapSubjects.set(user.id, dn)
              return { id: user.id, token }
            },
            setRole: async ({ id }: Subject, role: 'admin' | 'user'): Promise<void> => {
              await directory.setMembers(adminsDn!, role === 'admin' ? [ldapSubjects.get(id)!] : [])
              await ldapSignIn((await getUser(id)).username)
            }
          }]
        : [])
    ]

    for (const door of changeDoors) {
      it(`a role changed through ${door.name} records the same user.updated event and webhook as the API, and the user's session sees the new role at once`, async () => {
        const subject = await door.prepare()
        const session = { authorization: `Bearer ${subject.token}` }
        // Checked once before the change, so the credential cache holds the session with its old role.
        assert.equal((await meWith(session)).json().role, 'user')
        for (const [from, to] of [['user', 'admin'], ['admin', 'user']] as const) {
          const before = await getUser(subject.id)
          const seen = (await eventsOfUser('user.updated', subject.id)).length
          await door.setRole(subject, to)
          const user = await getUser(subject.id)
          assert.equal(user.role, to, `the role after ${from} → ${to}`)
          assert.ok(user.updated_at! > before.updated_at!, 'updated_at moved on')
          const updated = (await eventsOfUser('user.updated', subject.id)).slice(seen)
          assert.equal(updated.length, 1, `one user.updated event for ${from} → ${to}`)
          const event = updated[0]!
          assert.deepEqual(sortedKeys(event), sortedKeys(reference.event))
          assert.deepEqual(event.target, { type: 'user', id: subject.id })
          assert.equal(event.actor.type, door.actor, 'the actor type')
          const data = Object.fromEntries(Object.entries(event.data).filter(([k]) => !door.extraKeys.includes(k)))
          assert.deepEqual(data, { changes: { role: { from, to } } })
          assert.deepEqual(await deliveryOf(event), event, 'the webhook delivers the event as GET /api/events shows it')
          assert.equal((await meWith(session)).json().role, to, 'a session made before the change sees the new role at once')
        }
      })
    }

    // -----------------------------------------------------------------------
    // Doors that disable or delete a user

    const removeDoors: RemoveDoor[] = [
      {
        name: 'the API (/auth/api/users/{id})',
        actor: 'api_key',
        disable: async (user) => { assert.equal((await api('PATCH', `/auth/api/users/${user.id}`, { disabled: true })).statusCode, 200) },
        delete: async (user) => { assert.equal((await api('DELETE', `/auth/api/users/${user.id}`)).statusCode, 204) }
      },
      {
        name: 'the 3.6.1 path (/auth/users/{id})',
        actor: 'api_key',
        disable: async (user) => { assert.equal((await api('PATCH', `/auth/users/${user.id}`, { disabled: true })).statusCode, 200) },
        delete: async (user) => { assert.equal((await api('DELETE', `/auth/users/${user.id}`)).statusCode, 204) }
      },
      {
        name: 'the console',
        actor: 'user',
        disable: async (user) => {
          const res = await consolePost(`/auth/admin/users/${user.id}/disable`, {})
          assert.equal(res.statusCode, 303, res.body)
        },
        delete: async (user) => {
          const res = await consolePost(`/auth/admin/users/${user.id}/delete`, { version: await versionOf(user.id) })
          assert.equal(res.statusCode, 303, res.body)
        }
      },
      {
        name: 'the CLI',
        actor: 'api_key',
        disable: async (user) => { await cliOk(['users', 'update', user.id, '--disable']) },
        delete: async (user) => { await cliOk(['users', 'delete', user.id]) }
      },
      {
        name: 'SCIM (PATCH active "False", DELETE /auth/scim/v2/Users/{id})',
        actor: 'api_key',
        extraData: { source: 'scim' },
        changesNoAdmin: true,
        disable: async (user) => {
          const res = await scim('PATCH', `/Users/${user.id}`, scimDeactivate)
          assert.equal(res.statusCode, 200, res.body)
        },
        delete: async (user) => { assert.equal((await scim('DELETE', `/Users/${user.id}`)).statusCode, 204) }
      }
    ]

    /** An admin (so they may hold an API key of their own) with a session and a key, both checked once so the cache holds them. */
    const victim = async (door: RemoveDoor): Promise<{ user: User, session: Record<string, string>, key: Record<string, string> | undefined, keyId: string | undefined }> => {
      const res = await api('POST', '/auth/api/users', { username: uniqueName('victim'), password: GOOD_PASSWORD, role: door.changesNoAdmin === true ? 'user' : 'admin' })
      assert.equal(res.statusCode, 201, res.body)
      const user: User = res.json()
      const session = { authorization: `Bearer ${await passwordSignIn(user.username)}` }
      if (door.changesNoAdmin === true) {
        assert.equal((await meWith(session)).statusCode, 200)
        return { user, session, key: undefined, keyId: undefined }
      }
      const made = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: session, payload: { name: 'own key' } })
      assert.equal(made.statusCode, 201, made.body)
      const key = auth(made.json().key)
      assert.equal((await meWith(session)).statusCode, 200)
      assert.equal((await meWith(key)).statusCode, 200)
      return { user, session, key, keyId: made.json().id }
    }

    /** The session.ended and api_key.revoked events of `user`, each with the reason, and their deliveries. */
    const assertCredentialsEnded = async (user: User, keyId: string | undefined, reason: string, actor: ActorType): Promise<void> => {
      const ended = await eventsOfUser('session.ended', user.id)
      assert.equal(ended.length, 1, 'one session.ended event')
      assert.equal(ended[0]!.target?.type, 'session')
      assert.equal(ended[0]!.actor.type, actor)
      assert.deepEqual(ended[0]!.data, { reason, user_id: user.id })
      const revoked = await eventsOfUser('api_key.revoked', user.id)
      assert.equal(revoked.length, keyId === undefined ? 0 : 1, 'one api_key.revoked event for the key they held')
      if (keyId !== undefined) {
        assert.deepEqual(revoked[0]!.target, { type: 'api_key', id: keyId })
        assert.equal(revoked[0]!.actor.type, actor)
        assert.deepEqual(revoked[0]!.data, { reason, user_id: user.id })
      }
      for (const event of [...ended, ...revoked]) assert.deepEqual(await deliveryOf(event), event)
    }

    for (const door of removeDoors) {
      it(`a user disabled through ${door.name} loses their session and API key at once, with the same events as through the API`, async () => {
        const { user, session, key, keyId } = await victim(door)
        await door.disable(user)
        assert.equal((await meWith(session)).statusCode, 401, 'the old session is refused at once')
        if (key !== undefined) assert.equal((await meWith(key)).statusCode, 401, 'the old API key is refused at once')
        assert.equal((await getUser(user.id)).disabled, true)
        const updated = await eventsOfUser('user.updated', user.id)
        assert.equal(updated.length, 1)
        assert.equal(updated[0]!.actor.type, door.actor)
        assert.deepEqual(updated[0]!.data, { changes: { disabled: { from: false, to: true } }, ...door.extraData })
        assert.deepEqual(await deliveryOf(updated[0]!), updated[0])
        await assertCredentialsEnded(user, keyId, 'user_disabled', door.actor)
      })

      it(`a user deleted through ${door.name} loses their session and API key at once, with the same events as through the API`, async () => {
        const { user, session, key, keyId } = await victim(door)
        await door.delete(user)
        assert.equal((await meWith(session)).statusCode, 401, 'the old session is refused at once')
        if (key !== undefined) assert.equal((await meWith(key)).statusCode, 401, 'the old API key is refused at once')
        assert.equal((await api('GET', `/auth/api/users/${user.id}`)).statusCode, 404)
        const deleted = await eventsOfUser('user.deleted', user.id)
        assert.equal(deleted.length, 1)
        assert.equal(deleted[0]!.actor.type, door.actor)
        assert.deepEqual(deleted[0]!.target, { type: 'user', id: user.id })
        assert.deepEqual(deleted[0]!.data, { username: user.username, email: user.email, role: user.role })
        assert.deepEqual(await deliveryOf(deleted[0]!), deleted[0])
        await assertCredentialsEnded(user, keyId, 'user_deleted', door.actor)
      })
    }

    // -----------------------------------------------------------------------
    // The last-admin rule at every door that can take admin rights away.
    // These run last: they leave a single enabled admin.

    const refusedByApi = (prefix: string) => (admin: User) => [
      { what: 'role=user', run: async () => { await expectLastAdmin(await api('PATCH', `${prefix}/users/${admin.id}`, { role: 'user' })) } },
      { what: 'disabled=true', run: async () => { await expectLastAdmin(await api('PATCH', `${prefix}/users/${admin.id}`, { disabled: true })) } },
      { what: 'DELETE', run: async () => { await expectLastAdmin(await api('DELETE', `${prefix}/users/${admin.id}`)) } }
    ]
    const expectLastAdmin = async (res: LightMyRequestResponse): Promise<void> => {
      assert.equal(res.statusCode, 409, res.body)
      assert.equal(res.json().code, 'last_admin')
    }
    const expectLastAdminPage = (res: LightMyRequestResponse): void => {
      assert.equal(res.statusCode, 409, res.body)
      assert.match(String(res.headers['content-type']), /^text\/html/)
      assert.match(res.body, /is the last enabled admin\. gatehouse always keeps at least one enabled admin/)
    }
    // A scim key changes no admin account (users.lifecycle.ts, assertMayChangeAccount): the last admin among them.
    const expectScimForbidden = (res: LightMyRequestResponse): void => {
      assert.equal(res.statusCode, 403, res.body)
      assert.deepEqual(res.json(), { schemas: ['urn:ietf:params:scim:api:messages:2.0:Error'], status: '403', detail: `Only an admin may change an admin account; ${consoleAdmin.username} is an admin.` })
    }
    const expectCliRefusal = (r: { code: number | null, stderr: string }): void => {
      assert.equal(r.code, 1, r.stderr)
      assert.equal(r.stderr, `gatehouse: ${LAST_ADMIN_DETAIL}\n`)
    }

    const lastAdminDoors: LastAdminDoor[] = [
      { name: 'the API', attempts: refusedByApi('/auth/api') },
      { name: 'the 3.6.1 path', attempts: refusedByApi('/auth') },
      {
        name: 'the console',
        attempts: (admin) => [
          { what: 'the edit form with role user', run: async () => { expectLastAdminPage(await consolePost(`/auth/admin/users/${admin.id}`, { ...await editForm(admin), role: 'user' })) } },
          { what: 'disable', run: async () => { expectLastAdminPage(await consolePost(`/auth/admin/users/${admin.id}/disable`, {})) } },
          { what: 'delete', run: async () => { expectLastAdminPage(await consolePost(`/auth/admin/users/${admin.id}/delete`, { version: await versionOf(admin.id) })) } }
        ]
      },
      {
        name: 'the CLI',
        attempts: (admin) => [
          { what: 'users update --role user', run: async () => { expectCliRefusal(await cli(['users', 'update', admin.id, '--role', 'user'])) } },
          { what: 'users update --disable', run: async () => { expectCliRefusal(await cli(['users', 'update', admin.id, '--disable'])) } },
          { what: 'users delete', run: async () => { expectCliRefusal(await cli(['users', 'delete', admin.id])) } }
        ]
      },
      {
        name: 'SCIM (403 before 409: a scim key changes no admin account)',
        attempts: (admin) => [
          { what: 'PATCH active "False"', run: async () => { expectScimForbidden(await scim('PATCH', `/Users/${admin.id}`, scimDeactivate)) } },
          { what: 'PUT active false', run: async () => { expectScimForbidden(await scim('PUT', `/Users/${admin.id}`, { userName: admin.username, active: false })) } },
          { what: 'DELETE', run: async () => { expectScimForbidden(await scim('DELETE', `/Users/${admin.id}`)) } }
        ]
      }
    ]

    /** Demotes every enabled admin but `keep`, through the API (its deployment key belongs to no user). */
    const leaveOnlyAdmin = async (keep: string): Promise<void> => {
      const admins = (await api('GET', '/auth/api/users?role=admin&disabled=false&limit=1000')).json() as User[]
      for (const admin of admins.filter(a => a.id !== keep)) {
        const res = await api('PATCH', `/auth/api/users/${admin.id}`, { role: 'user' })
        assert.equal(res.statusCode, 200, res.body)
      }
      const left = (await api('GET', '/auth/api/users?role=admin&disabled=false')).json() as User[]
      assert.deepEqual(left.map(a => a.id), [keep])
    }
    const lifecycleEventCount = async (id: string): Promise<number> =>
      (await eventsOfUser('user.updated', id)).length + (await eventsOfUser('user.deleted', id)).length

    for (const door of lastAdminDoors) {
      it(`${door.name} refuses to take admin rights from the last enabled admin (409 last_admin), and records nothing`, async () => {
        await leaveOnlyAdmin(consoleAdmin.id)
        const admin = await getUser(consoleAdmin.id)
        const seen = await lifecycleEventCount(admin.id)
        for (const attempt of door.attempts(admin)) {
          await attempt.run()
          const still = await getUser(admin.id)
          assert.deepEqual([still.role, still.disabled, still.updated_at], ['admin', false, admin.updated_at], `${attempt.what} changed nothing`)
        }
        assert.equal(await lifecycleEventCount(admin.id), seen, 'no user.updated or user.deleted event')
      })
    }

    /**
     * A sign-in whose mapping would demote the last enabled admin keeps them
     * admin (mappedRoleKeepingLastAdmin): as the API refuses, nothing about
     * the user changes, so no user.updated is recorded (the API records none
     * for a change that changes nothing), and the sign-in's event says the role was kept.
     */
    const ssoLastAdminDoors: Array<{ name: string, prepare: () => Promise<Subject>, signInWithoutAdminGroup: (s: Subject) => Promise<void>, signInEvent: string }> = [
      {
        name: 'OIDC group mapping',
        prepare: changeDoors.find(d => d.name.startsWith('OIDC'))!.prepare,
        signInWithoutAdminGroup: async (s) => { await changeDoors.find(d => d.name.startsWith('OIDC'))!.setRole(s, 'user') },
        signInEvent: 'user.sso_login_succeeded'
      },
      ...(directory !== undefined
        ? [{
            name: 'LDAP group mapping',
            prepare: changeDoors.find(d => d.name.startsWith('LDAP'))!.prepare,
            signInWithoutAdminGroup: async (s: Subject) => { await changeDoors.find(d => d.name.startsWith('LDAP'))!.setRole(s, 'user') },
            signInEvent: 'user.login_succeeded'
          }]
        : [])
    ]

    for (const door of ssoLastAdminDoors) {
      it(`${door.name} that would demote the last enabled admin keeps them admin, records no user.updated, and notes the kept role on the sign-in`, async () => {
        const subject = await door.prepare()
        assert.equal((await api('PATCH', `/auth/api/users/${subject.id}`, { role: 'admin' })).statusCode, 200)
        await leaveOnlyAdmin(subject.id)
        const before = await getUser(subject.id)
        const seenUpdates = (await eventsOfUser('user.updated', subject.id)).length
        const seenSignIns = (await eventsOfUser(door.signInEvent, subject.id)).length
        await door.signInWithoutAdminGroup(subject)
        const after = await getUser(subject.id)
        assert.deepEqual([after.role, after.disabled, after.groups, after.updated_at], ['admin', false, before.groups, before.updated_at], 'the user is left as they were')
        assert.deepEqual((await eventsOfUser('user.updated', subject.id)).slice(seenUpdates), [], 'no user.updated for a change that changed nothing')
        const signIns = (await eventsOfUser(door.signInEvent, subject.id)).slice(seenSignIns)
        assert.equal(signIns.length, 1, `one ${door.signInEvent}`)
        assert.equal(signIns[0]!.data.role_kept, 'last_admin', 'the sign-in event notes that the role was kept')
      })
    }
  })

  describe(`the second-factor policy on promotion, whichever door promotes (MFA_REQUIRED=admins, ${dialect.name})`, () => {
    const { t, state, api, getUser, cliOk, consolePost, editForm, passwordSignIn, meWith, oidcCallback, oidcSignIn, oidcAccount, ldapLogin, ldapSignIn } =
      deployment(dialect, { mfaRequired: 'admins', mfaEncryptionKey: randomBytes(32) })
    const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })
    /** The TOTP code `steps` time steps from now (the server takes one step either side, and each code once). */
    const codeAt = async (secret: string, steps = 0): Promise<string> => await generate({ secret, epoch: Math.floor(Date.now() / 1000) + steps * 30 })

    before(async () => {
      state.cliEnv = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
      // The console's admin signs in with a second factor, as the policy asks of admins: enrolled while a user, then promoted.
      const made = await api('POST', '/auth/api/users', { username: uniqueName('console'), password: GOOD_PASSWORD })
      assert.equal(made.statusCode, 201, made.body)
      const asUser = bearer(await passwordSignIn(made.json().username))
      const setup = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp', headers: asUser })
      assert.equal(setup.statusCode, 200, setup.body)
      const secret: string = setup.json().secret
      const confirmed = await t.app.inject({ method: 'POST', url: '/auth/api/me/mfa/totp/confirm', headers: asUser, payload: { code: await codeAt(secret) } })
      assert.equal(confirmed.statusCode, 200, confirmed.body)
      assert.equal((await api('PATCH', `/auth/api/users/${made.json().id}`, { role: 'admin' })).statusCode, 200)
      const challenge = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: made.json().username, password: GOOD_PASSWORD } })
      assert.equal(challenge.statusCode, 202, challenge.body)
      const done = await t.app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: challenge.json().challenge_token, totp_code: await codeAt(secret, 1) } })
      assert.equal(done.statusCode, 200, done.body)
      state.consoleCookie = `gatehouse_session=${done.json().token as string}`
    })

    const localUser = async (): Promise<Subject> => {
      const res = await api('POST', '/auth/api/users', { username: uniqueName('mfa'), password: GOOD_PASSWORD })
      assert.equal(res.statusCode, 201, res.body)
      return { id: res.json().id, token: await passwordSignIn(res.json().username) }
    }
    const oidcSubjects = new Map<string, string>()
    const ldapSubjects = new Map<string, string>()
    const promoteDoors: Array<{ name: string, prepare: () => Promise<Subject>, promote: (subject: Subject) => Promise<void> }> = [
      { name: 'the API', prepare: localUser, promote: async ({ id }) => { assert.equal((await api('PATCH', `/auth/api/users/${id}`, { role: 'admin' })).statusCode, 200) } },
      { name: 'the 3.6.1 path', prepare: localUser, promote: async ({ id }) => { assert.equal((await api('PATCH', `/auth/users/${id}`, { role: 'admin' })).statusCode, 200) } },
      {
        name: 'the console\'s edit form',
        prepare: localUser,
        promote: async ({ id }) => {
          const res = await consolePost(`/auth/admin/users/${id}`, { ...await editForm(await getUser(id)), role: 'admin' })
          assert.equal(res.statusCode, 303, res.body)
        }
      },
      { name: 'the CLI', prepare: localUser, promote: async ({ id }) => { await cliOk(['users', 'update', id, '--role', 'admin']) } },
      {
        name: 'OIDC admin_groups at a sign-in that stops at the second step',
        prepare: async () => {
          const subject = oidcAccount({ preferred_username: uniqueName('oidc'), groups: [GROUP] })
          const token = await oidcSignIn(subject)
          const id: string = (await meWith(bearer(token))).json().id
          oidcSubjects.set(id, subject)
          return { id, token }
        },
        promote: async ({ id }) => {
          const subject = oidcSubjects.get(id)!
          op.accounts.set(subject, { ...op.accounts.get(subject), groups: [GROUP, 'gh-admins'] })
          const res = await oidcCallback(subject)
          assert.equal(res.statusCode, 200, 'the second step (enrolment), not a session')
          assert.equal(sessionCookieOf(res), undefined)
        }
      },
      ...(directory !== undefined
        ? [{
            name: 'an LDAP role:admin mapping at a sign-in that stops at the second step',
            prepare: async (): Promise<Subject> => {
              const uid = uniqueName('ldap')
              const dn = await directory.addUser(uid, DIRECTORY_PASSWORD, { mail: `${uid}@example.org` })
              await directory.setMembers(adminsDn!, [])
              const { user, token } = await ldapSignIn(uid)
              ldapSubjects.set(user.id, dn)
              return { id: user.id, token }
            },
            promote: async ({ id }: Subject): Promise<void> => {
              await directory.setMembers(adminsDn!, [ldapSubjects.get(id)!])
              const res = await ldapLogin((await getUser(id)).username)
              assert.equal(res.statusCode, 202, res.body)
              await directory.setMembers(adminsDn!, [])
            }
          }]
        : [])
    ]

    for (const door of promoteDoors) {
      it(`a session without a second factor gets no admin rights from a promotion through ${door.name}`, async () => {
        const subject = await door.prepare()
        const session = bearer(subject.token)
        const rights = async (): Promise<unknown[]> => {
          const key = await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: session, payload: { name: uniqueName('k') } })
          const list = await t.app.inject({ url: '/auth/api/users', headers: session })
          const verify = await t.app.inject({ url: '/auth/api/verify', headers: session })
          return [key.statusCode, list.statusCode, verify.statusCode, verify.headers['x-auth-role'], verify.headers['x-auth-mfa']]
        }
        assert.deepEqual(await rights(), [403, 403, 200, 'user', 'false'], 'a user before the promotion')
        await door.promote(subject)
        assert.equal((await getUser(subject.id)).role, 'admin', 'the door made them an admin')
        assert.deepEqual(await rights(), [403, 403, 200, 'user', 'false'], 'the password-only session still acts as a user')
      })
    }
  })
}
