import type { Config } from '../config.ts'
import type { Db, SignInMethod } from '../db/database.ts'
import type { RequestContext } from '../auth/principal.ts'
import type { PasswordHasher } from '../lib/passwords.ts'
import type { User } from '../users/users.schemas.ts'
import type { FailureCounter } from './failure-counter.ts'

/** What the sign-in services and flows are given (sessions/sign-in.plugin.ts builds it once). */
export interface SessionsDeps {
  db: Db
  passwords: PasswordHasher
  failures: FailureCounter
  config: Pick<Config, 'sessionIdleTimeoutMs' | 'sessionAbsoluteTimeoutMs' | 'loginMaxFailuresPerAccount' | 'loginMaxFailuresPerAddress' |
  'loginFailureWindowMs' | 'accountLockThreshold' | 'accountLockMs' | 'loginKnownClientDays' | 'passwordMinLength' | 'passwordMaxLength' | 'passwordContextWords' |
  'mfaRequired' | 'mfaEncryptionKey' | 'mfaKeyRing' | 'mfaMaxFailures' | 'webauthnRpId' | 'webauthnOrigins' | 'passwordSignIn' | 'ldap' | 'reauthWindowMs' |
  'smtpUrl' | 'mailNotices'>
  /** A hash with current parameters to verify against when there is no real one, so every failure costs the same. */
  dummyHash: string
  /** Signs device tokens (see device-trust.ts); the same for every instance. */
  deviceKey: () => Promise<Buffer>
}

export interface SignInContext extends RequestContext {
  userAgent: string | null
  /** The device token the browser sent, if any. */
  deviceToken: string | null
  /** The session cookie the browser still sent, if any: a sign-in ends that session (fixation, ASVS 7.2.4). */
  previousSessionToken: string | null
}

/** How a sign-in's first step went, kept on the session it opens (and on a second-factor challenge until then). */
export interface SignInOpening {
  method: SignInMethod
  /** The OIDC provider's id, for `oidc`. */
  provider?: string | undefined
}

export interface SignIn {
  token: string
  sessionId: string
  expiresAt: string
  user: User
  /** A fresh device token for this account, for the browser to keep. */
  deviceToken: string
}
