import { lookup as dnsLookup, type LookupAddress } from 'node:dns'
import { BlockList, isIP, type LookupFunction } from 'node:net'

/**
 * The SSRF guard for requests this service makes to addresses an
 * administrator typed (webhook endpoints, OIDC issuers): internal addresses
 * are refused when saved, and again as each connection is made.
 */

const REFUSED = new BlockList()
for (const [network, prefix] of [
  ['0.0.0.0', 8], // "this network", including the unspecified address
  ['10.0.0.0', 8],
  ['100.64.0.0', 10], // carrier-grade NAT
  ['127.0.0.0', 8],
  ['169.254.0.0', 16], // link-local, including cloud metadata services
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['224.0.0.0', 4], // multicast
  ['240.0.0.0', 4] // reserved, and the broadcast address
] as const) REFUSED.addSubnet(network, prefix, 'ipv4')
for (const [network, prefix] of [
  ['::', 128], // unspecified
  ['::1', 128],
  ['fe80::', 10], // link-local
  ['fec0::', 10], // site-local (deprecated, still routed internally in places)
  ['fc00::', 7], // unique local
  ['ff00::', 8] // multicast
] as const) REFUSED.addSubnet(network, prefix, 'ipv6')

/** The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), which is where it really leads. */
function embeddedIpv4 (address: string): string | undefined {
  const bytes = ipv6Bytes(address)
  if (bytes === undefined) return undefined
  const v4 = (offset: number): string => Array.from(bytes.subarray(offset, offset + 4)).join('.')
  const zero = (from: number, to: number): boolean => bytes.subarray(from, to).every(b => b === 0)
  if (zero(0, 10) && bytes[10] === 0xff && bytes[11] === 0xff) return v4(12) // ::ffff:a.b.c.d
  if (zero(0, 12)) return v4(12) // ::a.b.c.d (deprecated "compatible")
  if (bytes[0] === 0x00 && bytes[1] === 0x64 && bytes[2] === 0xff && bytes[3] === 0x9b && zero(4, 12)) return v4(12) // 64:ff9b::/96
  if (bytes[0] === 0x20 && bytes[1] === 0x02) return v4(2) // 2002::/16
  return undefined
}

function ipv6Bytes (address: string): Uint8Array | undefined {
  let text = address.split('%')[0]!
  // A trailing dotted IPv4 part becomes two hex groups.
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)
  if (dotted !== null) {
    const [a, b, c, d] = dotted[1]!.split('.').map(Number) as [number, number, number, number]
    text = text.slice(0, -dotted[1]!.length) + `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const [head, tail] = text.includes('::') ? text.split('::') as [string, string] : [text, undefined]
  const headGroups = head === '' ? [] : head.split(':')
  const tailGroups = tail === undefined || tail === '' ? [] : tail.split(':')
  const missing = 8 - headGroups.length - tailGroups.length
  if (missing < 0 || (tail === undefined && missing !== 0)) return undefined
  const groups = [...headGroups, ...Array<string>(missing).fill('0'), ...tailGroups]
  const bytes = new Uint8Array(16)
  groups.forEach((group, i) => {
    const value = Number.parseInt(group, 16)
    bytes[i * 2] = value >> 8
    bytes[i * 2 + 1] = value & 0xff
  })
  return bytes
}

/**
 * Whether an address leads somewhere outgoing requests may not go: loopback,
 * private, link-local, unique-local, multicast, unspecified or reserved,
 * also when written as IPv6 around an IPv4 address.
 */
export function isRefusedAddress (address: string): boolean {
  const family = isIP(address)
  if (family === 4) return REFUSED.check(address, 'ipv4')
  if (family !== 6) return true
  const inner = embeddedIpv4(address)
  if (inner !== undefined) return REFUSED.check(inner, 'ipv4')
  return REFUSED.check(address, 'ipv6')
}

export class RefusedAddressError extends Error {
  readonly code = 'EADDRREFUSED'
}

/** The URL's host without IPv6 brackets. */
export function hostOf (url: URL): string {
  return url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
}

/**
 * Every address the URL's host has now, each checked. Used when an address
 * is saved; connections check again as they connect (guardedLookup), since a
 * name can be made to point elsewhere later (DNS rebinding).
 */
export async function checkDestination (url: URL, allowPrivate: boolean): Promise<void> {
  const host = hostOf(url)
  const addresses = isIP(host) !== 0
    ? [host]
    : (await new Promise<LookupAddress[]>((resolve, reject) => {
        dnsLookup(host, { all: true, verbatim: true }, (error, found) => { if (error !== null) reject(error); else resolve(found) })
      })).map(a => a.address)
  if (allowPrivate) return
  const refused = addresses.find(isRefusedAddress)
  if (refused !== undefined) throw new RefusedAddressError(`${host} leads to ${refused}, an internal address`)
}

/**
 * The resolver for outgoing connections: resolves as usual, and refuses the
 * connection if any address is internal. Checking the addresses the socket
 * connects to (not a separate lookup before it) leaves no gap for a name to
 * change its answer in between.
 */
export function guardedLookup (allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    dnsLookup(hostname, { ...options, all: true }, (error, addresses) => {
      if (error !== null) { callback(error, '', 0); return }
      const refused = allowPrivate ? undefined : addresses.find(a => isRefusedAddress(a.address))
      if (refused !== undefined) {
        callback(new RefusedAddressError(`${hostname} leads to ${refused.address}, an internal address`), '', 0)
        return
      }
      if (options.all === true) (callback as unknown as (e: null, a: LookupAddress[]) => void)(null, addresses)
      else callback(null, addresses[0]!.address, addresses[0]!.family)
    })
  }
}
