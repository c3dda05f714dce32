import type { FastifyInstance, FastifyRequest } from 'fastify'
import { AppError } from '../errors.ts'

type Done = (error: Error | null, body?: unknown) => void
type BodyParser = (request: FastifyRequest, body: string, done: Done) => void

const AT_POSITION = /at position (\d+)/

/**
 * Where the first character is that no JSON text can continue with: V8 names
 * it in most messages ("… in JSON at position 7"), but not in "Unexpected
 * token 'x', "<the body>" is not valid JSON". For that one, the shortest prefix
 * that is not the beginning of some JSON text is found by bisection (a prefix
 * of a broken prefix is not always broken, but every extension of one is).
 */
function jsonErrorOffset (text: string, message: string): number {
  const named = AT_POSITION.exec(message)
  if (named !== null) return Number(named[1])
  if (message.startsWith('Unexpected end of JSON input')) return text.length
  let fine = 0
  let broken = text.length
  while (broken - fine > 1) {
    const middle = (fine + broken) >>> 1
    if (isBrokenPrefix(text.slice(0, middle))) broken = middle
    else fine = middle
  }
  return broken - 1
}

/** Broken: no JSON text starts like this. A prefix that only stops early (an open string, a `-`) is not. */
function isBrokenPrefix (prefix: string): boolean {
  try {
    JSON.parse(prefix)
    return false
  } catch (error) {
    const message = (error as Error).message
    if (message.startsWith('Unexpected end of JSON input')) return false
    const named = AT_POSITION.exec(message)
    return named === null || Number(named[1]) < prefix.length
  }
}

/** 1-based line and column of a character offset, as editors count them. */
function lineAndColumn (text: string, offset: number): { line: number, column: number } {
  let line = 1
  let lineStart = 0
  for (let i = text.indexOf('\n'); i !== -1 && i < offset; i = text.indexOf('\n', i + 1)) {
    line += 1
    lineStart = i + 1
  }
  return { line, column: offset - lineStart + 1 }
}

/**
 * Fastify's JSON parser (secure-json-parse, refusing `__proto__` and
 * `constructor.prototype`), whose refusals say why: where the body stops being
 * JSON (line, column, character), or which property name is forbidden.
 * Fastify's own error says neither, and V8's message is not passed on as it
 * is: it quotes the body, passwords included.
 */
export function jsonParserWithPosition (app: FastifyInstance): BodyParser {
  const parse = app.getDefaultJsonParser('error', 'error') as unknown as BodyParser
  return (request, body, done) => {
    parse(request, body, (error, value) => {
      if ((error as { code?: unknown } | null)?.code !== 'FST_ERR_CTP_INVALID_JSON_BODY') {
        done(error, value)
        return
      }
      done(explainRefusal(body, error!))
    })
  }
}

/** Parsed again, on the failure path only, to learn what the parser refused. */
function explainRefusal (body: string, refusal: Error): AppError {
  try {
    JSON.parse(body)
  } catch (syntaxError) {
    const offset = jsonErrorOffset(body, (syntaxError as Error).message)
    const { line, column } = lineAndColumn(body, offset)
    const where = offset >= body.length ? `it ends early (line ${line}, column ${column})` : `at line ${line}, column ${column} (character ${offset + 1})`
    return new AppError('malformed_body', 400, `The body is not valid JSON: ${where}.`, { cause: refusal })
  }
  return new AppError('malformed_body', 400, 'The body contains a forbidden property name (__proto__ or constructor).', { cause: refusal })
}
