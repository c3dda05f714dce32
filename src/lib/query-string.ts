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

/**
 * Names of query parameters that may carry a secret, matched ignoring case:
 * the API key; what sign-in and password operations take in their bodies (a
 * password, a second factor's code, a link's token); an OIDC provider's answer
 * at the callback (the authorisation code and the state, which together
 * finish a sign-in) and the tokens an OAuth answer may carry; and the usual
 * names of other credentials. Any name holding `password`, `passwd`,
 * `secret` or `token` is one too (`new_password`, `client_secret`,
 * `refresh_token`).
 */
const SECRET_PARAM_NAMES = new Set([
  'api_key', 'apikey', 'api-key', 'x-api-key', 'key',
  'code', 'recovery_code', 'otp', 'totp', 'passcode', 'pin', 'credential', 'assertion',
  'state', 'session_state'
])
const SECRET_PARAM_PARTS = /password|passwd|secret|token/

/** A `name=value` pair whose name says it may carry a secret (see SECRET_PARAM_NAMES); never to be logged or taken. */
export function isSecretParam (pair: string): boolean {
  const name = queryParamName(pair).toLowerCase()
  return SECRET_PARAM_NAMES.has(name) || SECRET_PARAM_PARTS.test(name)
}

/** The names of the secret-bearing parameters of a URL's query string, as sent. */
export function secretParamsOf (url: string): string[] {
  const start = url.indexOf('?')
  if (start === -1) return []
  return url.slice(start + 1).split('&').filter(pair => pair !== '' && isSecretParam(pair)).map(pair => queryParamName(pair))
}
