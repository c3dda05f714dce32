import http from 'node:http'
import https from 'node:https'
import { isIP } from 'node:net'
import { guardedLookup, hostOf, isRefusedAddress, RefusedAddressError } from './ssrf-guard.ts'
import { inSpan } from './tracing.ts'

/** What an outgoing request may carry: the subset of fetch's options that openid-client uses. */
export interface GuardedFetchOptions {
  method?: string
  headers?: Record<string, string>
  body?: ArrayBuffer | Uint8Array | string | URLSearchParams | ReadableStream | null
  signal?: AbortSignal | undefined
  redirect?: 'manual'
}

/**
 * Connection pools per guard setting: a socket is only reused for the setting
 * it was checked under (the pool's key is the host and port, not the lookup).
 */
const AGENTS = new Map<boolean, { 'http:': http.Agent, 'https:': https.Agent }>()
function agentsFor (allowPrivate: boolean): { 'http:': http.Agent, 'https:': https.Agent } {
  let agents = AGENTS.get(allowPrivate)
  if (agents === undefined) {
    agents = { 'http:': new http.Agent({ keepAlive: true }), 'https:': new https.Agent({ keepAlive: true }) }
    AGENTS.set(allowPrivate, agents)
  }
  return agents
}

/** An answer larger than this is not metadata, keys or tokens; reading stops there. */
const MAX_BODY_BYTES = 1_048_576

async function bodyBytes (body: GuardedFetchOptions['body']): Promise<Buffer | undefined> {
  if (body === undefined || body === null) return undefined
  if (typeof body === 'string' || body instanceof URLSearchParams) return Buffer.from(body.toString())
  if (body instanceof ArrayBuffer) return Buffer.from(body)
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength)
  return Buffer.from(await new Response(body).arrayBuffer())
}

/**
 * A fetch for requests to addresses an administrator typed: it connects only
 * to the addresses the guard passed for this very connection (no separate
 * lookup a name could answer differently, DNS rebinding), refuses literal
 * internal addresses, and follows no redirects. With `allowPrivate` the
 * guard is off and it is a plain HTTP client.
 */
export function guardedFetch (allowPrivate: boolean): (url: string, options?: GuardedFetchOptions) => Promise<Response> {
  const lookup = guardedLookup(allowPrivate)
  const agents = agentsFor(allowPrivate)
  return async (target, options = {}) => {
    const url = new URL(target)
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError(`${url.protocol} is not an http(s) URL`)
    const host = hostOf(url)
    // A literal address is connected to without a lookup, so it is checked here.
    if (!allowPrivate && isIP(host) !== 0 && isRefusedAddress(host)) throw new RefusedAddressError(`${host} is an internal address`)
    options.signal?.throwIfAborted()
    const body = await bodyBytes(options.body)
    const client = url.protocol === 'https:' ? https : http
    const method = options.method ?? 'GET'
    // The query is left out of the span: an OpenID provider's URLs carry no secrets there, but what an administrator typed might.
    return await inSpan(method, { client: true, attributes: { 'http.request.method': method, 'url.full': `${url.origin}${url.pathname}`, 'server.address': host } }, async (span, traceHeaders) => {
      const response = await requestOnce(client, url, { ...options, method, headers: { ...options.headers, ...traceHeaders } }, body, lookup, agents)
      span.set({ 'http.response.status_code': response.status })
      return response
    })
  }
}

/** One request, connected through the guarded lookup, its whole answer read (up to MAX_BODY_BYTES). */
function requestOnce (client: typeof http | typeof https, url: URL, options: GuardedFetchOptions & { method: string }, body: Buffer | undefined, lookup: ReturnType<typeof guardedLookup>, agents: { 'http:': http.Agent, 'https:': https.Agent }): Promise<Response> {
  return new Promise<Response>((resolve, reject) => {
    const request = client.request(url, {
      method: options.method,
      headers: { ...options.headers, ...(body !== undefined ? { 'content-length': String(body.length) } : {}) },
      lookup,
      agent: agents[url.protocol as 'http:' | 'https:'],
      ...(options.signal !== undefined ? { signal: options.signal } : {})
    }, (response) => {
      const chunks: Buffer[] = []
      let size = 0
      response.on('data', (chunk: Buffer) => {
        size += chunk.length
        if (size > MAX_BODY_BYTES) {
          request.destroy(new Error(`the answer from ${url.host} is larger than ${MAX_BODY_BYTES} bytes`))
          return
        }
        chunks.push(chunk)
      })
      response.on('error', reject)
      response.on('end', () => {
        const headers = new Headers()
        for (const [name, value] of Object.entries(response.headers)) {
          if (value === undefined) continue
          for (const one of Array.isArray(value) ? value : [value]) headers.append(name, one)
        }
        const status = response.statusCode ?? 502
        // A Response cannot carry a body with these statuses.
        const empty = status === 204 || status === 304 || (status >= 100 && status < 200)
        resolve(new Response(empty ? null : Buffer.concat(chunks), { status, statusText: response.statusMessage ?? '', headers }))
      })
    })
    request.on('error', reject)
    request.end(body)
  })
}
