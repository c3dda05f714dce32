import type { FastifyReply, FastifyRequest } from 'fastify'
import { AppError } from '../errors.ts'

/**
 * Cursors are opaque to clients: base64url of a small JSON tuple. They carry
 * the sort they were made for, so a cursor cannot be replayed under another.
 */
export function encodeCursor (sort: string, key: ReadonlyArray<string | number>): string {
  return Buffer.from(JSON.stringify([sort, ...key])).toString('base64url')
}

export function decodeCursor (cursor: string, sort: string, arity: number): string[] {
  let decoded: unknown
  try {
    decoded = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))
  } catch {
    decoded = undefined
  }
  if (!Array.isArray(decoded) || decoded.length !== arity + 1 || decoded[0] !== sort ||
      !decoded.every(v => typeof v === 'string')) {
    throw new AppError('invalid_cursor', 422, 'The cursor is not one this operation issued for this sort order; start again without it.', {
      errors: [{ in: 'query', pointer: '/cursor', detail: 'is not a valid cursor' }]
    })
  }
  return decoded.slice(1) as string[]
}

/** Sets `Link: <…>; rel="next"` keeping every query parameter but the cursor (and never a credential). */
export function setNextLink (request: FastifyRequest, reply: FastifyReply, cursor: string): void {
  const [path, query = ''] = request.url.split('?', 2)
  // Parameters are kept as the client wrote them; only cursor and API_KEY are dropped.
  const kept = query.split('&').filter(pair => pair !== '' && !/^(cursor|API_KEY)(=|$)/i.test(pair))
  kept.push(`cursor=${cursor}`)
  reply.header('Link', `<${path}?${kept.join('&')}>; rel="next"`)
}
