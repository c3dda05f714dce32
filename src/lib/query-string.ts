/**
 * The name of one raw `name=value` pair as Fastify's query parser
 * (fast-querystring) reads it: `+` is a space and percent-escapes are decoded,
 * so `API%5FKEY` and `%41PI_KEY` are both `API_KEY`. A name whose escapes are
 * invalid stays as written, as it does there.
 */
export function queryParamName (pair: string): string {
  const equals = pair.indexOf('=')
  let name = equals === -1 ? pair : pair.slice(0, equals)
  if (name.includes('+')) name = name.replace(/\+/g, ' ')
  if (name.includes('%')) {
    try {
      name = decodeURIComponent(name)
    } catch {
      // Undecodable: the parser keeps it as written, and so does this.
    }
  }
  return name
}

/** `?API_KEY=`, however its name is spelled or escaped: a credential, never to be logged or echoed. */
export function isCredentialParam (pair: string): boolean {
  return queryParamName(pair).toUpperCase() === 'API_KEY'
}
