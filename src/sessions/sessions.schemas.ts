import { Type, type Static } from 'typebox'
import { Nullable, ref, Timestamp, Uuid } from '../lib/openapi.ts'
import { PROVIDER_ID_PATTERN } from '../sso/oidc.schemas.ts'
import { User } from '../users/users.schemas.ts'

export const LoginBody = Type.Object({
  username: Type.String({ minLength: 1, maxLength: 254, description: 'The username or the email address.' }),
  password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true })
}, { $id: 'LoginBody', additionalProperties: false })
export type LoginBody = Static<typeof LoginBody>

export const Session = Type.Object({
  token: Type.String({ maxLength: 61, pattern: '^gatehouse_session_[0-9A-Za-z]{43}$', description: 'The session token, for API clients: send it as "Authorization: Bearer <token>". Browsers get it as a cookie instead.' }),
  token_type: Type.Literal('Bearer'),
  session_id: Uuid(),
  expires_at: Timestamp({ description: 'The absolute end of the session; it ends earlier after the idle time-out.' }),
  user: ref(User)
}, { $id: 'Session', additionalProperties: false })
export type Session = Static<typeof Session>

export const PasswordChange = Type.Object({
  current_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true }),
  new_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: '8 to 256 characters, not common, not containing the username, the e-mail address\'s name part or the service\'s names (PASSWORD_CONTEXT_WORDS).' })
}, { $id: 'PasswordChange', additionalProperties: false })
export type PasswordChange = Static<typeof PasswordChange>

export const SIGN_IN_METHODS = ['password', 'ldap', 'oidc', 'passkey'] as const

/** At most this many sessions are listed, the most recently used first. */
export const MAX_LISTED_SESSIONS = 500

export const SessionSummary = Type.Object({
  id: Uuid({ description: 'The session id (`session_id` at sign-in); the token is never shown again.' }),
  created_at: Timestamp({ description: 'The sign-in.' }),
  last_seen_at: Timestamp({ description: 'The last recorded use; written at most once a minute.' }),
  expires_at: Timestamp({ description: 'The absolute end; the session ends earlier after the idle time-out.' }),
  client_ip: Nullable(Type.String({ maxLength: 64 }), { description: 'The address that signed in (behind a proxy, as TRUST_PROXY reads it).' }),
  user_agent: Nullable(Type.String({ maxLength: 512 }), { description: 'The User-Agent of the sign-in, its first 512 characters.' }),
  device: Nullable(Type.String({ maxLength: 200 }), {
    description: 'The User-Agent as a person reads it: "Firefox 133 on Windows", or a program\'s name and version ("curl/8.5.0"); null when nothing is recognisable.'
  }),
  method: Type.Unsafe<typeof SIGN_IN_METHODS[number] | null>({
    type: ['string', 'null'],
    enum: [...SIGN_IN_METHODS, null],
    description: 'How the session was opened: `password` (a local password), `ldap` (a password the directory checked), `oidc` (single sign-on, see `provider`) or `passkey` (a passkey alone). ' +
      'Null for sessions opened before gatehouse recorded it.'
  }),
  provider: Nullable(Type.String({ maxLength: 32, pattern: PROVIDER_ID_PATTERN }), { description: 'The OpenID Connect provider\'s id, for `oidc`; else null.' }),
  mfa: Type.Boolean({ description: 'The sign-in included a second factor, or was a passkey (which verifies its user); `X-Auth-MFA`.' }),
  current: Type.Boolean({ description: 'This is the session that made the request.' })
}, { $id: 'SessionSummary', additionalProperties: false })
export type SessionSummary = Static<typeof SessionSummary>

export const SessionList = Type.Array(ref(SessionSummary), { maxItems: MAX_LISTED_SESSIONS })

export const SessionParams = Type.Object({ session_id: Uuid() }, { additionalProperties: false })
export const UserSessionParams = Type.Object({ user_id: Uuid(), session_id: Uuid() }, { additionalProperties: false })
export const SessionsOfUserParams = Type.Object({ user_id: Uuid() }, { additionalProperties: false })

export const SessionsEnded = Type.Object({
  ended: Type.Integer({ format: 'int32', minimum: 0, maximum: 2_147_483_647, description: 'How many sessions ended.' })
}, { $id: 'SessionsEnded', additionalProperties: false })

/** How a session was opened, in words for the account page and the console: "Password and a second factor", "Single sign-on (corp)". */
export function signInText (session: Pick<SessionSummary, 'method' | 'provider' | 'mfa'>): string {
  const first = session.method === 'password'
    ? 'Password'
    : session.method === 'ldap'
      ? 'Directory password (LDAP)'
      : session.method === 'oidc'
        ? `Single sign-on${session.provider !== null ? ` (${session.provider})` : ''}`
        : session.method === 'passkey' ? 'Passkey' : 'Sign-in method not recorded'
  // A passkey is both factors at once; saying so again would read as a third step.
  return session.mfa && session.method !== 'passkey' ? `${first} and a second factor` : first
}
