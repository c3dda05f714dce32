import { createHash, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto'
import { isoCBOR } from '@simplewebauthn/server/helpers'

const b64url = (bytes: Uint8Array | string): string => Buffer.from(bytes).toString('base64url')
const sha256 = (data: Uint8Array | string): Buffer => createHash('sha256').update(data).digest()

/** WebAuthn authenticator-data flags. */
const UP = 0x01
const UV = 0x04
const AT = 0x40

interface Credential { id: Buffer, privateKey: KeyObject, userHandle: string, counter: number }

/**
 * A WebAuthn authenticator in software, for API tests: makes ES256 passkeys
 * with "none" attestation and signs assertions exactly as the specification
 * lays the bytes out, so the server's checks run on real signatures. The
 * browser test uses Chromium's own virtual authenticator instead.
 */
export class SoftAuthenticator {
  readonly credentials: Credential[] = []

  constructor (readonly origin: string, readonly rpId: string, readonly userVerifying = true) {}

  private flags (extra = 0): number {
    return UP | (this.userVerifying ? UV : 0) | extra
  }

  create (options: { challenge: string, user: { id: string } }): Record<string, unknown> {
    const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' })
    const jwk = publicKey.export({ format: 'jwk' })
    const cose = new Map<number, number | Uint8Array>([
      [1, 2], [3, -7], [-1, 1],
      [-2, new Uint8Array(Buffer.from(jwk.x!, 'base64url'))],
      [-3, new Uint8Array(Buffer.from(jwk.y!, 'base64url'))]
    ])
    const id = randomBytes(16)
    const length = Buffer.alloc(2)
    length.writeUInt16BE(id.length)
    const authData = Buffer.concat([
      sha256(this.rpId), Buffer.from([this.flags(AT)]), Buffer.alloc(4), Buffer.alloc(16), length, id, Buffer.from(isoCBOR.encode(cose))
    ])
    const attestation = isoCBOR.encode(new Map<string, unknown>([['fmt', 'none'], ['attStmt', new Map()], ['authData', new Uint8Array(authData)]]) as never)
    this.credentials.push({ id, privateKey, userHandle: options.user.id, counter: 0 })
    const clientData = JSON.stringify({ type: 'webauthn.create', challenge: options.challenge, origin: this.origin, crossOrigin: false })
    return {
      id: b64url(id),
      rawId: b64url(id),
      type: 'public-key',
      response: { clientDataJSON: b64url(clientData), attestationObject: b64url(attestation), transports: ['internal'] },
      clientExtensionResults: {},
      authenticatorAttachment: 'platform'
    }
  }

  /** An assertion for `options.challenge` with the given (default: the first) credential; `counter` forces a signature count. */
  get (options: { challenge: string }, which = 0, counter?: number): Record<string, unknown> {
    const credential = this.credentials[which]!
    credential.counter = counter ?? credential.counter + 1
    const count = Buffer.alloc(4)
    count.writeUInt32BE(credential.counter)
    const authData = Buffer.concat([sha256(this.rpId), Buffer.from([this.flags()]), count])
    const clientData = JSON.stringify({ type: 'webauthn.get', challenge: options.challenge, origin: this.origin, crossOrigin: false })
    const signature = sign('sha256', Buffer.concat([authData, sha256(clientData)]), credential.privateKey)
    return {
      id: b64url(credential.id),
      rawId: b64url(credential.id),
      type: 'public-key',
      response: {
        clientDataJSON: b64url(clientData),
        authenticatorData: b64url(authData),
        signature: b64url(signature),
        userHandle: credential.userHandle
      },
      clientExtensionResults: {},
      authenticatorAttachment: 'platform'
    }
  }
}
