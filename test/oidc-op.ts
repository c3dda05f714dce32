import { generateKeyPairSync, randomBytes } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import Provider, { type KoaContextWithOIDC } from 'oidc-provider'

/** The claims an account at the test provider has; tests change them between sign-ins. */
export interface AccountClaims {
  email?: string
  email_verified?: boolean
  preferred_username?: string
  given_name?: string
  family_name?: string
  groups?: string[]
}

export interface TestOp {
  issuer: string
  clientId: string
  clientSecret: string
  accounts: Map<string, AccountClaims>
  /** How many HTTP requests reached the provider so far. */
  requests: number
  close: () => Promise<void>
}

/**
 * A real OpenID provider (oidc-provider) on 127.0.0.1 with one confidential
 * client whose redirect URIs are given. Its development login page takes any
 * account id as `login` (with any password); the claims are those in
 * `accounts`. Consent is granted in advance for the client (a first-party
 * client, as an organisation's gatehouse is to its identity provider).
 */
export async function startTestOp (redirectUris: string[]): Promise<TestOp> {
  const server: Server = createServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const issuer = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const clientId = 'gatehouse-test'
  const clientSecret = randomBytes(24).toString('hex')
  const accounts = new Map<string, AccountClaims>()
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 })
  const provider = new Provider(issuer, {
    clients: [{
      client_id: clientId,
      client_secret: clientSecret,
      redirect_uris: redirectUris,
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic'
    }],
    jwks: { keys: [{ ...privateKey.export({ format: 'jwk' }), kid: 'test', use: 'sig', alg: 'RS256' }] },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['preferred_username', 'given_name', 'family_name'],
      groups: ['groups']
    },
    pkce: { required: () => true },
    // Stated, so the provider does not print a notice for each default it would otherwise use.
    ttl: { AccessToken: 600, AuthorizationCode: 60, IdToken: 600, Interaction: 600, Grant: 3600, Session: 3600 },
    features: { devInteractions: { enabled: true } },
    findAccount: async (_ctx: KoaContextWithOIDC, sub: string) => ({
      accountId: sub,
      claims: async () => ({ sub, ...accounts.get(sub) })
    }),
    loadExistingGrant: async (ctx: KoaContextWithOIDC) => {
      const grantId = ctx.oidc.result?.consent?.grantId ?? ctx.oidc.session!.grantIdFor(ctx.oidc.client!.clientId)
      if (grantId !== undefined) return await ctx.oidc.provider.Grant.find(grantId)
      const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client!.clientId, accountId: ctx.oidc.session!.accountId! })
      grant.addOIDCScope('openid email profile groups')
      grant.addOIDCClaims(['email', 'email_verified', 'preferred_username', 'given_name', 'family_name', 'groups'])
      await grant.save()
      return grant
    }
  })
  const op: TestOp = {
    issuer,
    clientId,
    clientSecret,
    accounts,
    requests: 0,
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>(resolve => server.close(() => resolve()))
    }
  }
  server.on('request', () => { op.requests++ })
  server.on('request', provider.callback())
  return op
}

/** Cookies as one user agent keeps them, for the provider's own (any path, one host). */
class CookieJar {
  private readonly cookies = new Map<string, string>()
  take (response: Response): void {
    for (const line of response.headers.getSetCookie()) {
      const [pair] = line.split(';')
      const at = pair!.indexOf('=')
      const name = pair!.slice(0, at)
      const value = pair!.slice(at + 1)
      if (value === '' || /expires=Thu, 01 Jan 1970/i.test(line)) this.cookies.delete(name)
      else this.cookies.set(name, value)
    }
  }

  header (): string {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ')
  }
}

/**
 * Plays the person at the provider: opens the authorization URL, signs in
 * on the login page as `account`, and follows the provider's redirects until
 * one leaves it. Returns that URL: the callback with `code` and `state`.
 */
export async function signInAtOp (op: TestOp, authorizationUrl: string, account: string): Promise<URL> {
  const jar = new CookieJar()
  let url = new URL(authorizationUrl)
  let body: URLSearchParams | undefined
  for (let hop = 0; hop < 10; hop++) {
    const response = await fetch(url, {
      method: body !== undefined ? 'POST' : 'GET',
      redirect: 'manual',
      headers: { cookie: jar.header(), ...(body !== undefined ? { 'content-type': 'application/x-www-form-urlencoded' } : {}) },
      ...(body !== undefined ? { body } : {})
    })
    jar.take(response)
    body = undefined
    if (response.status >= 300 && response.status < 400) {
      url = new URL(response.headers.get('location')!, url)
      if (url.origin !== op.issuer) return url
      continue
    }
    const html = await response.text()
    if (response.status !== 200 || !html.includes('name="prompt" value="login"')) throw new Error(`unexpected page at the provider (${response.status}): ${html.slice(0, 500)}`)
    const action = /action="([^"]+)"/.exec(html)![1]!
    url = new URL(action, url)
    body = new URLSearchParams({ prompt: 'login', login: account, password: 'any' })
  }
  throw new Error('too many redirects at the provider')
}
