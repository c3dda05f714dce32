import http from 'node:http'
import https from 'node:https'
import { isIP } from 'node:net'
import { Webhook } from 'standardwebhooks'
import { guardedLookup, hostOf, isRefusedAddress, RefusedAddressError } from '../lib/ssrf-guard.ts'

/**
 * Sending one webhook request: the SSRF guard (src/lib/ssrf-guard.ts), the Standard Webhooks
 * signature, and an HTTP POST with one deadline and no redirects followed.
 */

// ---------------------------------------------------------------- signing

/** `v1,<base64 HMAC-SHA256>` of `id.timestamp.body`, once per secret, space-separated (both during a rotation's overlap). */
export function signatureHeader (secrets: string[], id: string, at: Date, body: string): string {
  return secrets.map(secret => new Webhook(secret).sign(id, at, body)).join(' ')
}

// ---------------------------------------------------------------- sending

/** An error message as stored and shown: one bounded line, no control characters (it may quote a remote host's words). */
function plainText (text: string): string {
  return Array.from(text.slice(0, 512), c => c < ' ' || c === '\x7f' ? ' ' : c).join('')
}

export interface SendResult {
  ok: boolean
  statusCode: number | null
  latencyMs: number
  /** Why there is no usable answer: a timeout, a refused address, a connection error. */
  error: string | null
}

export interface Sender {
  send: (url: string, headers: Record<string, string>, body: string) => Promise<SendResult>
  close: () => void
}

/** Keeps connections open between deliveries; each sender has its own pools, so one guard setting never reuses another's sockets. */
export function createSender (options: { timeoutMs: number, allowPrivate: boolean, userAgent: string }): Sender {
  const lookup = guardedLookup(options.allowPrivate)
  const agents = {
    'http:': new http.Agent({ keepAlive: true, maxSockets: 32 }),
    'https:': new https.Agent({ keepAlive: true, maxSockets: 32 })
  }

  const send = async (target: string, headers: Record<string, string>, body: string): Promise<SendResult> => {
    const started = performance.now()
    const result = (statusCode: number | null, error: string | null): SendResult =>
      ({ ok: error === null && statusCode !== null && statusCode >= 200 && statusCode < 300, statusCode, latencyMs: Math.round(performance.now() - started), error: error === null ? null : plainText(error) })
    let url: URL
    try {
      url = new URL(target)
    } catch {
      return result(null, 'invalid URL')
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') return result(null, 'not an http(s) URL')
    // A literal address is connected to without a lookup, so it is checked here.
    const host = hostOf(url)
    if (!options.allowPrivate && isIP(host) !== 0 && isRefusedAddress(host)) return result(null, `refused: ${host} is an internal address`)

    return await new Promise<SendResult>((resolve) => {
      let settled = false
      const finish = (statusCode: number | null, error: string | null): void => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        resolve(result(statusCode, error))
      }
      const client = url.protocol === 'https:' ? https : http
      const request = client.request(url, {
        method: 'POST',
        agent: agents[url.protocol as 'http:' | 'https:'],
        lookup,
        headers: {
          ...headers,
          'content-type': 'application/json',
          'content-length': String(Buffer.byteLength(body)),
          'user-agent': options.userAgent
        }
      }, (response) => {
        // The answer's body is not used; read and drop it so the connection can be reused.
        response.resume()
        response.on('end', () => { finish(response.statusCode ?? null, null) })
        response.on('error', (error) => { finish(response.statusCode ?? null, error.message) })
      })
      // One deadline for everything: connecting, sending, and reading the whole answer.
      const timer = setTimeout(() => {
        finish(null, `timed out after ${options.timeoutMs} ms`)
        request.destroy()
      }, options.timeoutMs)
      request.on('error', (error: NodeJS.ErrnoException) => {
        finish(null, error instanceof RefusedAddressError ? `refused: ${error.message}` : (error.code ?? error.message))
      })
      request.end(body)
    })
  }

  return {
    send,
    close: () => { agents['http:'].destroy(); agents['https:'].destroy() }
  }
}
