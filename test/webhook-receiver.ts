import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'

/** One request as a webhook receiver saw it, and what it answered. */
export interface Received {
  headers: IncomingHttpHeaders
  body: string
  id: string
  status: number
  at: number
}

/** What to answer a request: a status, or 'hang' to never answer. */
export type Answer = number | 'hang'

/**
 * A real HTTP receiver on 127.0.0.1. `answer` decides each response; every
 * request is recorded with what it got, so tests can count deliveries per
 * webhook-id.
 */
export class Receiver {
  readonly received: Received[] = []
  answer: (request: { id: string, body: string, n: number }) => Answer | Promise<Answer> = () => 200
  #server: Server
  #sockets = new Set<Socket>()
  #hanging = new Set<ServerResponse>()

  constructor () {
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = []
      req.on('data', (c: Buffer) => chunks.push(c))
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8')
        const id = String(req.headers['webhook-id'] ?? '')
        Promise.resolve(this.answer({ id, body, n: this.received.length })).then((answer) => {
          this.received.push({ headers: req.headers, body, id, status: answer === 'hang' ? 0 : answer, at: Date.now() })
          if (answer === 'hang') { this.#hanging.add(res); return }
          res.writeHead(answer, { 'content-type': 'text/plain' }).end('ok')
        }, () => { res.writeHead(500).end() })
      })
    })
    this.#server.on('connection', (socket) => {
      this.#sockets.add(socket)
      socket.on('close', () => this.#sockets.delete(socket))
    })
  }

  async listen (): Promise<string> {
    await new Promise<void>(resolve => this.#server.listen(0, '127.0.0.1', resolve))
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}/hook`
  }

  get port (): number {
    return (this.#server.address() as AddressInfo).port
  }

  /** Requests answered 2xx, by webhook-id. */
  accepted (): Map<string, number> {
    const counts = new Map<string, number>()
    for (const r of this.received) if (r.status >= 200 && r.status < 300) counts.set(r.id, (counts.get(r.id) ?? 0) + 1)
    return counts
  }

  /** Drops requests left hanging (their connections too). */
  releaseHanging (): void {
    for (const res of this.#hanging) res.destroy()
    this.#hanging.clear()
  }

  async close (): Promise<void> {
    this.releaseHanging()
    for (const socket of this.#sockets) socket.destroy()
    await new Promise<void>(resolve => this.#server.close(() => { resolve() }))
  }
}
