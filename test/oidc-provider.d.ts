// The few parts of oidc-provider 8 (which ships no types) that the test provider in oidc-op.ts uses.
declare module 'oidc-provider' {
  import type { IncomingMessage, ServerResponse } from 'node:http'

  export interface Grant {
    addOIDCScope: (scope: string) => void
    addOIDCClaims: (claims: string[]) => void
    save: () => Promise<string>
  }

  export interface KoaContextWithOIDC {
    oidc: {
      provider: Provider
      client?: { clientId: string }
      session?: { accountId?: string, grantIdFor: (clientId: string) => string | undefined }
      result?: { consent?: { grantId?: string } }
    }
  }

  export default class Provider {
    constructor (issuer: string, configuration: Record<string, unknown>)
    Grant: {
      new (properties: { clientId: string, accountId: string }): Grant
      find: (id: string) => Promise<Grant | undefined>
    }

    callback (): (req: IncomingMessage, res: ServerResponse) => void
  }
}
