import { sql } from 'kysely'
import { toBool, toStringArray, type Db, type ScimEmail } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent, REDACTED } from '../events/events.repository.ts'
import { revokeKeysRecorded } from '../api-keys/api-keys.repository.ts'
import { endSessionsRecorded } from '../sessions/sessions.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { activeTrace } from '../lib/tracing.ts'
import { endLiveTokens } from '../tokens/tokens.repository.ts'
import {
  deleteMemberships,
  findGroupsByIds,
  findGroupsByNames,
  groupNameKey,
  insertGroupsIfAbsent,
  insertMemberships,
  listGroupIdsOfUser,
  spelledGroups,
  storedGroupSpellings,
  touchGroups
} from '../groups/groups.repository.ts'
import {
  deleteUser,
  findUserById,
  insertEventRows,
  insertUser,
  insertUsers,
  listReportIds,
  lockEnabledAdminIds,
  toUser,
  updateUser,
  type NewUserRow,
  type PublicUserRow,
  type UserRow,
  type UserRowUpdate
} from './users.repository.ts'
import type { User } from './users.schemas.ts'

/*
 * The user lifecycle: the only functions that create, change, disable or
 * delete a user row (docs/architecture.md, "One lifecycle for users"). Every
 * door comes here, in the transaction of its own request: the API and its
 * 3.6.1 paths, the console, the CLI and import, the users OIDC and LDAP make
 * at a first sign-in and the role and groups their mapping gives at each
 * sign-in. So the last-admin rule, the events (and with them the webhooks,
 * queued in the same transaction), the end of a user's sessions and keys and
 * the credential cache (emptied by every write to users, sessions and
 * api_keys: auth/credential-cache.ts) are the same whichever door was used.
 * What differs between doors is who may use them, which is the caller's rule.
 *
 * A user's `groups` array is also their memberships in `group_members`
 * (migration 0012): every function here that writes the array brings the
 * memberships in step in the same transaction, and makes a group for a name
 * that has none, so a 3.6.1 client that sends `"groups": ["new-team"]` makes
 * the group `new-team`. Those changes are recorded as the groups resource
 * records its own (`group.created`, `group.members_added`,
 * `group.members_removed`), so a reader of group events misses none, whichever
 * door changed the membership.
 *
 * These are data-level functions, as Supabase Auth's models.* are: they take
 * the transaction and import only repositories, so any service or flow may
 * call them and none of them calls a service.
 */

/** A new user as every door describes it; the row (id, keys, timestamps) is made here. */
export interface NewUser {
  username: string
  email?: string | null | undefined
  first_name?: string | null | undefined
  last_name?: string | null | undefined
  role?: 'admin' | 'user' | undefined
  groups?: string[] | undefined
  disabled?: boolean | undefined
  password_sign_in?: boolean | undefined
  /** Invited: no password until the invitation is accepted (docs/email.md#invitations). */
  invitation_pending?: boolean | undefined
  /** What a SCIM client keeps about the user (docs/scim.md); no other door sets these. */
  external_id?: string | null | undefined
  display_name?: string | null | undefined
  formatted_name?: string | null | undefined
  scim_emails?: ScimEmail[] | null | undefined
  /** SCIM's enterprise extension (migration 0017); `manager_id` is one of our users, checked by the caller. */
  employee_number?: string | null | undefined
  cost_center?: string | null | undefined
  organization?: string | null | undefined
  division?: string | null | undefined
  department?: string | null | undefined
  manager_id?: string | null | undefined
}

/** The SCIM fields of a user, as `user.created` and `user.updated` events name them. */
const SCIM_FIELDS = ['external_id', 'display_name', 'formatted_name', 'scim_emails', 'employee_number', 'cost_center', 'organization', 'division', 'department', 'manager_id'] as const

/** JSON with every object's keys in order: PostgreSQL's jsonb gives keys back in an order of its own. */
function sortedJson (value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => typeof v === 'object' && v !== null && !Array.isArray(v)
    ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0))
    : v)
}

function scimFieldsOf (row: Partial<Record<typeof SCIM_FIELDS[number], unknown>>): Record<string, unknown> {
  const fields: Record<string, unknown> = {}
  for (const field of SCIM_FIELDS) {
    const value = field === 'scim_emails' && typeof row[field] === 'string' ? JSON.parse(row[field]) : row[field]
    if (value !== undefined && value !== null) fields[field] = value
  }
  return fields
}

/** The row of a new user; `hasPassword` when a hash is given or will be set before the insert. */
export function newUserRow (input: NewUser, passwordHash: string | null, hasPassword: boolean, now: string): NewUserRow {
  const email = input.email ?? null
  return {
    id: newId(),
    username: input.username,
    username_key: input.username.toLowerCase(),
    email,
    email_key: email?.toLowerCase() ?? null,
    // Bounded as the API's schema bounds them: a provider's or directory's names may be longer.
    first_name: input.first_name?.slice(0, 200) ?? null,
    last_name: input.last_name?.slice(0, 200) ?? null,
    role: input.role ?? 'user',
    groups: JSON.stringify(input.groups ?? []),
    disabled: input.disabled ?? false,
    password_sign_in: input.password_sign_in ?? true,
    invitation_pending: input.invitation_pending ?? false,
    password_hash: passwordHash,
    version: 1,
    created_at: now,
    updated_at: now,
    last_login_at: null,
    password_changed_at: hasPassword ? now : null,
    ...(input.external_id != null ? { external_id: input.external_id } : {}),
    ...(input.display_name != null ? { display_name: input.display_name } : {}),
    ...(input.formatted_name != null ? { formatted_name: input.formatted_name } : {}),
    ...(input.scim_emails != null ? { scim_emails: JSON.stringify(input.scim_emails) } : {}),
    ...(input.employee_number != null ? { employee_number: input.employee_number } : {}),
    ...(input.cost_center != null ? { cost_center: input.cost_center } : {}),
    ...(input.organization != null ? { organization: input.organization } : {}),
    ...(input.division != null ? { division: input.division } : {}),
    ...(input.department != null ? { department: input.department } : {}),
    ...(input.manager_id != null ? { manager_id: input.manager_id } : {})
  }
}

function withoutTimestamps (user: User): Record<string, unknown> {
  const { created_at: _c, updated_at: _u, last_login_at: _l, password_changed_at: _p, ...rest } = user
  return rest
}

/** The data of a `user.created` event: the user as created, the password redacted, and what the door adds (`source`, `imported_hash_scheme`). */
function createdEventData (row: NewUserRow | PublicUserRow, scimFields: Record<string, unknown>, hasPassword: boolean, extra: Record<string, unknown>): Record<string, unknown> {
  return { ...withoutTimestamps(toUser(row)), ...scimFields, ...(hasPassword ? { password: REDACTED } : {}), ...extra }
}

/**
 * The ids of the groups of these names, by groupNameKey (names are unique
 * ignoring case), making (each with a `group.created` event) those that have
 * none. A name another transaction makes first is used as made there.
 */
async function groupIdsOf (trx: Db, ctx: RequestContext, names: readonly string[], lock: 'key_share' | 'no_key_update', alsoLockIds: readonly string[] = []): Promise<Map<string, string>> {
  const byKey = new Map<string, string>()
  for (const name of names) if (!byKey.has(groupNameKey(name))) byKey.set(groupNameKey(name), name)
  const ids = new Map<string, string>()
  if (byKey.size === 0 && alsoLockIds.length === 0) return ids
  for (const group of await findGroupsByNames(trx, [...byKey.values()], { lock, alsoIds: alsoLockIds })) {
    if (byKey.has(group.name_key)) ids.set(group.name_key, group.id)
  }
  const missing = [...byKey].filter(([key]) => !ids.has(key)).map(([, name]) => name)
  if (missing.length === 0) return ids
  const now = nowIso()
  const made = await insertGroupsIfAbsent(trx, missing.map(name => ({ id: newId(), display_name: name, external_id: null, version: 1, created_at: now, updated_at: now })))
  for (const group of made) {
    ids.set(group.name_key, group.id)
    await recordEvent(trx, ctx, 'group.created', { type: 'group', id: group.id }, { display_name: group.display_name, external_id: null, member_ids: [], source: 'user_groups' })
  }
  const raced = missing.filter(name => !ids.has(groupNameKey(name)))
  if (raced.length > 0) for (const group of await findGroupsByNames(trx, raced, { lock })) ids.set(group.name_key, group.id)
  return ids
}

/**
 * New users' rows with their `groups` spelled as stored (storedGroupSpellings):
 * naming `DATA` joins the group `data`, and names new to this call that differ
 * only in case make one group, so the user and group views agree.
 */
async function withStoredGroupSpellings<R extends { row: NewUserRow }> (trx: Db, rows: R[]): Promise<R[]> {
  const names = rows.flatMap(({ row }) => toStringArray(row.groups))
  if (names.length === 0) return rows
  const spelling = await storedGroupSpellings(trx, names)
  return rows.map(r => ({ ...r, row: { ...r.row, groups: JSON.stringify(spelledGroups(toStringArray(r.row.groups), spelling)) } }))
}

/** One `group.members_added` or `group.members_removed` event per group, and a new version of each group. */
async function recordMembershipChanges (trx: Db, ctx: RequestContext, type: 'group.members_added' | 'group.members_removed', byGroup: Map<string, string[]>, extra: Record<string, unknown> = {}): Promise<void> {
  if (byGroup.size === 0) return
  await touchGroups(trx, [...byGroup.keys()], nowIso())
  const names = new Map((await findGroupsByIds(trx, [...byGroup.keys()])).map(group => [group.id, group.display_name]))
  for (const [groupId, userIds] of byGroup) {
    await recordEvent(trx, ctx, type, { type: 'group', id: groupId }, { display_name: names.get(groupId) ?? null, user_ids: userIds, ...extra })
  }
}

/**
 * Brings a user's rows in `group_members` in step with their `groups` array.
 * `record`: false when the caller (groups.lifecycle.ts) records the change
 * of members itself, once for all the users it changes.
 */
async function syncMemberships (trx: Db, ctx: RequestContext, userId: string, names: readonly string[], record: boolean): Promise<void> {
  // The user's row is locked, so no other transaction changes what they hold meanwhile.
  const held = new Set(await listGroupIdsOfUser(trx, userId))
  // Recording, the groups joined and left get a new version: all locked for
  // that at once, in one statement and so in one id order (locking those left
  // only when touched would deadlock against a user leaving what this one joins).
  // The group lifecycle holds the one group whose members it changes, and
  // must not wait on the member's other groups, which it leaves as they are.
  const wanted = new Set((await groupIdsOf(trx, ctx, names, record ? 'no_key_update' : 'key_share', record ? [...held] : [])).values())
  const added = [...wanted].filter(id => !held.has(id))
  const removed = [...held].filter(id => !wanted.has(id))
  await insertMemberships(trx, added.map(groupId => ({ group_id: groupId, user_id: userId })))
  await deleteMemberships(trx, userId, removed)
  if (!record) return
  await recordMembershipChanges(trx, ctx, 'group.members_added', new Map(added.map(groupId => [groupId, [userId]])))
  await recordMembershipChanges(trx, ctx, 'group.members_removed', new Map(removed.map(groupId => [groupId, [userId]])))
}

/** Creates one user with its `user.created` event, and their memberships. */
export async function createUserRecorded (trx: Db, ctx: RequestContext, given: NewUserRow, extra: Record<string, unknown> = {}): Promise<PublicUserRow> {
  assertMayChangeAccount(ctx, given)
  const [{ row }] = await withStoredGroupSpellings(trx, [{ row: given }]) as [{ row: NewUserRow }]
  const inserted = await insertUser(trx, row)
  await recordEvent(trx, ctx, 'user.created', { type: 'user', id: inserted.id }, createdEventData(inserted, scimFieldsOf(row), row.password_hash !== null, extra))
  await syncMemberships(trx, ctx, inserted.id, toStringArray(row.groups), true)
  return inserted
}

/** Creates many users (an import) with a `user.created` event each, in two statements. */
export async function createUsersRecorded (trx: Db, ctx: RequestContext, given: Array<{ row: NewUserRow, extra?: Record<string, unknown> }>): Promise<void> {
  if (given.length === 0) return
  for (const { row } of given) assertMayChangeAccount(ctx, row)
  const rows = await withStoredGroupSpellings(trx, given)
  const now = nowIso()
  const trace = activeTrace()
  await insertUsers(trx, rows.map(r => r.row))
  await insertEventRows(trx, rows.map(({ row, extra }) => ({
    id: newId(),
    type: 'user.created',
    occurred_at: now,
    actor_type: ctx.actorType,
    actor_id: ctx.actorId,
    target_type: 'user',
    target_id: row.id,
    request_id: ctx.requestId,
    client_ip: ctx.clientIp,
    data: JSON.stringify(createdEventData(row, scimFieldsOf(row), row.password_hash !== null, extra ?? {})),
    trace_id: trace?.traceId ?? null,
    span_id: trace?.spanId ?? null
  })))
  // Their memberships: one `group.members_added` per group, listing every new member.
  const namesOf = new Map(rows.map(({ row }) => [row.id, toStringArray(row.groups)]))
  const ids = await groupIdsOf(trx, ctx, [...namesOf.values()].flat(), 'no_key_update')
  const byGroup = new Map<string, string[]>()
  for (const [userId, names] of namesOf) {
    for (const name of new Set(names)) {
      const groupId = ids.get(groupNameKey(name))!
      byGroup.set(groupId, [...byGroup.get(groupId) ?? [], userId])
    }
  }
  await insertMemberships(trx, [...byGroup].flatMap(([groupId, userIds]) => userIds.map(userId => ({ group_id: groupId, user_id: userId }))))
  await recordMembershipChanges(trx, ctx, 'group.members_added', byGroup)
}

/**
 * What a door may change about a user; `password_hash` is a hash made before
 * the transaction. `email_verified` is set by a confirmation only; a new
 * `email` without it is unverified.
 */
export type UserChanges = Partial<NewUser> & { password_hash?: string | undefined, email_verified?: boolean | undefined }

export interface ChangeOptions {
  /**
   * When the change would leave no enabled admin: `refuse` answers 409
   * `last_admin` (a person asked: the API, the console, the CLI); `keep`
   * leaves the role as it is, for a sign-in's mapping, where nobody is there
   * to ask: the outcome says so (`keptLastAdmin`) for the sign-in's event, and
   * a `user.updated` the other changes make carries `role_kept: "last_admin"`.
   */
  lastAdmin: 'refuse' | 'keep'
  /** Checks the locked current row before anything is written (If-Match, who may change it); throwing rolls back. */
  check?: (current: UserRow) => void
  /** Added to the `user.updated` event: `source` of a sign-in's mapping. */
  extra?: Record<string, unknown>
  /** A SCIM client asked: a change that changes something also sets `provisioned_at`. */
  provisioning?: boolean
  /**
   * False when the caller records the change of a group's members itself
   * (groups.lifecycle.ts, once for all the members it changes); by default a
   * change of `groups` records `group.members_added`/`_removed` per group.
   */
  recordGroupEvents?: boolean
  /**
   * The change follows from another the actor was allowed to make (a deleted
   * manager is cleared from their reports): the admin-account rule was
   * applied to that one.
   */
  consequence?: boolean
}

export interface ChangeOutcome {
  user: User
  version: number
  /** False when nothing differed: no new version, no event. */
  changed: boolean
  /** The last-admin rule kept the admin role a `keep` change would have taken. */
  keptLastAdmin: boolean
}

function userNotFound (id: string): AppError {
  return new AppError('user_not_found', 404, `No user has the id ${id}.`)
}

/**
 * Only an admin credential may change an admin account: the role is the key
 * to every other account, so a `users:write` or `scim` key (an identity
 * provider's) that could rename, re-group, re-address, disable or delete an
 * admin could take over or lock out the service's administration. One rule
 * for every door (REST, SCIM, console, CLI over HTTP), as every door changes
 * users through this file; one's own account is one's own.
 */
export function assertMayChangeAccount (ctx: RequestContext, target: Pick<UserRow, 'id' | 'role' | 'username'>): void {
  const credential = ctx.credential
  if (credential === undefined || credential.admin || target.role !== 'admin') return
  if (target.id === credential.userId || (ctx.actorType === 'user' && ctx.actorId === target.id)) return
  throw new AppError('forbidden', 403, `Only an admin may change an admin account; ${target.username} is an admin.`)
}

function assertNotLastAdmin (enabledAdminIds: string[], leavingId: string): void {
  if (!enabledAdminIds.some(adminId => adminId !== leavingId)) {
    throw new AppError('last_admin', 409, 'This is the last enabled admin; make another user an admin first.')
  }
}

/**
 * Changes a user: one new version and one `user.updated` event with
 * `{field: {from, to}}` for what differs. Disabling the user also revokes its
 * API keys and ends its sessions; a new password does the same (whoever knew
 * the old one may hold either), each with its own event, all in this
 * transaction.
 */
export async function changeUserRecorded (trx: Db, ctx: RequestContext, id: string, changes: UserChanges, options: ChangeOptions): Promise<ChangeOutcome> {
  const mayRemoveAdmin = (changes.role !== undefined && changes.role !== 'admin') || changes.disabled === true
  // Lock order is always: the admin set, then the target row. Taking them
  // the other way round deadlocks against a concurrent delete of another admin.
  // The admin set is locked only for a user who is an enabled admin when first
  // read: every OIDC or LDAP sign-in of a mapped user passes role 'user', and
  // must not queue behind every other sign-in on the admins' rows.
  const isEnabledAdmin = (row: UserRow | undefined): boolean => row !== undefined && row.role === 'admin' && !toBool(row.disabled)
  let admins = mayRemoveAdmin && isEnabledAdmin(await findUserById(trx, id)) ? await lockEnabledAdminIds(trx) : undefined
  const current = await findUserById(trx, id, { forUpdate: true })
  if (current === undefined) throw userNotFound(id)
  // Made an admin between the two reads (rare): the rule still needs the admin set.
  if (mayRemoveAdmin && admins === undefined && isEnabledAdmin(current)) admins = await lockEnabledAdminIds(trx)
  options.check?.(current)
  const old = toUser(current)
  let keptLastAdmin = false
  let role = changes.role
  const stopsBeingAdmin = old.role === 'admin' && !old.disabled && ((role !== undefined && role !== 'admin') || changes.disabled === true)
  // Who may ask is answered before what the change would leave (403 before 409).
  if (stopsBeingAdmin && options.consequence !== true) assertMayChangeAccount(ctx, current)
  if (stopsBeingAdmin && !(admins ?? []).some(adminId => adminId !== id)) {
    if (options.lastAdmin === 'refuse' || changes.disabled === true) assertNotLastAdmin(admins ?? [], id)
    role = 'admin'
    keptLastAdmin = true
  }

  const now = nowIso()
  const update: UserRowUpdate = { version: current.version + 1, updated_at: now }
  const diff: Record<string, unknown> = {}
  const note = (field: keyof User, to: unknown): boolean => {
    if (JSON.stringify(old[field]) === JSON.stringify(to)) return false
    diff[field] = { from: old[field], to }
    return true
  }
  if (changes.username !== undefined && note('username', changes.username)) {
    update.username = changes.username
    update.username_key = changes.username.toLowerCase()
  }
  if (changes.email !== undefined && note('email', changes.email)) {
    update.email = changes.email
    update.email_key = changes.email?.toLowerCase() ?? null
  }
  // A new address is unverified until its own confirmation says otherwise.
  const emailVerified = changes.email_verified ?? (update.email !== undefined ? false : undefined)
  if (emailVerified !== undefined && note('email_verified', emailVerified)) update.email_verified = emailVerified
  // A password set for a user still invited (by an admin, or by accepting) ends the invitation.
  const invitationPending = changes.invitation_pending ?? (changes.password_hash !== undefined && old.invitation_pending ? false : undefined)
  if (invitationPending !== undefined && note('invitation_pending', invitationPending)) update.invitation_pending = invitationPending
  if (changes.first_name !== undefined && note('first_name', changes.first_name)) update.first_name = changes.first_name
  if (changes.last_name !== undefined && note('last_name', changes.last_name)) update.last_name = changes.last_name
  if (role !== undefined && note('role', role)) update.role = role
  const groups = changes.groups !== undefined ? spelledGroups(changes.groups, await storedGroupSpellings(trx, changes.groups)) : undefined
  if (groups !== undefined && note('groups', groups)) update.groups = JSON.stringify(groups)
  if (changes.disabled !== undefined && note('disabled', changes.disabled)) update.disabled = changes.disabled
  if (changes.password_sign_in !== undefined && note('password_sign_in', changes.password_sign_in)) update.password_sign_in = changes.password_sign_in
  const oldScim = scimFieldsOf(current)
  for (const field of SCIM_FIELDS) {
    const to = changes[field]
    if (to === undefined) continue
    const from = oldScim[field] ?? null
    if (sortedJson(from) === sortedJson(to)) continue
    diff[field] = { from, to }
    if (field === 'scim_emails') update.scim_emails = to === null ? null : JSON.stringify(to)
    else update[field] = to as string | null
  }
  if (options.provisioning === true && Object.keys(diff).length > 0) update.provisioned_at = now
  if (changes.password_hash !== undefined) {
    update.password_hash = changes.password_hash
    update.password_changed_at = now
    diff.password = REDACTED
  }

  // A change that changes nothing records nothing, whoever asked; a sign-in notes a kept role on its own event.
  if (Object.keys(diff).length === 0) return { user: old, version: current.version, changed: false, keptLastAdmin }
  if (options.consequence !== true) assertMayChangeAccount(ctx, current)
  const updated = await updateUser(trx, id, current.version, update)
  if (updated === undefined) throw new AppError('precondition_failed', 412, 'The user changed while this request was applied; read it again and retry.')
  await recordEvent(trx, ctx, 'user.updated', { type: 'user', id }, { changes: diff, ...options.extra, ...(keptLastAdmin ? { role_kept: 'last_admin' } : {}) })
  if (diff.groups !== undefined) await syncMemberships(trx, ctx, id, groups!, options.recordGroupEvents ?? true)
  if (old.invitation_pending && update.invitation_pending === false) await endLiveTokens(trx, id, 'invitation', changes.password_hash !== undefined ? 'password_set' : 'revoked')
  if (update.email !== undefined) await endLiveTokens(trx, id, 'email_verification', 'replaced')
  // A reset link mailed before a new password was set must not undo it.
  if (changes.password_hash !== undefined) await endLiveTokens(trx, id, 'password_reset', 'password_changed')
  if (changes.disabled === true && !old.disabled) {
    await revokeKeysRecorded(trx, ctx, id, 'user_disabled')
    await endSessionsRecorded(trx, ctx, id, 'user_disabled')
  } else if (changes.password_hash !== undefined) {
    await revokeKeysRecorded(trx, ctx, id, 'password_changed')
    await endSessionsRecorded(trx, ctx, id, 'password_changed')
  }
  return { user: toUser(updated), version: updated.version, changed: true, keptLastAdmin }
}

/**
 * A user's own new password (they gave the current one, whose stored hash is
 * `checkedHash`): the row, a `user.password_changed` event, their other
 * sessions ended and their API keys revoked, in this transaction. Refused
 * with 401 when the password is no longer the one checked: a change
 * meanwhile (an admin's, after a compromise) ended this session and wins.
 */
export async function changeOwnPasswordRecorded (
  trx: Db, ctx: RequestContext, user: { id: string, checkedHash: string }, passwordHash: string, keepSessionId: string
): Promise<void> {
  const at = nowIso()
  const changed = await trx.updateTable('users')
    .set({ password_hash: passwordHash, password_changed_at: at, updated_at: at, version: sql<number>`version + 1` })
    .where('id', '=', user.id).where('password_hash', '=', user.checkedHash)
    .executeTakeFirst()
  if (changed.numUpdatedRows === 0n) {
    throw new AppError('invalid_credentials', 401, 'The password was changed while this request was applied; sign in again with the new one.')
  }
  await recordEvent(trx, ctx, 'user.password_changed', { type: 'user', id: user.id }, { by: 'self', password: REDACTED })
  await endLiveTokens(trx, user.id, 'password_reset', 'password_changed')
  await endSessionsRecorded(trx, ctx, user.id, 'password_changed', keepSessionId)
  await revokeKeysRecorded(trx, ctx, user.id, 'password_changed')
}

/**
 * The same password stored again under the current hashing parameters,
 * while a sign-in has it at hand. Not a change of the user: no version, no
 * event of its own (the sign-in's event says `password_rehashed`), nothing ended.
 */
export async function storeRehashedPassword (trx: Db, id: string, passwordHash: string): Promise<void> {
  await trx.updateTable('users').set({ password_hash: passwordHash }).where('id', '=', id).execute()
}

/**
 * Deletes a user: its API keys revoked and its sessions ended, each with an
 * event, then the row and a `user.deleted` event. Factors, identities and
 * sign-in addresses go with the row (foreign keys, ON DELETE CASCADE); the
 * record of what ended stays in the event log.
 */
export async function deleteUserRecorded (trx: Db, ctx: RequestContext, id: string, options: { check?: (current: UserRow) => void } = {}): Promise<void> {
  const admins = await lockEnabledAdminIds(trx)
  const current = await findUserById(trx, id, { forUpdate: true })
  if (current === undefined) throw userNotFound(id)
  options.check?.(current)
  assertMayChangeAccount(ctx, current)
  if (current.role === 'admin' && !toBool(current.disabled)) assertNotLastAdmin(admins, id)
  await revokeKeysRecorded(trx, ctx, id, 'user_deleted')
  await endSessionsRecorded(trx, ctx, id, 'user_deleted')
  // Their reports lose their manager as any change is made: a new version and a
  // `user.updated` each, so a SCIM client's ETag of a report sees the change.
  for (const reportId of await listReportIds(trx, id)) {
    await changeUserRecorded(trx, ctx, reportId, { manager_id: null }, { lastAdmin: 'refuse', consequence: true, extra: { reason: 'manager_deleted' } })
  }
  const groupIds = await listGroupIdsOfUser(trx, id)
  // The memberships go with the row (ON DELETE CASCADE).
  await deleteUser(trx, id)
  await recordEvent(trx, ctx, 'user.deleted', { type: 'user', id }, { username: current.username, email: current.email, role: current.role })
  await recordMembershipChanges(trx, ctx, 'group.members_removed', new Map(groupIds.map(groupId => [groupId, [id]])), { reason: 'user_deleted' })
}
