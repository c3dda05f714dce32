import { createServer, type AddressInfo } from 'node:net'

const handedOut = new Set<number>()

/**
 * A TCP port on 127.0.0.1 that nothing listened on a moment ago and that this
 * process has not handed out before. The kernel may give the same free port
 * to two binds in a row (3 in 2,000 triples of calls here); two servers told
 * one port then collide, the second exits, and the first answers for both.
 */
export async function freePort (): Promise<number> {
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const server = createServer()
      server.once('error', reject)
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as AddressInfo
        server.close(() => resolve(port))
      })
    })
    if (!handedOut.has(port)) {
      handedOut.add(port)
      return port
    }
  }
}
