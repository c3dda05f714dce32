import type { Server } from 'node:http'
import { Server as NetServer, type Socket } from 'node:net'

/**
 * How long, from the start of a stop, connections are still accepted while
 * requests are being answered, and a connection that was opened but has not
 * sent its request yet is waited for. Such a request, once it comes, is
 * answered 503 (Fastify's return503OnClosing); past this the listener is
 * closed, and a connection that has sent nothing is closed unanswered, as it
 * would otherwise hold the stop.
 */
export const FRESH_CONNECTION_GRACE_MS = 2000

/**
 * What a stopping server still owes: requests it is answering, and
 * connections it accepted that have not sent their request yet.
 *
 * Node's `server.close()` closes every connection without a request in
 * progress at once, those whose request has not been read yet included, and
 * the kernel resets the connections still waiting to be accepted: a client
 * whose connection was opened a moment before the stop got a reset instead
 * of an answer (issue 38: 6 of 20 concurrent sign-ins, SIGTERM 40 ms after
 * them; on this two-core machine, with the sign-ins' hashing taking the
 * CPU, up to 18 connections were still in the kernel's queue at the signal).
 * So a stop (`drain`) keeps accepting, and answering 503, while requests are
 * answered and new connections send theirs, for at most
 * FRESH_CONNECTION_GRACE_MS; then it stops accepting and waits until every
 * request is answered (SHUTDOWN_CAP_MS, server.ts, bounds that) and each
 * connection has sent its request or the grace has run out.
 */
export class RequestDrain {
  readonly #server: Server
  readonly #fresh = new Set<Socket>()
  #inFlight = 0
  #changed: (() => void) | undefined

  constructor (server: Server) {
    this.#server = server
    server.on('connection', (socket: Socket) => {
      this.#fresh.add(socket)
      socket.once('close', () => { this.#forget(socket) })
    })
    server.on('request', (request, response) => {
      this.#forget(request.socket)
      this.#inFlight++
      response.once('close', () => {
        this.#inFlight--
        this.#changed?.()
      })
    })
  }

  /** Stops accepting (see the class) and resolves once every request accepted is answered. */
  async drain (graceMs = FRESH_CONNECTION_GRACE_MS): Promise<void> {
    const until = Date.now() + graceMs
    if (this.#server.listening) {
      // A turn of the event loop at least, for the connections the kernel already holds.
      await new Promise(resolve => setImmediate(resolve))
      await this.#until(() => this.#inFlight === 0 && this.#fresh.size === 0, until, true)
      // The listening socket only: Node's http close would also close the connections whose request has not been read yet.
      NetServer.prototype.close.call(this.#server)
    }
    await this.#until(() => this.#inFlight === 0 && (this.#fresh.size === 0 || Date.now() >= until), until, false)
  }

  /** Waits until `done()`, checked on each change; past `until` only if `bounded`, else while requests are in flight. */
  async #until (done: () => boolean, until: number, bounded: boolean): Promise<void> {
    for (;;) {
      if (done() || (bounded && Date.now() >= until)) return
      let timer: NodeJS.Timeout | undefined
      await new Promise<void>(resolve => {
        this.#changed = resolve
        if (bounded || this.#inFlight === 0) timer = setTimeout(resolve, Math.max(0, until - Date.now()))
      }).finally(() => {
        clearTimeout(timer)
        this.#changed = undefined
      })
    }
  }

  #forget (socket: Socket): void {
    if (this.#fresh.delete(socket)) this.#changed?.()
  }
}

/**
 * Makes the app's stop begin by answering every request it accepted (see
 * RequestDrain); returns whether the stop has begun. Call it before anything
 * else adds a preClose hook, so that it runs first.
 */
export function drainRequestsOnClose (app: { server: Server, addHook: (name: 'preClose', hook: () => Promise<void>) => unknown }): () => boolean {
  let stopping = false
  const requests = new RequestDrain(app.server)
  app.addHook('preClose', async () => {
    stopping = true
    await requests.drain()
  })
  return () => stopping
}
