import { toBool, type Db } from '../db/database.ts'
import { AppError } from '../errors.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { userAgentData } from '../lib/user-agent.ts'
import { findIdentity, findIdentityOfUser, insertIdentity, touchIdentity } from '../sso/identities.repository.ts'
import { normaliseDn, type LdapConfig } from '../sso/ldap.config.ts'
import { checkWithDirectory, LDAP_PROVIDER, mappedAccess, type DirectoryUser, type ProvisionRefusal } from '../sso/ldap.service.ts'
import { openSignInChallenge, secondFactorNeeded, type MfaPending } from '../mfa/mfa.service.ts'
import { isDeviceOf } from '../sessions/device-trust.ts'
import { countFailedSignIn, findUsersBySignInKey, hasSignedInFrom, lockAccount } from '../sessions/sessions.repository.ts'
import { invalidCredentials, openSession } from '../sessions/sessions.service.ts'
import { reserveSignInAttempt, signInKey, throttleBudgets } from '../sessions/throttle.ts'
import type { SessionsDeps, SignIn, SignInContext, SignInOpening } from '../sessions/sessions.types.ts'
import { findPasswordHashForUpdate, findTakenKeys, findUserById } from '../users/users.repository.ts'
import { createUserRecorded, changeUserRecorded, newUserRow } from '../users/users.lifecycle.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'

/*
 * Signing in with a password: a flow above the sessions, factors, users and
 * directory features (docs/architecture.md). It checks the password, here or
 * against the directory, applies throttling and the account lock, makes the
 * directory's user through the user lifecycle, and ends in a session or in a
 * challenge for the second factor.
 */

/** A password sign-in ends in a session, or, for a user with (or owing) a second factor, in a challenge for it. */
export type SignInResult = ({ kind: 'session' } & SignIn) | ({ kind: 'mfa' } & MfaPending)

function passwordSignInDisabled (everyone: boolean): AppError {
  return new AppError('password_sign_in_disabled', 403, everyone
    ? 'Sign-in with a password is turned off here; use single sign-on or a passkey.'
    : 'Sign-in with a password is turned off for this account; use single sign-on or a passkey.')
}

export type FailureReason = 'unknown_user' | 'wrong_password' | 'no_password' | 'disabled' | 'locked' |
  'password_sign_in_disabled' | 'directory_no_entry' | 'directory_ambiguous' | 'identity_conflict' | 'password_changed' | ProvisionRefusal

/** The password that was checked is no longer the user's: it was changed while the check ran. */
class PasswordChangedMeanwhile extends Error {}

/**
 * Runs first in the transaction that opens the session (or the second step):
 * the password checked, minutes of argon2 queue ago at worst, must still be
 * the user's. A change meanwhile (an admin, a reset link, the user elsewhere)
 * ended every session and wrote its own hash; without this the sign-in would
 * open a session after that, and its re-made hash of the old password would
 * put that password back. On PostgreSQL the row stays locked until this
 * transaction ends, so a change waits and then ends this session too.
 */
function stillTheirPassword (userId: string, checkedHash: string): (trx: Db) => Promise<void> {
  return async (trx) => {
    const row = await findPasswordHashForUpdate(trx, userId)
    if (row?.password_hash !== checkedHash) throw new PasswordChangedMeanwhile()
  }
}

type UserRow = Awaited<ReturnType<typeof findUsersBySignInKey>>[number]

/** What checking the credentials found, before the account's own state (disabled, locked) is looked at. */
interface CredentialCheck {
  user: UserRow | undefined
  valid: boolean
  /** A failure the check itself decided (no directory entry, no JIT, …). */
  reason?: FailureReason
  /** The directory's entry, when the directory accepted the password. */
  entry?: DirectoryUser
}

/**
 * A known client of this account: a browser holding its device token, or an
 * address it signed in from before, within LOGIN_KNOWN_CLIENT_DAYS. Known
 * clients are not shut out by the account lock, so strangers guessing cannot
 * lock the owner out; their failures are still throttled.
 */
async function isKnownClient (deps: SessionsDeps, ctx: SignInContext, userId: string, now: Date): Promise<boolean> {
  const days = deps.config.loginKnownClientDays
  if (days === 0) return false
  const maxAgeMs = days * 86_400_000
  if (isDeviceOf(await deps.deviceKey(), ctx.deviceToken, userId, maxAgeMs, now)) return true
  return ctx.clientIp !== null && await hasSignedInFrom(deps.db, userId, ctx.clientIp, new Date(now.getTime() - maxAgeMs).toISOString())
}

/**
 * Signs a user in by username or email, with a local password or, when LDAP
 * is configured, against the directory (docs/sso.md): a user linked to a
 * directory entry, and a name no local user has, are checked there; every
 * other local user with the local hash. Every failure, whatever its reason
 * and wherever the password was checked, runs one argon2 verification
 * (against a dummy hash when there is no real one) and answers the same 401,
 * so neither the answer nor its timing tells whether an account exists, is
 * disabled or is locked. The reason is kept in the `user.login_failed` event
 * for administrators. Local password sign-in turned off (PASSWORD_SIGN_IN,
 * or the user's `password_sign_in`) is said only once the password was right.
 */
export async function signIn (deps: SessionsDeps, ctx: SignInContext, identifier: string, password: string): Promise<SignInResult> {
  const ip = ctx.clientIp ?? 'unknown'
  const key = signInKey(identifier)
  const ldap = deps.config.ldap
  // Nothing a password could open here: the same answer for every name, before any lookup.
  if (!deps.config.passwordSignIn && ldap === undefined) throw passwordSignInDisabled(true)
  const candidates = await findUsersBySignInKey(deps.db, key)
  // A username match wins over someone else's email that happens to read the same.
  const local = candidates.find(u => u.username_key === key) ?? candidates[0]
  const viaDirectory = ldap !== undefined && (local === undefined || await findIdentityOfUser(deps.db, local.id, LDAP_PROVIDER) !== undefined)
  const account = local !== undefined ? `user:${local.id}` : `name:${key}`
  const budgets = throttleBudgets(deps, account, ip)
  await reserveSignInAttempt(deps, budgets, { ctx, account, target: local !== undefined ? { type: 'user', id: local.id } : null, identifier })
  let check: CredentialCheck
  try {
    check = viaDirectory ? await checkDirectory(deps, ldap!, ctx, local, identifier, password) : await checkLocal(deps, local, password)
  } catch (error) {
    // Not a failed guess (the hash queue was full, the directory is down): the unit goes back.
    await deps.failures.release(budgets.map(b => b.key))
    throw error
  }
  const { user, valid } = check
  const now = new Date()
  const locked = user?.locked_until != null && new Date(user.locked_until) > now
  // Only a lock or a failure to count needs to know; a plain success does not ask.
  const known = user !== undefined && (locked || !valid) && await isKnownClient(deps, ctx, user.id, now)
  const via = viaDirectory ? { via: LDAP_PROVIDER } : {}

  // A reason the check itself decided (no directory entry, no JIT, …) stands.
  let reason: FailureReason | undefined = check.reason
  if (reason === undefined) {
    if (user === undefined) reason = 'unknown_user'
    else if (!viaDirectory && user.password_hash === null) reason = 'no_password'
    else if (toBool(user.disabled)) reason = 'disabled'
    else if (locked && !known) reason = 'locked'
    else if (!valid) reason = 'wrong_password'
  }

  if (reason !== undefined) {
    await deps.db.transaction().execute(async trx => {
      // A known client's mistakes are throttled but do not count toward the lock it is exempt from.
      if (user !== undefined && reason === 'wrong_password' && !known) {
        const failed = await countFailedSignIn(trx, user.id, now.toISOString())
        if (failed === undefined) {
          // Locked by a concurrent attempt since this one read the account.
          reason = 'locked'
        } else if (failed >= deps.config.accountLockThreshold) {
          await lockAccount(trx, user.id, new Date(now.getTime() + deps.config.accountLockMs).toISOString())
          await recordEvent(trx, ctx, 'user.locked', { type: 'user', id: user.id }, { failed_logins: failed, locked_for_s: deps.config.accountLockMs / 1000 })
        }
      }
      await recordEvent(trx, ctx, 'user.login_failed', user !== undefined ? { type: 'user', id: user.id } : null, {
        reason, identifier: identifier.slice(0, 254), ...via, ...(known ? { known_client: true } : {}), ...userAgentData(ctx.userAgent)
      })
    })
    throw invalidCredentials()
  }

  // Not a failure: this attempt's unit goes back to the address, and the account starts afresh here.
  // A second factor still owed has a budget of its own (mfa.service.ts).
  const settle = async (): Promise<void> => {
    await Promise.all([deps.failures.reset(budgets[0]!.key), deps.failures.release([budgets[1]!.key])])
  }
  if (!viaDirectory && (!deps.config.passwordSignIn || !toBool(user!.password_sign_in))) {
    // The password was right, so saying why it cannot be used tells its owner, and only them, what to do.
    await recordEvent(deps.db, ctx, 'user.login_failed', { type: 'user', id: user!.id }, {
      reason: 'password_sign_in_disabled', identifier: identifier.slice(0, 254), ...(deps.config.passwordSignIn ? {} : { everyone: true }), ...userAgentData(ctx.userAgent)
    })
    await settle()
    throw passwordSignInDisabled(!deps.config.passwordSignIn)
  }

  let signingIn = user!
  let keptLastAdmin = false
  if (viaDirectory) {
    // The directory's groups decide the role before anything depends on it (MFA_REQUIRED=admins).
    keptLastAdmin = (await applyDirectoryAccess(deps.db, ctx, ldap!, signingIn.id, check.entry!)).keptLastAdmin
    signingIn = await findUserById(deps.db, signingIn.id) ?? signingIn
  }
  // Hashes made with weaker parameters than today's are replaced now, while the password is at hand.
  const rehash = !viaDirectory && deps.passwords.needsRehash(signingIn.password_hash!) ? await deps.passwords.hash(password) : undefined
  const opened: SignInOpening = { method: viaDirectory ? 'ldap' : 'password' }
  const within = viaDirectory ? undefined : stillTheirPassword(signingIn.id, signingIn.password_hash!)
  try {
    const secondFactor = await secondFactorNeeded(deps, signingIn)
    if (secondFactor !== undefined) {
      const pending = await openSignInChallenge(deps, ctx, signingIn, secondFactor, rehash, now, opened, within)
      await settle()
      return { kind: 'mfa', ...pending }
    }
    const signedIn = await openSession(deps, ctx, signingIn.id, {
      opened, locked, rehash, now, within, ...(viaDirectory ? { via: LDAP_PROVIDER } : {}), ...(keptLastAdmin ? { note: { role_kept: 'last_admin' } } : {})
    })
    await settle()
    return { kind: 'session', ...signedIn }
  } catch (error) {
    if (!(error instanceof PasswordChangedMeanwhile)) throw error
    // Not a guess: the password was right a moment ago. The attempt's unit goes back.
    await recordEvent(deps.db, ctx, 'user.login_failed', { type: 'user', id: signingIn.id }, {
      reason: 'password_changed' satisfies FailureReason, identifier: identifier.slice(0, 254), ...userAgentData(ctx.userAgent)
    })
    await deps.failures.release(budgets.map(b => b.key))
    throw invalidCredentials()
  }
}

async function checkLocal (deps: SessionsDeps, user: UserRow | undefined, password: string): Promise<CredentialCheck> {
  return { user, valid: await deps.passwords.verify(user?.password_hash ?? deps.dummyHash, password) }
}

/**
 * The directory's word on the password, and the gatehouse user it signs in
 * as. The dummy argon2 verification runs alongside, so a directory sign-in
 * costs what a local one does and timing does not tell local users apart.
 */
async function checkDirectory (
  deps: SessionsDeps, ldap: LdapConfig, ctx: SignInContext, local: UserRow | undefined, identifier: string, password: string
): Promise<CredentialCheck> {
  const [result] = await Promise.all([checkWithDirectory(ldap, identifier, password), deps.passwords.verify(deps.dummyHash, password)])
  if (result.kind === 'no_entry' || result.kind === 'ambiguous') {
    // A linked user the directory no longer lists (or no longer lets through the filter) is not a password guess.
    return { user: local, valid: false, reason: result.kind === 'ambiguous' ? 'directory_ambiguous' : local !== undefined ? 'directory_no_entry' : 'unknown_user' }
  }
  if (result.kind === 'wrong_password') {
    const linked = await findIdentity(deps.db, LDAP_PROVIDER, normaliseDn(result.dn))
    const user = linked !== undefined ? await findUserById(deps.db, linked.user_id) : local
    return { user, valid: false }
  }
  const resolved = await userForDirectoryEntry(deps.db, ctx, ldap, result.user)
  if ('refused' in resolved) return { user: undefined, valid: false, reason: resolved.refused }
  // The typed name is a local user linked to another entry than the one the directory found for it.
  if (local !== undefined && resolved.userId !== local.id) return { user: local, valid: false, reason: 'identity_conflict' }
  return { user: local ?? await findUserById(deps.db, resolved.userId), valid: true, entry: result.user }
}

/**
 * The gatehouse user a directory entry signs in as: the one its `ldap`
 * identity names, or, with LDAP_JIT, a new user made from the entry (no
 * local password) and linked to it, through the user lifecycle, with their
 * events in one transaction. Never linked by a matching username or email: a
 * directory entry must not take over a local account that happens to have
 * the same name.
 */
async function userForDirectoryEntry (
  db: Db, ctx: RequestContext, config: LdapConfig, entry: DirectoryUser
): Promise<{ userId: string } | { refused: ProvisionRefusal }> {
  const linked = await findIdentity(db, LDAP_PROVIDER, normaliseDn(entry.dn))
  if (linked !== undefined) return { userId: linked.user_id }
  if (!config.jit) return { refused: 'not_provisioned' }
  const username = entry.username
  if (username === undefined || !new RegExp(USERNAME_PATTERN).test(username)) return { refused: 'invalid_username' }
  const access = mappedAccess(config, entry.groupDns)
  const at = nowIso()
  try {
    return await db.transaction().execute(async trx => {
      const taken = await findTakenKeys(trx, [username.toLowerCase()], entry.email !== undefined ? [entry.email.toLowerCase()] : [])
      if (taken.usernames.size > 0) return { refused: 'username_taken' as const }
      const email = entry.email !== undefined && taken.emails.size === 0 && entry.email.length <= 254 ? entry.email : null
      const row = newUserRow({
        username,
        email,
        first_name: entry.firstName,
        last_name: entry.lastName,
        role: access.role ?? 'user',
        groups: access.groups ?? []
      }, null, false, at)
      // The person signing in is the actor, as at an OIDC provider's first sign-in.
      const userCtx: RequestContext = { ...ctx, actorType: 'user', actorId: row.id }
      const user = await createUserRecorded(trx, userCtx, row, { source: LDAP_PROVIDER })
      const identityId = newId()
      await insertIdentity(trx, { id: identityId, user_id: user.id, provider: LDAP_PROVIDER, subject: normaliseDn(entry.dn), email: entry.email ?? null, created_at: at, last_sign_in_at: null })
      await recordEvent(trx, userCtx, 'user.identity_linked', { type: 'user', id: user.id }, { identity_id: identityId, provider: LDAP_PROVIDER, subject: normaliseDn(entry.dn), during: 'sign_in' })
      return { userId: user.id }
    })
  } catch (error) {
    const again = await findIdentity(db, LDAP_PROVIDER, normaliseDn(entry.dn))
    if (again !== undefined) return { userId: again.user_id }
    throw error
  }
}

/**
 * At each directory sign-in: the role and groups LDAP_GROUP_MAP gives the
 * entry's groups, through the user lifecycle (a `user.updated` event with
 * `source: "ldap"` when they change anything; the last enabled admin keeps
 * the role), and the identity's last sign-in.
 */
async function applyDirectoryAccess (db: Db, ctx: RequestContext, config: LdapConfig, userId: string, entry: DirectoryUser): Promise<{ keptLastAdmin: boolean }> {
  const access = mappedAccess(config, entry.groupDns)
  return await db.transaction().execute(async trx => {
    const identity = await findIdentity(trx, LDAP_PROVIDER, normaliseDn(entry.dn))
    if (identity !== undefined) await touchIdentity(trx, identity.id, entry.email ?? null, nowIso())
    if (access.role === undefined && access.groups === undefined) return { keptLastAdmin: false }
    const outcome = await changeUserRecorded(trx, { ...ctx, actorType: 'user', actorId: userId }, userId, access, { lastAdmin: 'keep', extra: { source: LDAP_PROVIDER } })
    return { keptLastAdmin: outcome.keptLastAdmin }
  })
}
