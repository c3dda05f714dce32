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
  timestamp: isIsoInstant,
  text: (value) => value.length <= MAX_TEXT && !value.includes('\u0000')
}

/** toISOString()'s form for the years 0000 to 9999, the only ones it writes with four digits. */
const ISO_INSTANT = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.\d{3}Z$/
const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]

/**
 * Exactly the toISOString() form the API gives every timestamp: a real
 * instant, in UTC, to the millisecond. Checked by its fields rather than by
 * parsing it and writing it again (`Date.parse`, `new Date`, `toISOString`:
 * 1.4% of the server's profile under uncached pages, every request with a cursor).
 */
export function isIsoInstant (value: string): boolean {
  const match = ISO_INSTANT.exec(value)
  if (match === null) return false
  const year = Number(match[1])
  const month = Number(match[2])
  const day = Number(match[3])
  if (month < 1 || month > 12 || day < 1 || Number(match[4]) > 23 || Number(match[5]) > 59 || Number(match[6]) > 59) return false
  const leap = month === 2 && year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0)
  return day <= DAYS_IN_MONTH[month - 1]! + (leap ? 1 : 0)
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
