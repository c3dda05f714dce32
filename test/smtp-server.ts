import { writeFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { simpleParser } from 'mailparser'
import selfsigned from 'selfsigned'
import { SMTPServer, type SMTPServerSession } from 'smtp-server'
import { waitFor } from './polling.ts'

/**
 * A real SMTP server for the mail tests (nodemailer's smtp-server): it offers
 * STARTTLS with a certificate made for it at start (127.0.0.1 and localhost),
 * which gatehouse must be told to trust, in-process through the test-only
 * setting `smtpTrustForTests` or, for a child process, NODE_EXTRA_CA_CERTS
 * (`writeCertificate`). What arrives is parsed with mailparser.
 */
export interface ReceivedMail {
  /** Envelope recipients. */
  to: string[]
  from: string
  subject: string
  text: string
  html: string
  /** Every http(s) link of the text part, in order. */
  links: string[]
  /** Whether the conversation had switched to TLS (STARTTLS) before the message. */
  secure: boolean
  headers: Map<string, unknown>
}

export type SmtpMode =
  | 'accept'
  /** 451 to every recipient: try later. */
  | 'refuse-temporarily'
  /** 550 to every recipient: never. */
  | 'refuse-permanently'
  /** Accepts the connection and never greets it. */
  | 'stall'

export class SmtpTestServer {
  readonly received: ReceivedMail[] = []
  mode: SmtpMode = 'accept'
  /** Connections made to this server, whatever happened to them. */
  connections = 0
  /** Recipients refused (by the refusing modes). */
  refusals = 0
  readonly certificate: string
  readonly #server: SMTPServer
  #port = 0
  readonly #stalled: Array<() => void> = []

  private constructor (certificate: string, key: string, startTls: boolean) {
    this.certificate = certificate
    this.#server = new SMTPServer({
      key,
      cert: certificate,
      authOptional: true,
      // Without STARTTLS: a server that offers no TLS at all, which SMTP_REQUIRE_TLS refuses.
      disabledCommands: startTls ? ['AUTH'] : ['AUTH', 'STARTTLS'],
      logger: false,
      size: 1024 * 1024,
      onConnect: (_session, callback) => {
        this.connections++
        if (this.mode === 'stall') {
          this.#stalled.push(() => { callback(new Error('closing')) })
          return
        }
        callback()
      },
      onRcptTo: (address, _session, callback) => {
        if (this.mode === 'refuse-temporarily' || this.mode === 'refuse-permanently') {
          this.refusals++
          // Naming the recipient, as real servers' replies do.
          const error = new Error(`<${address.address}>: ${this.mode === 'refuse-temporarily' ? 'Mailbox busy, try again later' : 'No such mailbox here'}`) as Error & { responseCode: number }
          error.responseCode = this.mode === 'refuse-temporarily' ? 451 : 550
          callback(error)
          return
        }
        callback()
      },
      onData: (stream, session, callback) => {
        this.#receive(stream, session).then(() => { callback() }, (error: Error) => { callback(error) })
      }
    })
    this.#server.on('error', () => {})
  }

  /** `startTls: false` makes a server that does not offer STARTTLS. */
  static async start (options: { startTls?: boolean } = {}): Promise<SmtpTestServer> {
    const pems = await selfsigned.generate([{ name: 'commonName', value: 'localhost' }], {
      keyType: 'ec',
      algorithm: 'sha256',
      extensions: [
        { name: 'basicConstraints', cA: false },
        { name: 'keyUsage', digitalSignature: true, keyEncipherment: true },
        { name: 'extKeyUsage', serverAuth: true },
        { name: 'subjectAltName', altNames: [{ type: 2, value: 'localhost' }, { type: 7, ip: '127.0.0.1' }] }
      ]
    })
    const server = new SmtpTestServer(pems.cert, pems.private, options.startTls !== false)
    await new Promise<void>((resolve, reject) => {
      server.#server.server.once('error', reject)
      server.#server.listen(0, '127.0.0.1', () => { resolve() })
    })
    server.#port = (server.#server.server.address() as AddressInfo).port
    return server
  }

  /** smtp:// (STARTTLS) at this server. */
  get url (): string {
    return `smtp://127.0.0.1:${this.#port}`
  }

  /** Writes the certificate to `path`, for NODE_EXTRA_CA_CERTS. */
  writeCertificate (path: string): string {
    writeFileSync(path, this.certificate)
    return path
  }

  async #receive (stream: NodeJS.ReadableStream, session: SMTPServerSession): Promise<void> {
    const parsed = await simpleParser(stream as unknown as Parameters<typeof simpleParser>[0])
    const text = parsed.text ?? ''
    this.received.push({
      to: session.envelope.rcptTo.map(r => r.address.toLowerCase()),
      from: session.envelope.mailFrom === false ? '' : session.envelope.mailFrom.address,
      subject: parsed.subject ?? '',
      text,
      html: typeof parsed.html === 'string' ? parsed.html : '',
      links: [...text.matchAll(/https?:\/\/[^\s<>"]+/g)].map(m => m[0]),
      secure: session.secure,
      headers: parsed.headers as Map<string, unknown>
    })
  }

  /** The messages received for `address`, oldest first. */
  mailTo (address: string): ReceivedMail[] {
    return this.received.filter(m => m.to.includes(address.toLowerCase()))
  }

  /** Waits (polling, with a deadline) for the `count`-th message to `address`, and returns it. */
  async waitForMail (address: string, options: { count?: number, timeoutMs?: number, subject?: RegExp } = {}): Promise<ReceivedMail> {
    const count = options.count ?? 1
    const matching = (): ReceivedMail[] => this.mailTo(address).filter(m => options.subject === undefined || options.subject.test(m.subject))
    await waitFor(`mail number ${count} to ${address}`, () => matching().length >= count, options.timeoutMs ?? 15_000)
    return matching()[count - 1]!
  }

  /** Lets stalled connections go (they are refused), e.g. before switching back to accepting. */
  releaseStalled (): void {
    for (const release of this.#stalled.splice(0)) release()
  }

  async close (): Promise<void> {
    this.releaseStalled()
    await new Promise<void>(resolve => { this.#server.close(() => { resolve() }) })
  }
}
