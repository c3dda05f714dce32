/**
 * Generators of the fuzzer (bench/fuzz-requests.ts) for the inputs a schema
 * alone describes too loosely to reach the code behind them: SCIM PATCH and
 * PUT bodies, SCIM filters and attribute lists, and the bodies of the e-mail
 * flows (accepting an invitation, resetting a password, confirming an
 * address), which only do something with a live token or code.
 *
 * Values that must be live (a user's id, a token the server issued) are
 * written as `{{live:<pool>:<n>}}` and filled in from the run's pool when the
 * request is sent (fillLive in fuzz-requests.ts).
 */
import fc from 'fast-check'

const ENTERPRISE = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User'
const CORE_USER = 'urn:ietf:params:scim:schemas:core:2.0:User'
const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp'

/** A placeholder for the n-th live value of a pool, filled in when the request is sent. */
export function live (pool: 'user_id' | 'group_id' | 'token' | 'code' | 'username' | 'email' | 'login'): fc.Arbitrary<string> {
  return fc.nat(1000).map(n => `{{live:${pool}:${n}}}`)
}

/**
 * Names that reach Object.prototype where a client's name becomes an object
 * key unchecked (issue 38: a SCIM PATCH path `constructor.prototype.x`
 * stopped the process). In paths, in path-less values, in nested values.
 */
export const PROTOTYPE_PATHS = [
  '__proto__', 'constructor', 'prototype', '__proto__.polluted', 'constructor.prototype.polluted', 'constructor.prototype',
  'name.__proto__.polluted', 'name.constructor.prototype.polluted', 'emails[type eq "work"].__proto__', `${ENTERPRISE}:__proto__`,
  `${ENTERPRISE}:constructor.prototype.polluted`, 'members.__proto__', '__proto__[value eq "x"]'
]

const USER_PATHS = [
  'userName', 'UserName', 'name', 'name.givenName', 'name.familyName', 'name.formatted', 'NAME.GIVENNAME', 'displayName', 'externalId', 'active',
  'password', 'emails', 'emails.value', 'emails[type eq "work"].value', 'emails[type eq "work"]', 'emails[primary eq true].value',
  'emails[value co "@"].type', 'groups', 'id', 'meta', 'meta.version', 'schemas', 'title', 'addresses[type eq "work"].country', 'phoneNumbers',
  `${CORE_USER}:userName`, `${CORE_USER}:name.givenName`, ENTERPRISE, `${ENTERPRISE}:department`, `${ENTERPRISE}:Department`,
  `${ENTERPRISE}:manager`, `${ENTERPRISE}:manager.value`, `${ENTERPRISE}:employeeNumber`, `${ENTERPRISE}:manager.displayName`,
  'members', 'displayName ', ' name', 'a.b.c.d', 'emails[', 'emails[type eq]', 'emails[type eq "work"', 'emails]', '[]', '.', '..', ':', 'urn:', ''
]

const FILTER_ATTRIBUTES = [
  'userName', 'USERNAME', 'externalId', 'id', 'displayName', 'name.givenName', 'name.familyName', 'name.formatted', 'active',
  'emails', 'emails.value', 'emails.type', 'emails.primary', 'meta.created', 'meta.lastModified', 'meta.resourceType', 'members', 'members.value',
  'groups', 'groups.value', `${CORE_USER}:userName`, `${ENTERPRISE}:department`, `${ENTERPRISE}:employeeNumber`, `${ENTERPRISE}:manager`,
  `${ENTERPRISE}:manager.value`, 'manager.value', 'manager.displayName', 'manager.$ref', 'department', 'costCenter', 'title', 'password',
  '__proto__', 'constructor.prototype', 'toString', 'a.b.c', 'x'.repeat(300), 'user name', '"userName"', 'userName[', ''
]
const FILTER_OPERATORS = ['eq', 'ne', 'co', 'sw', 'ew', 'gt', 'ge', 'lt', 'le', 'EQ', 'Eq', 'xx', '=', '==', 'like']

/** A filter comparison value: quoted text (hostile, live ids and names), literals, bare words. */
function filterValue (hostile: fc.Arbitrary<string>): fc.Arbitrary<string> {
  const quoted = (text: fc.Arbitrary<string>): fc.Arbitrary<string> => text.map(t => JSON.stringify(t))
  return fc.oneof(
    { weight: 3, arbitrary: live('user_id').map(id => `"${id}"`) },
    { weight: 2, arbitrary: live('username').map(name => `"${name}"`) },
    { weight: 1, arbitrary: live('group_id').map(id => `"${id}"`) },
    { weight: 3, arbitrary: quoted(hostile) },
    { weight: 2, arbitrary: fc.constantFrom('true', 'false', 'null', '1', '-1', '1e309', '0x10', '"2026-01-01T00:00:00Z"', '"2026-13-45"', 'Smith', 'fuzz_user') },
    { weight: 1, arbitrary: fc.constantFrom('"unterminated', '"a\\"b"', '"\\u0000"', '"\\ud800"', "'single'", '""', '"%"', '"_"', '"\\\\"', '"*"') }
  )
}

/** SCIM filters (RFC 7644 §3.4.2.2): comparisons, presence, and/or/not, parentheses, value filters, and broken ones. */
export function scimFilter (hostile: fc.Arbitrary<string>): fc.Arbitrary<string> {
  const attribute = fc.constantFrom(...FILTER_ATTRIBUTES)
  const comparison = fc.oneof(
    { weight: 6, arbitrary: fc.tuple(attribute, fc.constantFrom(...FILTER_OPERATORS), filterValue(hostile)).map(([a, op, v]) => `${a} ${op} ${v}`) },
    { weight: 1, arbitrary: attribute.map(a => `${a} pr`) }
  )
  const { filter } = fc.letrec<{ filter: string }>(tie => ({
    filter: fc.oneof(
      { depthSize: 'small', withCrossShrink: true },
      { weight: 5, arbitrary: comparison },
      { weight: 1, arbitrary: fc.tuple(tie('filter'), fc.constantFrom('and', 'or', 'AND', 'Or'), tie('filter')).map(([a, op, b]) => `${a} ${op} ${b}`) },
      { weight: 1, arbitrary: tie('filter').map(f => `not (${f})`) },
      { weight: 1, arbitrary: tie('filter').map(f => `(${f})`) },
      { weight: 1, arbitrary: fc.tuple(fc.constantFrom('emails', 'members', 'groups', 'addresses', '__proto__'), comparison).map(([a, f]) => `${a}[${f}]`) }
    )
  }))
  return fc.oneof(
    { weight: 8, arbitrary: filter },
    {
      weight: 1,
      arbitrary: fc.constantFrom('(', ')', 'userName eq', 'eq "x"', 'userName eq "x" and', 'not userName eq "x"', 'emails[type eq "work"].value eq "x"',
        '('.repeat(500) + 'userName pr' + ')'.repeat(500), 'userName eq "x" or '.repeat(200) + 'id pr', 'userName eq "' + 'x'.repeat(1990) + '"', ' ', '[', 'userName[value eq "x"]')
    }
  )
}

/** `attributes` / `excludedAttributes`: comma lists of paths, sub-attributes and value filters. */
export function scimAttributeList (hostile: fc.Arbitrary<string>): fc.Arbitrary<string> {
  const one = fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom(...USER_PATHS, ...PROTOTYPE_PATHS) },
    { weight: 2, arbitrary: scimFilter(hostile).map(f => `emails[${f}]`) },
    { weight: 1, arbitrary: hostile }
  )
  return fc.array(one, { minLength: 1, maxLength: 4 }).map(list => list.join(','))
}

const SCIM_BOOLEANS = [true, false, 'True', 'False', 'true', 'FALSE', 'yes', 1, 0, null, '', [], {}]

/** An object with these own keys, `__proto__` included as an ordinary key (as JSON.parse makes it). */
function withOwnKeys (entries: Array<[string, unknown]>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const [key, value] of entries) Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true })
  return out
}

function pollutingObject (): fc.Arbitrary<Record<string, unknown>> {
  return fc.tuple(fc.constantFrom(...PROTOTYPE_PATHS), fc.constantFrom<unknown>(1, 'x', { polluted: 1 }, { prototype: { polluted: 1 } }, [1]))
    .map(([key, value]) => withOwnKeys([[key, value]]))
}

/** A value a SCIM attribute might be given: right-ish, wrong type, hostile, or an object of attributes (path-less operations). */
function attributeValue (hostile: fc.Arbitrary<string>): fc.Arbitrary<unknown> {
  return fc.oneof(
    { weight: 3, arbitrary: hostile },
    { weight: 2, arbitrary: fc.constantFrom(...SCIM_BOOLEANS) },
    { weight: 2, arbitrary: live('user_id') },
    { weight: 1, arbitrary: live('user_id').map(value => ({ value })) },
    { weight: 1, arbitrary: fc.array(live('user_id').map(value => ({ value })), { minLength: 1, maxLength: 3 }) },
    { weight: 1, arbitrary: fc.record({ givenName: hostile, familyName: hostile }, { requiredKeys: [] }) },
    { weight: 1, arbitrary: fc.array(fc.record({ value: fc.emailAddress(), type: fc.constantFrom('work', 'home', 'other', ''), primary: fc.constantFrom(...SCIM_BOOLEANS) }, { requiredKeys: ['value'] }), { maxLength: 3 }) },
    { weight: 2, arbitrary: fc.dictionary(fc.constantFrom(...USER_PATHS, 'active', 'displayName'), fc.oneof(hostile, fc.constantFrom(...SCIM_BOOLEANS)), { maxKeys: 3 }) },
    { weight: 1, arbitrary: fc.record({ [ENTERPRISE]: fc.record({ department: hostile, manager: fc.oneof(live('user_id'), live('user_id').map(value => ({ value })), fc.constantFrom(null, '', [], { value: '' })) }, { requiredKeys: [] }) }) },
    { weight: 2, arbitrary: pollutingObject() },
    { weight: 1, arbitrary: pollutingObject().map(inner => ({ name: inner })) }
  )
}

/** A SCIM PatchOp body (RFC 7644 §3.5.2) as Okta and Entra send them, and as an attacker would. */
export function scimPatchBody (hostile: fc.Arbitrary<string>): fc.Arbitrary<unknown> {
  const path = fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom(...USER_PATHS) },
    { weight: 2, arbitrary: fc.constantFrom(...PROTOTYPE_PATHS) },
    { weight: 2, arbitrary: live('user_id').map(id => `members[value eq "${id}"]`) },
    { weight: 1, arbitrary: scimFilter(hostile).map(f => `emails[${f}].value`) },
    { weight: 1, arbitrary: hostile }
  )
  const operation = fc.record({
    op: fc.constantFrom('add', 'replace', 'remove', 'Add', 'Replace', 'Remove', 'REPLACE', 'copy', 'move', 'test', '', 'add '),
    path,
    value: attributeValue(hostile)
  }, { requiredKeys: ['op'] })
  // Well-formed operations whose only fault is a name that reaches Object.prototype: what stopped the process (issue 38).
  const polluting = fc.record({
    op: fc.constantFrom('add', 'replace', 'Replace'),
    path: fc.constantFrom(...PROTOTYPE_PATHS),
    value: fc.constantFrom<unknown>(1, 'x', true, { polluted: 1 }, { prototype: { polluted: 1 } })
  })
  const pathless = pollutingObject().map(value => ({ op: 'replace', value }))
  return fc.record({
    schemas: fc.oneof(fc.constant([PATCH_OP]), fc.constantFrom([], [CORE_USER], ['x'], null)),
    Operations: fc.oneof(
      { weight: 8, arbitrary: fc.array(operation, { minLength: 1, maxLength: 4 }) },
      { weight: 2, arbitrary: fc.array(fc.oneof(polluting, pathless), { minLength: 1, maxLength: 2 }) },
      { weight: 1, arbitrary: fc.constantFrom([], null, {}, 'replace') }
    )
  }, { requiredKeys: ['Operations'] })
}

/** A SCIM User to create or to replace with. */
export function scimUserBody (hostile: fc.Arbitrary<string>): fc.Arbitrary<unknown> {
  const userName = fc.oneof(
    { weight: 4, arbitrary: fc.stringMatching(/^fuzz_scim_[a-z0-9]{1,12}$/) },
    { weight: 2, arbitrary: live('username') },
    { weight: 2, arbitrary: hostile }
  )
  return fc.tuple(
    fc.record({
      schemas: fc.constantFrom([CORE_USER], [CORE_USER, ENTERPRISE], []),
      userName,
      externalId: fc.oneof(fc.uuid(), hostile),
      name: fc.oneof(fc.record({ givenName: hostile, familyName: hostile, formatted: hostile }, { requiredKeys: [] }), fc.constantFrom(null, 'Ada', [])),
      displayName: hostile,
      active: fc.constantFrom(...SCIM_BOOLEANS),
      password: fc.oneof(fc.constant('correct horse battery staple at random'), hostile),
      emails: fc.oneof(attributeValue(hostile), fc.constant(Array.from({ length: 21 }, (_, i) => ({ value: `a${i}@example.com` })))),
      [ENTERPRISE]: fc.oneof(
        fc.record({ department: hostile, employeeNumber: hostile, manager: fc.oneof(live('user_id'), live('user_id').map(value => ({ value })), live('user_id').map(value => [{ value }]), hostile) }, { requiredKeys: [] }),
        fc.constantFrom(null, 'x', [])
      )
    }, { requiredKeys: ['userName'] }),
    fc.option(pollutingObject(), { freq: 3 }),
    fc.option(fc.constantFrom<Array<[string, unknown]>>([['UserName', 'fuzz_case']], [['ACTIVE', 'False']], [['groups', [{ value: 'x' }]]], [['id', 'x']], [['meta', { version: 'W/"1"' }]]), { freq: 4 })
  ).map(([user, polluting, extra]) => withOwnKeys([...Object.entries(user), ...Object.entries(polluting ?? {}), ...(extra ?? [])]))
}

/** A SCIM Group to create or to replace with. */
export function scimGroupBody (hostile: fc.Arbitrary<string>): fc.Arbitrary<unknown> {
  const member = fc.oneof(live('user_id').map(value => ({ value })), live('user_id'), hostile.map(value => ({ value })), fc.constantFrom<unknown>(null, 1, {}, { value: null }))
  return fc.tuple(
    fc.record({
      schemas: fc.constantFrom(['urn:ietf:params:scim:schemas:core:2.0:Group'], []),
      displayName: fc.oneof(fc.stringMatching(/^fuzz scim [a-z0-9]{1,10}$/), hostile),
      externalId: fc.oneof(fc.uuid(), hostile),
      members: fc.oneof(fc.array(member, { maxLength: 5 }), member, fc.constant(null))
    }, { requiredKeys: ['displayName'] }),
    fc.option(pollutingObject(), { freq: 4 })
  ).map(([group, polluting]) => withOwnKeys([...Object.entries(group), ...Object.entries(polluting ?? {})]))
}

/** The proof of a mailed link or code: a live token, a live login with a live code, both, neither, or a forgery. */
function tokenProof (hostile: fc.Arbitrary<string>): fc.Arbitrary<Record<string, unknown>> {
  return fc.oneof(
    { weight: 4, arbitrary: live('token').map(token => ({ token })) },
    { weight: 4, arbitrary: fc.record({ login: fc.oneof(live('login'), live('username'), live('email')), code: live('code') }) },
    { weight: 1, arbitrary: fc.record({ token: live('token'), login: live('login'), code: live('code') }) },
    { weight: 1, arbitrary: fc.record({ login: live('login') }) },
    { weight: 1, arbitrary: fc.record({ code: fc.oneof(live('code'), fc.constantFrom('k7pm q2xd', 'AAAA-AAAA', '----', ' ')) }) },
    { weight: 1, arbitrary: fc.record({ token: fc.oneof(fc.stringMatching(/^ght_[0-9A-Za-z]{43}$/), hostile) }) },
    { weight: 1, arbitrary: fc.constant({}) }
  )
}

const PASSWORDS = ['correct horse battery staple at random', 'another long passphrase for the fuzz', 'a', 'password', 'x'.repeat(1025)]

/** Bodies of the named schemas, each mixed with what the schema alone generates. */
export function bodyGenerators (hostile: fc.Arbitrary<string>): Record<string, fc.Arbitrary<unknown>> {
  const password = fc.oneof(fc.constantFrom(...PASSWORDS), hostile)
  return {
    ScimPatchOp: scimPatchBody(hostile),
    ScimUserWrite: scimUserBody(hostile),
    ScimGroupWrite: scimGroupBody(hostile),
    InvitationAcceptance: fc.tuple(tokenProof(hostile), password).map(([proof, value]) => ({ ...proof, password: value })),
    PasswordResetCompletion: fc.tuple(tokenProof(hostile), password).map(([proof, value]) => ({ ...proof, new_password: value })),
    EmailConfirmation: tokenProof(hostile),
    PasswordResetRequest: fc.oneof(
      live('email').map(email => ({ email })),
      live('username').map(username => ({ username })),
      fc.record({ email: live('email'), username: live('username') }),
      hostile.map(username => ({ username }))
    ),
    EmailVerificationRequest: fc.oneof(fc.constant({}), fc.emailAddress().map(email => ({ email })), live('email').map(email => ({ email })))
  }
}

/** Query parameters of SCIM operations, by name. */
export function scimQueryGenerators (hostile: fc.Arbitrary<string>): Record<string, fc.Arbitrary<string>> {
  return {
    filter: scimFilter(hostile),
    attributes: scimAttributeList(hostile),
    excludedAttributes: scimAttributeList(hostile),
    sortBy: fc.constantFrom(...FILTER_ATTRIBUTES),
    sortOrder: fc.constantFrom('ascending', 'descending', 'DESCENDING', 'up', '')
  }
}
