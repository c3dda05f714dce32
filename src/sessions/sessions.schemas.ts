import { Type, type Static } from 'typebox'
import { ref, Timestamp, Uuid } from '../lib/openapi.ts'
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
  new_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: '8 to 256 characters, not common, not containing the username.' })
}, { $id: 'PasswordChange', additionalProperties: false })
export type PasswordChange = Static<typeof PasswordChange>
