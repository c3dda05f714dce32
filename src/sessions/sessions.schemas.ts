import { Type, type Static } from 'typebox'
import { ref } from '../lib/openapi.ts'
import { User } from '../users/users.schemas.ts'

export const LoginBody = Type.Object({
  username: Type.String({ minLength: 1, maxLength: 254, description: 'The username or the email address.' }),
  password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true })
}, { $id: 'LoginBody', additionalProperties: false })
export type LoginBody = Static<typeof LoginBody>

export const Session = Type.Object({
  token: Type.String({ description: 'The session token, for API clients: send it as "Authorization: Bearer <token>". Browsers get it as a cookie instead.' }),
  token_type: Type.Literal('Bearer'),
  session_id: Type.String({ format: 'uuid' }),
  expires_at: Type.String({ format: 'date-time', description: 'The absolute end of the session; it ends earlier after the idle time-out.' }),
  user: ref(User)
}, { $id: 'Session', additionalProperties: false })
export type Session = Static<typeof Session>

export const PasswordChange = Type.Object({
  current_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true }),
  new_password: Type.String({ minLength: 1, maxLength: 1024, format: 'password', writeOnly: true, description: '8 to 256 characters, not common, not containing the username.' })
}, { $id: 'PasswordChange', additionalProperties: false })
export type PasswordChange = Static<typeof PasswordChange>
