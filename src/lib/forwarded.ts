import type { FastifyRequest } from 'fastify'
import proxyAddr from '@fastify/proxy-addr'

/** Who may set X-Forwarded-*: Fastify's `trustProxy` (when not false), read as Fastify reads it. */
export function trustFunction (trustProxy: true | string): (address: string, hop: number) => boolean {
  if (trustProxy === true) return () => true
  return proxyAddr.compile(trustProxy.split(',').map(entry => entry.trim()))
}

function lastEntry (value: string | string[]): string {
  const joined = Array.isArray(value) ? value.join(',') : value
  return joined.slice(joined.lastIndexOf(',') + 1).trim()
}

/**
 * Gives a request Fastify made without `trustProxy` the client address and
 * protocol the trusted proxy reports, as Fastify's own requests have them.
 * Fastify builds the request it hands `frameworkErrors` (a URL refused before
 * routing) from its plain class, which reads the socket only: such an answer
 * behind a proxy that terminates TLS would go without HSTS, and its access
 * line would name the proxy instead of the client.
 */
export function withForwarding (request: FastifyRequest, trust: (address: string, hop: number) => boolean): FastifyRequest {
  const addresses = proxyAddr.all(request.raw, trust)
  const socketAddress = request.raw.socket?.remoteAddress
  const proto = request.headers['x-forwarded-proto']
  Object.defineProperty(request, 'ip', { value: addresses[addresses.length - 1], configurable: true })
  if (proto !== undefined && socketAddress !== undefined && trust(socketAddress, 0)) {
    Object.defineProperty(request, 'protocol', { value: lastEntry(proto), configurable: true })
  }
  return request
}
