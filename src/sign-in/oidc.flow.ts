import { toBool, toStringArray, type Db } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import { recordEvent } from '../events/events.repository.ts'
import { newId } from '../lib/ids.ts'
import { digestOf } from '../lib/secrets.ts'
import { openSignInChallenge, secondFactorNeeded, type MfaPending } from '../mfa/mfa.service.ts'
import { openSession } from '../sessions/sessions.service.ts'
import { reserveAttempt } from '../sessions/throttle.ts'
import type { SignIn, SignInContext } from '../sessions/sessions.types.ts'
import { findIdentity, findIdentityOfUser, insertIdentity, touchIdentity } from '../sso/identities.repository.ts'
import { claimString, emailVerified, mappedAccess, readCallback, SsoRefusal, type Claims, type SsoDeps, type SsoFailureReason } from '../sso/oidc.service.ts'
import { findTakenKeys, findUserByEmail, findUserById, type NewUserRow, type UserRow } from '../users/users.repository.ts'
import { changeUserRecorded, createUserRecorded, newUserRow } from '../users/users.lifecycle.ts'
import { USERNAME_PATTERN } from '../users/users.schemas.ts'

/*
 * Signing in with an OpenID Connect provider, from its answer at the
 * callback on: a flow above the providers, users, factors and sessions
 * (docs/architecture.md). The provider's answer is read by the sso service;
 * the account it stands for is found, linked or made here, through the user
 * lifecycle, and the sign-in ends in a session or a challenge for the second
 * factor.
 */

export type SsoResult = { next: string | undefined } & (({ kind: 'session' } & SignIn) | ({ kind: 'mfa' } & MfaPending))

const USERNAME_RE = new RegExp(USERNAME_PATTERN)

/** A free username for a new user: the provider's preferred_username or email (cleaned up), else the subject; `-2`, `-3`… when taken. */
async function freeUsername (db: Db, claims: Claims, subject: string): Promise<string> {
  const wanted = claimString(claims, 'preferred_username', 254) ?? claimString(claims, 'email', 254) ?? `user-${digestOf(subject).slice(0, 12)}`
  let base = wanted.replace(/[^A-Za-z0-9._@-]+/g, '_').slice(0, 56)
  if (!USERNAME_RE.test(base)) base = `user-${digestOf(subject).slice(0, 12)}`
  const candidates = [base, ...Array.from({ length: 49 }, (_, i) => `${base}-${i + 2}`)]
  const taken = (await findTakenKeys(db, candidates.map(c => c.toLowerCase()), [])).usernames
  // Fifty people of one name are unlikely; past them the subject's digest makes the name unique.
  return candidates.find(c => !taken.has(c.toLowerCase())) ?? `${base.slice(0, 40)}-${digestOf(subject).slice(0, 12)}`
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
 * Finishes a sign-in at the callback: the provider's answer is read and
 * checked (readCallback). Then the account: the identity linked before, else a user with the same verified
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
  const now = new Date()
  const answer = await readCallback(deps, providerId, callbackUrl, browserState, redirectUri, now)
  const { provider, source } = answer
  const refuse = async (reason: SsoFailureReason, status: 401 | 403, detail: string, next: string | undefined, userId?: string, extra: Record<string, unknown> = {}): Promise<never> => {
    await recordEvent(deps.db, userId !== undefined ? { ...ctx, actorType: 'user', actorId: userId } : ctx, 'user.sso_login_failed',
      userId !== undefined ? { type: 'user', id: userId } : null, { provider: source, reason, ...extra })
    throw new SsoRefusal(reason, status, detail, next)
  }
  if (answer.kind === 'refused') {
    const { reason, status, detail, next, extra } = answer.refusal
    return await refuse(reason, status, detail, next, undefined, extra)
  }
  const { claims, next } = answer
  const subject = String(claims.sub)
  const email = claimString(claims, 'email', 254) ?? null
  const verified = email !== null && emailVerified(claims)

  const linked = await findIdentity(deps.db, source, subject)
  let who: Who
  if (linked !== undefined) {
    who = { user: await findUserById(deps.db, linked.user_id), create: undefined, link: undefined, identityId: linked.id }
  } else {
    const owner = email !== null ? await findUserByEmail(deps.db, email) : undefined
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
        create: newUserRow({
          username,
          email: verified && owner === undefined ? email : null,
          first_name: claimString(claims, 'given_name', 200),
          last_name: claimString(claims, 'family_name', 200),
          role: access.role,
          groups: access.groups
        }, null, false, at),
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
    if (who.create !== undefined) await createUserRecorded(trx, userCtx, who.create, { source })
    if (who.link !== undefined) {
      await insertIdentity(trx, { id: who.identityId, user_id: userId, provider: source, subject, email, created_at: at, last_sign_in_at: at })
      await recordEvent(trx, userCtx, 'user.identity_linked', { type: 'user', id: userId }, {
        identity_id: who.identityId, provider: source, subject, email, during: 'sign_in', match: who.link === 'email' ? 'email' : 'new_user'
      })
    } else {
      await touchIdentity(trx, who.identityId, email, at)
    }
    const kept: Record<string, unknown> = {}
    if (access !== undefined) {
      const outcome = await changeUserRecorded(trx, userCtx, userId, access, { lastAdmin: 'keep', extra: { source } })
      if (outcome.keptLastAdmin) kept.role_kept = 'last_admin'
    }
    await recordEvent(trx, userCtx, 'user.sso_login_succeeded', { type: 'user', id: userId }, {
      provider: source, subject, identity_id: who.identityId, ...kept
    })
  }

  // For the second-factor policy: an admin the mapping would demote may stay one
  // (the last admin rule, decided in `apply` under its lock), so either admin counts.
  const role = who.create?.role ?? (who.user!.role === 'admin' || access?.role === 'admin' ? 'admin' : 'user')
  const secondFactor = await secondFactorNeeded(deps, { id: userId, username: who.user?.username ?? who.create!.username, role })
  const opened = { method: 'oidc' as const, provider: provider.id }
  let result: SsoResult
  if (secondFactor !== undefined) {
    await deps.db.transaction().execute(apply)
    const pending = await openSignInChallenge(deps, ctx, { id: userId, username: who.user?.username ?? who.create!.username, role }, secondFactor, undefined, now, opened)
    result = { kind: 'mfa', next, ...pending }
  } else {
    const locked = who.user?.locked_until != null && new Date(who.user.locked_until) > now
    // The account lock guards the password against guessing; the provider vouched for this person, so a lock is left in place but does not stop them.
    const signedIn = await openSession(deps, ctx, userId, { opened, locked, now, via: source, within: apply })
    result = { kind: 'session', next, ...signedIn }
  }
  await deps.failures.release([budget.key])
  return result
}
