import type { FastifyReply, FastifyRequest } from 'fastify'
import { AppError } from '../errors.ts'
import { isCredentialParam, queryParamName } from './query-string.ts'

/**
 * Cursors are opaque to clients: base64url of a small JSON tuple. They carry
 * the sort they were made for, so a cursor cannot be replayed under another.
 *
 * They are not signed: a made-up cursor can only start a list the caller may
 * read anyway at another place. But its values go into SQL as the keyset
 * position, so each must have the type of its column (PostgreSQL fails the
 * statement on a uuid or timestamp it cannot read) and no NUL byte.
 */
export function encodeCursor (sort: string, key: ReadonlyArray<string | number>): string {
  return Buffer.from(JSON.stringify([sort, ...key])).toString('base64url')
}

/** What a value in a cursor stands for: an id, a timestamp as the API writes it, or other text (a username key). */
export type CursorValue = 'uuid' | 'timestamp' | 'text'

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
/** Usernames and emails are at most 254 characters; a case-folded one may grow a little. */
const MAX_TEXT = 1024

const CURSOR_VALUES: Record<CursorValue, (value: string) => boolean> = {
  uuid: (value) => UUID.test(value),
  // Exactly the toISOString() form the API gives every timestamp: a real instant, in UTC, to the millisecond.
  timestamp: (value) => { const time = Date.parse(value); return !Number.isNaN(time) && new Date(time).toISOString() === value },
  text: (value) => value.length <= MAX_TEXT && !value.includes('\u0000')
}

export function decodeCursor (cursor: string, sort: string, values: readonly CursorValue[]): string[] {
  let decoded: unknown
  try {
    decoded = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))
  } catch {
    decoded = undefined
  }
  if (!Array.isArray(decoded) || decoded.length !== values.length + 1 || decoded[0] !== sort ||
      !values.every((kind, i) => typeof decoded[i + 1] === 'string' && CURSOR_VALUES[kind](decoded[i + 1] as string))) {
    throw new AppError('invalid_cursor', 422, 'The cursor is not one this operation issued for this sort order; start again without it.', {
      errors: [{ in: 'query', pointer: '/cursor', detail: 'is not a valid cursor' }]
    })
  }
  return decoded.slice(1) as string[]
}

/** Sets `Link: <…>; rel="next"` keeping every query parameter but the cursor (and never a credential). */
export function setNextLink (request: FastifyRequest, reply: FastifyReply, cursor: string): void {
  const [path, query = ''] = request.url.split('?', 2)
  // Parameters are kept as the client wrote them; only cursor and API_KEY are dropped, by their decoded names.
  const kept = query.split('&').filter(pair => pair !== '' && !isCredentialParam(pair) && queryParamName(pair).toLowerCase() !== 'cursor')
  kept.push(`cursor=${cursor}`)
  reply.header('Link', `<${path}?${kept.join('&')}>; rel="next"`)
}
