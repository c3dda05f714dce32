import { Type } from 'typebox'
import { AppError } from '../errors.ts'
import type { TokenProof } from './tokens.repository.ts'

/** The proof of a token in a request body: `token` from the link, or `login` (username or address) with the mailed `code`. */
export const TokenProofFields = {
  token: Type.Optional(Type.String({ minLength: 47, maxLength: 47, pattern: '^ght_[0-9A-Za-z]{43}$', description: 'The `token` of the mailed link.' })),
  login: Type.Optional(Type.String({ minLength: 1, maxLength: 254, description: 'With `code`, instead of `token`: the username or address (for an e-mail confirmation, the address confirmed).' })),
  code: Type.Optional(Type.String({ minLength: 1, maxLength: 16, pattern: '^[A-Za-z0-9 -]+$', description: 'With `login`: the short code from the mail, e.g. `K7PM-Q2XD` (case, spaces and dashes do not matter).' }))
}

/** The proof a body gives: the token, or the login and code; 422 for neither or both. */
export function tokenProofOf (body: { token?: string | undefined, login?: string | undefined, code?: string | undefined }): TokenProof {
  if (body.token !== undefined && body.login === undefined && body.code === undefined) return { token: body.token }
  if (body.token === undefined && body.login !== undefined && body.code !== undefined) return { login: body.login, code: body.code }
  throw new AppError('validation_failed', 422, 'Give the link\'s token, or the login and the code, not both.', {
    errors: [{ in: 'body', pointer: body.token !== undefined ? '/token' : '/code', detail: 'token, or login with code' }]
  })
}
