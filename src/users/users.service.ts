import { toBool, toIso, transactionRetried, type Db } from '../db/database.ts'
import { AppError, type ErrorCode, type FieldError } from '../errors.ts'
import { isAdmin, type Principal, type RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { nowIso } from '../lib/ids.ts'
import { decodeCursor, encodeCursor } from '../lib/paging.ts'
import { checkImportedHash, type ImportedHashScheme, type PasswordHasher } from '../lib/passwords.ts'
import { checkPasswordPolicy, passwordViolation, type PasswordOwner, type PasswordPolicy } from '../lib/password-policy.ts'
import { endSessionsRecorded } from '../sessions/sessions.repository.ts'
import {
  clearSignInLock,
  toUser,
  findPublicUserById,
  findSignInState,
  findTakenKeys,
  findUserById,
  listUsers,
  type UserPage,
  readChangeStamp,
  type NewUserRow,
  type UserFilter,
  type UserRow
} from './users.repository.ts'
import type { Sort, User, UserCreate, UserImport, UserImportItemResult, UserPatch } from './users.schemas.ts'
import { PageCache } from './page-cache.ts'
import type { Config } from '../config.ts'
import { endLiveTokens } from '../tokens/tokens.repository.ts'
import { issueAndMailToken, type LinkConfig } from '../tokens/token-mail.ts'
import { prepareCode } from '../tokens/token-codes.ts'
import type { PreparedCode } from '../tokens/tokens.repository.ts'
import { assertMayChangeAccount, changeUserRecorded, createUserRecorded, createUsersRecorded, deleteUserRecorded, newUserRow } from './users.lifecycle.ts'

export interface UsersDeps {
  db: Db
  passwords: PasswordHasher
  passwordPolicy: PasswordPolicy
  /** What invitations need (their lifetime, where their links point); the doors that invite pass it. */
  invitations?: InvitationSettings
  /** The instance's page cache (app.ts); without it every page is read from the database. */
  pages?: PageCache
}

export type InvitationSettings = Pick<Config, 'invitationLifetimeMs'> & LinkConfig

/** An invitation just issued: mailed, or (without SMTP) its link and code for the administrator to hand over. */
export interface IssuedInvitation {
  /** Queued in the outbox (SMTP configured), or not sent at all. */
  delivery: 'queued' | 'not_sent'
  mailed: boolean
  expires_at: string
  url?: string
  code?: string
}

/** A user plus the version its ETag is made from. */
export interface VersionedUser { user: User, version: number }

export function etagOf (version: number): string {
  return `"${version}"`
}

/** RFC 9110 If-Match: `*` or a list of strong tags; weak tags never match. */
function assertIfMatch (ifMatch: string | undefined, version: number): void {
  if (ifMatch === undefined) return
  const current = etagOf(version)
  const tags = ifMatch.split(',').map(t => t.trim())
  if (!tags.includes('*') && !tags.includes(current)) {
    throw new AppError('precondition_failed', 412, 'The user changed since you read it (If-Match does not match the current ETag); read it again and retry.')
  }
}

function userNotFound (id: string): AppError {
  return new AppError('user_not_found', 404, `No user has the id ${id}.`)
}

/** What signed-in users may change about themselves; the rest (role, groups, disabled, username, password) is an admin's. */
const SELF_EDITABLE = new Set(['email', 'first_name', 'last_name'])

/** A non-admin editing their own profile: only the self-editable fields, and the row stays as it is otherwise. */
function assertSelfEdit (principal: Principal, targetId: string, patch: UserPatch): boolean {
  if (isAdmin(principal) || principal.userId !== targetId || principal.scopes.has('users:write')) return false
  const denied = Object.keys(patch).filter(field => !SELF_EDITABLE.has(field))
  if (denied.length > 0) {
    throw new AppError('forbidden', 403, `You may change your own ${[...SELF_EDITABLE].join(', ')}; ${denied.join(', ')} ${denied.length === 1 ? 'is' : 'are'} for an admin (your password: PUT /api/me/password).`, {
      errors: denied.map(field => ({ in: 'body', pointer: `/${field}`, detail: 'only an admin may change this' }))
    })
  }
  return true
}

/** Only admins grant or hold admin powers: a `users:write` credential cannot create, edit or remove an admin. */
/** Roles are set by admins only; who may change an admin account is the lifecycle's rule (assertMayChangeAccount). */
function assertMaySetRole (principal: Principal, wantsRole: string | undefined): void {
  if (wantsRole !== undefined && !isAdmin(principal)) {
    throw new AppError('forbidden', 403, 'Only an admin may set roles.')
  }
}

export async function createUser (deps: UsersDeps, principal: Principal, ctx: RequestContext, input: UserCreate): Promise<VersionedUser & { invitation?: IssuedInvitation }> {
  assertMaySetRole(principal, input.role)
  const { invite, ...fields } = input
  if (invite === true && input.password !== undefined) {
    throw new AppError('validation_failed', 422, 'An invited user sets their own password: send invite or password, not both.', {
      errors: [{ in: 'body', pointer: '/password', detail: 'not with invite: true' }]
    })
  }
  const passwordHash = input.password !== undefined ? await hashChecked(deps, input.password, { username: input.username, emails: [input.email] }) : null
  const code = invite === true ? await prepareCode(deps.passwords) : undefined
  return await deps.db.transaction().execute(async trx => {
    const row = await createUserRecorded(trx, ctx, newUserRow({ ...fields, invitation_pending: invite === true }, passwordHash, passwordHash !== null, nowIso()), invite === true ? { invited: true } : {})
    const invitation = code !== undefined ? await issueInvitation(trx, ctx, invitationSettings(deps), row, false, code) : undefined
    return { user: toUser(row), version: row.version, ...(invitation !== undefined ? { invitation } : {}) }
  })
}

function invitationSettings (deps: UsersDeps): InvitationSettings {
  if (deps.invitations === undefined) throw new Error('this door does not invite: UsersDeps.invitations is not set')
  return deps.invitations
}

/**
 * A new invitation link and code for a pending user, in the caller's
 * transaction: the earlier one stops working, and `user.invited` records it.
 * Without SMTP the link and code are returned for the administrator to hand
 * over; they are never stored or logged.
 */
async function issueInvitation (trx: Db, ctx: RequestContext, settings: InvitationSettings, user: { id: string, username: string, email: string | null }, resent: boolean, prepared: PreparedCode): Promise<IssuedInvitation> {
  const { url, code, expiresAt, mailed } = await issueAndMailToken(trx, settings, { userId: user.id, username: user.username, purpose: 'invitation', to: user.email, lifetimeMs: settings.invitationLifetimeMs, code: prepared })
  await recordEvent(trx, ctx, 'user.invited', { type: 'user', id: user.id }, { expires_at: expiresAt, mailed, ...(resent ? { resent: true } : {}) })
  return { delivery: mailed ? 'queued' : 'not_sent', mailed, expires_at: expiresAt, ...(mailed ? {} : { url, code }) }
}

/** A pending user's current row, for an invitation operation; 409 when the user is not (or no longer) invited. */
function assertInvitationPending (current: UserRow | undefined, id: string): UserRow {
  if (current === undefined) throw userNotFound(id)
  if (!toBool(current.invitation_pending)) {
    throw new AppError('invitation_not_pending', 409, 'This user has no pending invitation: they accepted it, or were never invited (a user with a password signs in with it).')
  }
  return current
}

/**
 * Sends the invitation again with a new link and code (the earlier ones stop
 * working), or invites an existing user who has no password yet and has not
 * signed in: they become pending.
 */
export async function inviteUser (deps: UsersDeps, principal: Principal, ctx: RequestContext, id: string): Promise<IssuedInvitation> {
  const settings = invitationSettings(deps)
  const code = await prepareCode(deps.passwords)
  return await deps.db.transaction().execute(async trx => {
    let current = await findUserById(trx, id, { forUpdate: true })
    if (current === undefined) throw userNotFound(id)
    assertMayChangeAccount(ctx, current)
    if (toBool(current.disabled)) throw new AppError('conflict', 409, 'This user is disabled, and could not accept an invitation; enable them first.')
    const resent = toBool(current.invitation_pending)
    if (!resent) {
      if (current.password_hash !== null || current.last_login_at !== null) {
        throw new AppError('invitation_not_pending', 409, 'This user already has a password or has signed in; an invitation is for someone who has neither (use a password reset instead).')
      }
      await changeUserRecorded(trx, ctx, id, { invitation_pending: true }, { lastAdmin: 'refuse' })
      current = await findUserById(trx, id)
    }
    return await issueInvitation(trx, ctx, settings, assertInvitationPending(current, id), resent, code)
  })
}

/** Ends the pending invitation's link and code; the user stays pending (resend, or delete them). */
export async function revokeInvitation (deps: Pick<UsersDeps, 'db'>, principal: Principal, ctx: RequestContext, id: string): Promise<void> {
  await deps.db.transaction().execute(async trx => {
    const current = assertInvitationPending(await findUserById(trx, id, { forUpdate: true }), id)
    assertMayChangeAccount(ctx, current)
    const ended = await endLiveTokens(trx, id, 'invitation', 'revoked')
    await recordEvent(trx, ctx, 'user.invitation_revoked', { type: 'user', id }, { links_ended: ended })
  })
}

export async function getUser (deps: Pick<UsersDeps, 'db'>, id: string): Promise<VersionedUser> {
  const row = await findPublicUserById(deps.db, id)
  if (row === undefined) throw userNotFound(id)
  return { user: toUser(row), version: row.version }
}

/** A page of users, and the cursor of the next page if any. */
export interface UsersPage { users: User[], nextCursor: string | undefined }

/**
 * A page as listUsers reads it, served from the page cache while the
 * database's change stamp is the one it was read under (see page-cache.ts
 * for why that is never staler than a fresh read, on either engine and across
 * instances).
 */
async function cachedPage (db: Db, cache: PageCache | undefined, filter: UserFilter, sort: Sort, limit: number, after: [string, string] | undefined): Promise<UserPage> {
  if (cache === undefined || cache.resting()) return await listUsers(db, filter, sort, limit, after)
  const stamp = await readChangeStamp(db)
  // Every input of the page, filters in name order whatever the order of the query string.
  const filters = Object.entries(filter).filter(([, value]) => value !== undefined).sort(([a], [b]) => a < b ? -1 : 1)
  const key = JSON.stringify([sort, limit, after, filters])
  const cached = cache.get(key, stamp)
  if (cached !== undefined) return cached
  const page = await listUsers(db, filter, sort, limit, after)
  cache.set(key, stamp, page)
  return page
}

export async function listUsersPage (deps: UsersDeps, filter: UserFilter, sort: Sort, limit: number, cursor: string | undefined): Promise<UsersPage> {
  // Keyset position: [sort value, id]; username sorts by its case-folded text, the others by a timestamp.
  const after = cursor !== undefined ? decodeCursor(cursor, sort, [sort.endsWith('username') ? 'text' : 'timestamp', 'uuid']) as [string, string] : undefined
  const page = await cachedPage(deps.db, deps.pages, filter, sort, limit, after)
  return { users: page.users, nextCursor: page.next !== undefined ? encodeCursor(sort, page.next) : undefined }
}

/**
 * Every matching user, a batch at a time. Batches follow the same keyset as
 * pages, so no database connection or lock is held while a slow client
 * reads, and memory stays at one batch however many users exist. The first
 * batch is read before this returns: a database that is down then still gets
 * a 503, not a 200 cut off mid-body (with credentials cached, the database
 * may not be asked before this).
 */
export async function streamUsers (deps: UsersDeps, filter: UserFilter, sort: Sort, batchSize = 500): Promise<AsyncGenerator<User[]>> {
  const first = await listUsers(deps.db, filter, sort, batchSize, undefined)
  return (async function * () {
    let page = first
    for (;;) {
      if (page.users.length > 0) yield page.users
      if (page.next === undefined) return
      page = await listUsers(deps.db, filter, sort, batchSize, page.next)
    }
  })()
}

export async function updateUserById (deps: UsersDeps, principal: Principal, ctx: RequestContext, id: string, patch: UserPatch, ifMatch: string | undefined): Promise<VersionedUser> {
  // Read first so the password can be checked against the right username and
  // hashed before the transaction: a 9 ms hash must not hold a write lock.
  const before = await findUserById(deps.db, id)
  if (before === undefined) throw userNotFound(id)
  if (assertSelfEdit(principal, id, patch)) {
    // One's own new address takes effect when it confirms (docs/email.md#e-mail-verification-and-change).
    if (patch.email != null && patch.email.toLowerCase() !== before.email_key) {
      throw new AppError('forbidden', 403, 'A new address of your own takes effect once confirmed: POST /api/me/email with it, and follow the link mailed there.', {
        errors: [{ in: 'body', pointer: '/email', detail: 'confirm a new address through POST /api/me/email' }]
      })
    }
  } else {
    assertMaySetRole(principal, patch.role)
  }
  assertIfMatch(ifMatch, before.version)
  const passwordHash = patch.password !== undefined
    ? await hashChecked(deps, patch.password, { username: patch.username ?? before.username, emails: [patch.email !== undefined ? patch.email : before.email] })
    : undefined

  const { password: _password, ...fields } = patch
  // A change of groups locks the groups too (users.lifecycle.ts): retried should it meet a group's change in a deadlock.
  return await transactionRetried(deps.db, async trx => {
    const outcome = await changeUserRecorded(trx, ctx, id, { ...fields, password_hash: passwordHash }, {
      lastAdmin: 'refuse',
      check: current => { assertIfMatch(ifMatch, current.version) }
    })
    return { user: outcome.user, version: outcome.version }
  })
}

export async function deleteUserById (deps: UsersDeps, principal: Principal, ctx: RequestContext, id: string, ifMatch: string | undefined): Promise<void> {
  await deps.db.transaction().execute(async trx => {
    await deleteUserRecorded(trx, ctx, id, {
      check: current => { assertIfMatch(ifMatch, current.version) }
    })
  })
}

/**
 * The password rules a create or update body breaks, as field errors: asked
 * when the body does not match its schema, so the one 422 lists these too
 * (docs/errors.md: all problems of a request are reported at once). A body
 * that matches goes on to hashChecked, which applies the same rules.
 */
export function passwordRuleErrors (body: unknown, policy: PasswordPolicy): FieldError[] {
  const { password, username, email } = (typeof body === 'object' && body !== null ? body : {}) as Record<string, unknown>
  if (typeof password !== 'string') return []
  return passwordViolation(password, { username: typeof username === 'string' ? username : undefined, emails: [typeof email === 'string' ? email : undefined] }, policy)?.errors ?? []
}

async function hashChecked (deps: UsersDeps, password: string, owner: PasswordOwner): Promise<string> {
  checkPasswordPolicy(password, owner, deps.passwordPolicy)
  return await deps.passwords.hash(password)
}

export interface ImportOutcome {
  /** 200 when applied; 422 when an atomic import failed on some item and created nothing. */
  status: 200 | 422
  atomic: boolean
  created: number
  failed: number
  results: UserImportItemResult[]
}

interface ImportPlan {
  index: number
  result: UserImportItemResult
  row?: NewUserRow
  password?: string
  scheme?: ImportedHashScheme
}

/**
 * Creates a batch of users, some with existing password hashes (admins only).
 * Every item is checked first, cheaply: hash formats and bounds are parsed,
 * never computed; the password rules, and uniqueness within the batch and
 * against existing users. An atomic import with any failure stops there,
 * before hashing anything. Plaintext passwords are then hashed (at most as
 * many at once as the hasher runs), and the users and their `user.created`
 * events are written in one transaction.
 */
export async function importUsers (deps: UsersDeps, principal: Principal, ctx: RequestContext, input: UserImport): Promise<ImportOutcome> {
  if (!isAdmin(principal)) throw new AppError('forbidden', 403, 'Importing users is for admins.')
  const atomic = input.atomic ?? true
  const now = nowIso()
  const fail = (plan: ImportPlan, code: ErrorCode, detail: string): void => {
    plan.result.status = 'error'
    plan.result.code = code
    plan.result.detail = detail
    delete plan.row
    delete plan.password
  }
  const seenNames = new Map<string, number>()
  const seenEmails = new Map<string, number>()
  const plans: ImportPlan[] = input.users.map((item, index) => {
    const plan: ImportPlan = { index, result: { index, username: item.username, status: 'not_created' } }
    const usernameKey = item.username.toLowerCase()
    const email = item.email ?? null
    const emailKey = email?.toLowerCase() ?? null
    let passwordHash: string | null = null
    if (item.password !== undefined && item.password_hash !== undefined) {
      fail(plan, 'validation_failed', 'Give password or password_hash, not both.')
      return plan
    }
    if (item.password_hash !== undefined) {
      const checked = checkImportedHash(item.password_hash)
      if (!checked.ok) {
        fail(plan, checked.code, checked.detail)
        return plan
      }
      passwordHash = item.password_hash
      plan.scheme = checked.scheme
    } else if (item.password !== undefined) {
      try {
        checkPasswordPolicy(item.password, { username: item.username, emails: [item.email] }, deps.passwordPolicy)
      } catch (error) {
        if (!(error instanceof AppError)) throw error
        fail(plan, error.code, error.detail)
        return plan
      }
      plan.password = item.password
    }
    const sameName = seenNames.get(usernameKey)
    const sameEmail = emailKey !== null ? seenEmails.get(emailKey) : undefined
    if (!seenNames.has(usernameKey)) seenNames.set(usernameKey, index)
    if (emailKey !== null && !seenEmails.has(emailKey)) seenEmails.set(emailKey, index)
    if (sameName !== undefined) {
      fail(plan, 'username_taken', `The username repeats item ${sameName} of this import (usernames are unique ignoring case).`)
      return plan
    }
    if (sameEmail !== undefined) {
      fail(plan, 'email_taken', `The email repeats item ${sameEmail} of this import (addresses are unique ignoring case).`)
      return plan
    }
    plan.row = newUserRow(item, passwordHash, passwordHash !== null || plan.password !== undefined, now)
    return plan
  })

  const checkTaken = async (db: Db): Promise<void> => {
    const pending = plans.filter(p => p.row !== undefined)
    const taken = await findTakenKeys(db, pending.map(p => p.row!.username_key), pending.flatMap(p => p.row!.email_key ?? []))
    for (const plan of pending) {
      if (taken.usernames.has(plan.row!.username_key)) fail(plan, 'username_taken', 'A user with that username already exists (usernames are unique ignoring case).')
      else if (plan.row!.email_key !== null && taken.emails.has(plan.row!.email_key)) fail(plan, 'email_taken', 'A user with that email address already exists (addresses are unique ignoring case).')
    }
  }
  const outcome = (status: 200 | 422): ImportOutcome => {
    const results = plans.map(p => p.result)
    return { status, atomic, created: results.filter(r => r.status === 'created').length, failed: results.filter(r => r.status === 'error').length, results }
  }
  const anyFailed = (): boolean => plans.some(p => p.result.status === 'error')

  // Checked before hashing, so a batch that fails costs no hashing; checked again below, in the transaction.
  await checkTaken(deps.db)
  if (atomic && anyFailed()) return outcome(422)

  const toHash = plans.filter(p => p.row !== undefined && p.password !== undefined)
  let next = 0
  await Promise.all(Array.from({ length: Math.min(deps.passwords.concurrency, toHash.length) }, async () => {
    while (next < toHash.length) {
      const plan = toHash[next++]!
      plan.row!.password_hash = await deps.passwords.hash(plan.password!)
      delete plan.password
    }
  }))

  await deps.db.transaction().execute(async trx => {
    await checkTaken(trx)
    if (atomic && anyFailed()) return
    const creating = plans.filter(p => p.row !== undefined)
    await createUsersRecorded(trx, ctx, creating.map(plan => ({ row: plan.row!, extra: plan.scheme !== undefined ? { imported_hash_scheme: plan.scheme } : {} })))
    for (const plan of creating) {
      plan.result.status = 'created'
      plan.result.id = plan.row!.id
    }
  })
  return outcome(atomic && anyFailed() ? 422 : 200)
}

/** Whether sign-in is locked for unknown clients, and the count toward the lock (docs/security.md "Account locking"). */
export interface SignInState { failedLogins: number, lockedUntil: string | null }

export async function getSignInState (deps: Pick<UsersDeps, 'db'>, id: string): Promise<SignInState> {
  const row = await findSignInState(deps.db, id)
  if (row === undefined) throw userNotFound(id)
  const lockedUntil = toIso(row.locked_until)
  // A lock whose time is up is no lock: the next failure starts the count afresh.
  return { failedLogins: row.failed_logins, lockedUntil: lockedUntil !== null && Date.parse(lockedUntil) > Date.now() ? lockedUntil : null }
}

/**
 * An admin lifts the sign-in lock early and sets the failure count back to 0,
 * with a `user.unlocked` event. Resetting an account that has nothing to reset
 * changes nothing and records nothing. Returns what was cleared.
 */
export async function unlockUser (deps: Pick<UsersDeps, 'db'>, principal: Principal, ctx: RequestContext, id: string): Promise<SignInState | undefined> {
  if (!isAdmin(principal)) throw new AppError('forbidden', 403, 'Resetting a sign-in lock is for admins.')
  return await deps.db.transaction().execute(async trx => {
    if (await findPublicUserById(trx, id) === undefined) throw userNotFound(id)
    const cleared = await clearSignInLock(trx, id)
    if (cleared === undefined) return undefined
    const state = { failedLogins: cleared.failed_logins, lockedUntil: toIso(cleared.locked_until) }
    await recordEvent(trx, ctx, 'user.unlocked', { type: 'user', id }, { failed_logins: state.failedLogins, locked_until: state.lockedUntil })
    return state
  })
}

/** An admin ends every session of a user (each with a `session.ended` event, reason `ended_by_admin`); API keys stay. */
export async function endUserSessions (deps: Pick<UsersDeps, 'db'>, principal: Principal, ctx: RequestContext, id: string): Promise<number> {
  if (!isAdmin(principal)) throw new AppError('forbidden', 403, 'Ending another user\'s sessions is for admins.')
  return await deps.db.transaction().execute(async trx => {
    if (await findPublicUserById(trx, id) === undefined) throw userNotFound(id)
    return await endSessionsRecorded(trx, ctx, id, 'ended_by_admin')
  })
}
