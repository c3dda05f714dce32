import { randomUUID } from 'node:crypto'
import type { FastifyBaseLogger } from 'fastify'
import type { Transporter } from 'nodemailer'
import type SMTPTransport from 'nodemailer/lib/smtp-transport/index.js'
import { SYSTEM_CONTEXT } from '../auth/principal.ts'
import type { Config } from '../config.ts'
import type { Db } from '../db/database.ts'
import { recordEvent } from '../events/events.repository.ts'
import { publicBase, publicLink } from '../lib/public-url.ts'
import { databaseMailKey, mailKeyOf, onMailQueued, openPayload, sealPayload, type MailRequest } from './mail.outbox.ts'
import { PollingLoop } from '../lib/polling-loop.ts'
import { claimMails, completeMail, deleteClaimedRequest, turnRequestIntoMail, type MailRow } from './mail.repository.ts'
import { TemplateError, withReadableTimes, type MailTemplates } from './mail.templates.ts'
import { SecretBoxError } from '../lib/secret-box.ts'
import { inSpan } from '../lib/tracing.ts'

export type MailWorkerSettings = Pick<Config,
  'smtpUrl' | 'smtpRequireTls' | 'mailFrom' | 'mailDkim' | 'mailTimeoutMs' | 'mailPollIntervalMs' | 'mailRetryBaseMs' |
  'mailRetryMaxDelayMs' | 'mailRetryHorizonMs' | 'productName' | 'publicUrl' | 'host' | 'port' | 'basePath' | 'smtpTrustForTests' | 'mfaKeyRing'>

export interface MailObservation {
  outcome: 'sent' | 'retry' | 'failed'
  /** The SMTP conversation's duration. */
  seconds: number
  /** From queueing to this message's sending; undefined unless sent. */
  lagSeconds: number | undefined
}

/**
 * One conversation's hard deadline. nodemailer's timeouts are per step (and
 * the socket's is for silence), so a server that answers slowly enough could
 * otherwise outlast the worker's lease, and another instance would send the
 * message too.
 */
function sendDeadlineMsOf (settings: Pick<MailWorkerSettings, 'mailTimeoutMs'>): number {
  return 3 * settings.mailTimeoutMs
}

/** Messages one instance sends at once. */
const CONCURRENCY = 4
/** At shutdown, how long messages in flight may take to finish before their conversations are cut (they are sent again later). */
const STOP_GRACE_MS = 5000

/** The delay before retry number `attempts`: doubling from the base, capped, with jitter. */
export function mailRetryDelayMs (attempts: number, settings: Pick<MailWorkerSettings, 'mailRetryBaseMs' | 'mailRetryMaxDelayMs'>, random = Math.random()): number {
  const exponential = Math.min(settings.mailRetryBaseMs * 2 ** Math.min(attempts - 1, 40), settings.mailRetryMaxDelayMs)
  return Math.round(exponential * (0.5 + random * 0.5))
}

/**
 * The nodemailer transport SMTP_URL describes (docs/email.md#settings).
 * nodemailer is loaded here, when SMTP is configured: outside the bundle
 * (scripts/build.js), so a deployment without mail neither loads nor compiles it.
 */
export async function createTransport (settings: MailWorkerSettings): Promise<Transporter<SMTPTransport.SentMessageInfo>> {
  const { default: nodemailer } = await import('nodemailer')
  const url = new URL(settings.smtpUrl!)
  const implicitTls = url.protocol === 'smtps:'
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1')
  const options: SMTPTransport.Options = {
    host,
    port: url.port !== '' ? Number(url.port) : implicitTls ? 465 : 587,
    secure: implicitTls,
    // STARTTLS or nothing: a server that does not offer it (or a man in the middle
    // who strips the offer) gets no message, and no password.
    requireTLS: !implicitTls && settings.smtpRequireTls,
    ...(url.username !== '' ? { auth: { user: decodeURIComponent(url.username), pass: decodeURIComponent(url.password) } } : {}),
    connectionTimeout: settings.mailTimeoutMs,
    greetingTimeout: settings.mailTimeoutMs,
    socketTimeout: settings.mailTimeoutMs,
    // Node's TLS defaults (nodemailer adds no CAs of its own): Node's CA store plus NODE_EXTRA_CA_CERTS, the host name checked.
    tls: {
      minVersion: 'TLSv1.2',
      ...(settings.smtpTrustForTests !== undefined ? { ca: settings.smtpTrustForTests } : {})
    },
    ...(settings.mailDkim !== undefined
      ? { dkim: { domainName: settings.mailDkim.domain, keySelector: settings.mailDkim.selector, privateKey: settings.mailDkim.privateKey } }
      : {}),
    disableFileAccess: true,
    disableUrlAccess: true
  }
  return nodemailer.createTransport(options)
}

interface SendError {
  message: string
  permanent: boolean
  /** The failure was the connection's or the server's (greeting, TLS, login, sender), not this message's or its recipient's. */
  ofServer?: boolean
}

/** A test message the SMTP server did not take; the message is its reason. */
export class MailTestError extends Error {}

/**
 * Sends a short test message to `to` at once, past the outbox (the console's
 * Send a test mail and `gatehouse mail test`), and returns the server's
 * answer (`250 … queued as …`); throws MailTestError with the reason when the
 * server refuses it or cannot be reached.
 */
export async function sendTestMessage (transport: Transporter<SMTPTransport.SentMessageInfo>, settings: MailWorkerSettings, to: string): Promise<string> {
  try {
    const info = await inSpan('smtp send', { client: true, attributes: { 'gatehouse.mail.template': 'test' } }, async () => await transport.sendMail({
      from: settings.mailFrom,
      to,
      subject: `${settings.productName}: test message`,
      text: `This is a test message from ${settings.productName} at ${publicBase(settings)}.\nIt arrived, so mail from this deployment reaches this address.\n`,
      signal: AbortSignal.timeout(sendDeadlineMsOf(settings))
    }))
    return info.response
  } catch (caught) {
    throw new MailTestError(sendErrorOf(caught).message)
  }
}

/**
 * Decides what a queued request (mail.outbox.ts, enqueueMailRequest) comes
 * to, given what it was queued with: the message to send, or none. It writes
 * what goes with that decision (a token, an event) in `trx`, the transaction
 * that also turns the request's row into the message or removes it, so a
 * crash before that commits leaves the request to be resolved again, and one
 * after it leaves an ordinary message. sessions/sign-in.plugin.ts registers one per kind: the
 * worker imports no service. The resolver is made for each request before
 * the transaction opens: work that must not hold the database (an argon2id
 * hash would hold SQLite's one connection) is done then.
 */
export type MailRequestResolver = () => Promise<(trx: Db, data: Record<string, unknown>) => Promise<MailRequest | undefined>>

/** Thrown in a resolving transaction to roll it back when the request's claim has passed to another worker. */
class ClaimLost extends Error {}

/**
 * A refusal the server says is final for this message (5xx to the recipient,
 * RCPT TO, or to the message, DATA) gives the message up. Anything else is
 * retried: a 4xx, a connection that failed or stalled, and a 5xx to the
 * sender (MAIL FROM), the login or the greeting, which are the deployment's
 * to fix and would otherwise give up every message while they are wrong.
 */
function sendErrorOf (error: unknown): SendError {
  const e = error as { responseCode?: number, command?: string, code?: string, message?: string }
  const code = e.responseCode
  const permanent = code !== undefined && code >= 500 && code < 600 && (e.command === 'RCPT TO' || e.command === 'DATA')
  // The server's reply, or the failure's name: never the message, which may hold a link, and no
  // address, which replies often quote (events and logs must not name whom mail was meant for).
  const message = code !== undefined ? `${e.command ?? 'SMTP'}: ${String(e.message ?? code)}` : `${e.code ?? 'error'}: ${String(e.message ?? '')}`
  const ofServer = e.command !== 'RCPT TO' && e.command !== 'DATA'
  // One line: a server's reply may span several, and the reason is shown in /readyz and the console.
  return { message: message.replace(/[^\s<>()[\]"',;:]+@[^\s<>()[\]"',;]+/g, '[address]').replace(/\s+/g, ' ').trim().slice(0, 300), permanent, ofServer }
}

/**
 * Sends queued mail: claims due messages (a lease, so a crashed worker's
 * claims are taken over once they run out), renders and sends each, and
 * records the outcome; the payload is erased once a message is sent or given
 * up. Every instance with SMTP configured runs one; on PostgreSQL they share
 * the queue through FOR UPDATE SKIP LOCKED.
 */
export class MailWorker {
  readonly #db: Db
  readonly #settings: MailWorkerSettings
  readonly #log: FastifyBaseLogger
  readonly #templates: MailTemplates
  readonly #transport: Transporter<SMTPTransport.SentMessageInfo>
  /** Long enough for the slowest SMTP conversation (cut at #sendDeadlineMs), with room for recording the result. */
  readonly #leaseMs: number
  /** One conversation's hard deadline (sendDeadlineMsOf). */
  readonly #sendDeadlineMs: number
  /** Cuts the conversations in flight when a stop has waited STOP_GRACE_MS. */
  #cut = new AbortController()
  readonly #observers: Array<(observation: MailObservation) => void> = []
  readonly #resolvers = new Map<string, MailRequestResolver>()
  /** The keys payloads may be sealed under: the configured one first, then the database's. */
  #keys: Buffer[] | undefined
  readonly #loop: PollingLoop
  #unsubscribe: (() => void) | undefined
  /** This instance's view of its SMTP server: undefined until checked or used, then `ok` or the last failure's reason. */
  #health: string | undefined

  constructor (db: Db, settings: MailWorkerSettings, templates: MailTemplates, log: FastifyBaseLogger, transport: Transporter<SMTPTransport.SentMessageInfo>) {
    this.#db = db
    this.#settings = settings
    this.#templates = templates
    this.#log = log
    this.#sendDeadlineMs = sendDeadlineMsOf(settings)
    this.#leaseMs = this.#sendDeadlineMs + 5000
    this.#transport = transport
    this.#loop = new PollingLoop(async () => { await this.#cycle() }, settings.mailPollIntervalMs)
  }

  static async create (db: Db, settings: MailWorkerSettings, templates: MailTemplates, log: FastifyBaseLogger): Promise<MailWorker> {
    return new MailWorker(db, settings, templates, log, await createTransport(settings))
  }

  onAttempt (observer: (observation: MailObservation) => void): void {
    this.#observers.push(observer)
  }

  /** Resolves queued requests of `kind` with `resolver` (see MailRequestResolver). */
  resolveRequests (kind: string, resolver: MailRequestResolver): void {
    this.#resolvers.set(kind, resolver)
  }

  start (): void {
    if (!this.#loop.stopped) return
    this.#cut = new AbortController()
    this.#unsubscribe = onMailQueued(() => { this.#loop.wake() })
    this.#loop.start()
    // Checked at once, so a setting that cannot work is in the log at start rather than at the first invitation; the start does not wait.
    this.checkConnection().catch(() => {})
  }

  /**
   * `ok`, or why this instance's last conversation with the SMTP server
   * failed (its connection, TLS, login or a refusal to the sender): what
   * /readyz reports as `checks.mail`. Undefined before the first check.
   */
  get health (): string | undefined {
    return this.#health
  }

  /**
   * Connects, greets, upgrades to TLS where SMTP_REQUIRE_TLS asks, and logs in
   * (nodemailer's verify), sending nothing. A failure is logged at `error`
   * with the reason; the service goes on, and the outbox keeps the mail.
   */
  async checkConnection (): Promise<string> {
    try {
      await this.#transport.verify()
      this.#health = 'ok'
    } catch (caught) {
      this.#health = sendErrorOf(caught).message
      this.#log.error({ error: this.#health }, 'the SMTP server cannot be used: mail waits in the outbox until it can (docs/email.md#when-mail-fails)')
    }
    return this.#health
  }

  /** sendTestMessage through this worker's transport; its outcome is this instance's mail health too. */
  async sendTest (to: string): Promise<string> {
    try {
      const answer = await sendTestMessage(this.#transport, this.#settings, to)
      this.#health = 'ok'
      return answer
    } catch (caught) {
      if (caught instanceof MailTestError) this.#health = caught.message
      throw caught
    }
  }

  /**
   * Stops claiming, and waits for the messages in flight: for STOP_GRACE_MS,
   * then their conversations are cut and they are recorded as to be tried again,
   * well within the shutdown's cap (server.ts).
   */
  async stop (): Promise<void> {
    this.#unsubscribe?.()
    const ending = this.#loop.stop()
    const cut = setTimeout(() => { this.#cut.abort(new Error('the service is stopping')) }, STOP_GRACE_MS)
    try {
      await ending
    } finally {
      clearTimeout(cut)
    }
    this.#transport.close()
  }

  async #cycle (): Promise<void> {
    try {
      if (this.#keys === undefined) {
        // Every key of the ring opens what it sealed; the database's own, what was queued before MFA_ENCRYPTION_KEY was set.
        this.#keys = [...this.#settings.mfaKeyRing.map(key => mailKeyOf(key)!), await databaseMailKey(this.#db)]
      }
      while (!this.#loop.stopped) {
        const now = Date.now()
        const claimed = await claimMails(this.#db, {
          now: new Date(now).toISOString(),
          leaseUntil: new Date(now + this.#leaseMs).toISOString(),
          token: randomUUID(),
          limit: CONCURRENCY
        })
        if (claimed.length === 0) return
        this.#loop.found()
        await Promise.all(claimed.map(async mail => {
          try {
            const resolver = this.#resolvers.get(mail.template)
            const message = resolver !== undefined ? await this.#resolve(mail, resolver, this.#keys!) : mail
            if (message !== undefined) await this.#send(message, this.#keys!)
          } catch (err) {
            // Left claimed: the lease runs out and the message is tried again.
            this.#log.warn({ err, mail: mail.id }, 'could not record a mail attempt')
          }
        }))
        if (claimed.length < CONCURRENCY) return
      }
    } catch (err) {
      this.#log.warn({ err }, 'mail cycle failed; will try again')
    }
  }

  async #send (mail: MailRow, keys: Buffer[]): Promise<void> {
    const started = Date.now()
    let error: SendError | undefined
    if (mail.payload === null) {
      error = { message: 'the message has no payload', permanent: true }
    } else {
      try {
        const { to, data } = openPayload(keys, mail.id, mail.payload)
        const rendered = this.#templates.render(mail.template, {
          ...withReadableTimes(data),
          product_name: this.#settings.productName,
          public_url: publicBase(this.#settings),
          account_url: publicLink(this.#settings, '/account')
        })
        await inSpan('smtp send', { client: true, attributes: { 'gatehouse.mail.template': mail.template } }, async () => await this.#transport.sendMail({
          from: this.#settings.mailFrom,
          to,
          subject: rendered.subject,
          text: rendered.text,
          html: rendered.html,
          signal: AbortSignal.any([AbortSignal.timeout(this.#sendDeadlineMs), this.#cut.signal])
        }))
      } catch (caught) {
        error = caught instanceof SecretBoxError
          ? { message: `the payload does not open: ${caught.message}`, permanent: true }
          : caught instanceof TemplateError ? { message: caught.message, permanent: true } : sendErrorOf(caught)
      }
    }
    // A refusal of one recipient says nothing of the server; anything else that failed does.
    if (error === undefined) this.#health = 'ok'
    else if (error.ofServer === true) this.#health = error.message
    await this.#record(mail, error, started, true)
  }

  /**
   * Resolves a claimed request: the message it became (still claimed by this
   * worker, to be sent next), or undefined when it came to none, was recorded
   * as to be tried again (a failure: back-off as for a send), or was taken
   * over by another worker. Nothing the request holds is logged: it may name
   * an account that does not exist.
   */
  async #resolve (mail: MailRow, resolver: MailRequestResolver, keys: Buffer[]): Promise<MailRow | undefined> {
    const started = Date.now()
    if (mail.payload === null) {
      await this.#record(mail, { message: 'the request has no payload', permanent: true }, started, false)
      return undefined
    }
    let data: Record<string, unknown>
    try {
      data = openPayload(keys, mail.id, mail.payload).data
    } catch (caught) {
      if (!(caught instanceof SecretBoxError)) throw caught
      await this.#record(mail, { message: `the payload does not open: ${caught.message}`, permanent: true }, started, false)
      return undefined
    }
    const leaseUntil = new Date(Date.now() + this.#leaseMs).toISOString()
    try {
      const resolveIn = await resolver()
      return await this.#db.transaction().execute(async trx => {
        const message = await resolveIn(trx, data)
        if (message === undefined) {
          if (!await deleteClaimedRequest(trx, mail.id, mail.lock_token!)) throw new ClaimLost()
          return undefined
        }
        const payload = await sealPayload(trx, mail.id, { to: message.to, data: message.data })
        const userId = message.userId ?? null
        if (!await turnRequestIntoMail(trx, mail.id, mail.lock_token!, { template: message.template, userId, payload, leaseUntil })) throw new ClaimLost()
        return { ...mail, template: message.template, user_id: userId, payload, locked_until: leaseUntil }
      })
    } catch (caught) {
      if (caught instanceof ClaimLost) return undefined
      // The error's message only (a database's failure), never the request's values.
      this.#log.warn({ mail: mail.id, kind: mail.template, error: caught instanceof Error ? caught.message : String(caught) }, 'could not resolve a mail request; will try again')
      await this.#record(mail, { message: 'the request could not be resolved', permanent: false }, started, false)
      return undefined
    }
  }

  /** Records an attempt's outcome if the claim still holds: sent, to be tried again, or given up (`mail.sent`, `mail.failed`). */
  async #record (mail: MailRow, error: SendError | undefined, started: number, observed: boolean): Promise<void> {
    const done = Date.now()
    const createdAt = new Date(mail.created_at).getTime()
    const givingUp = error !== undefined && (error.permanent || done >= createdAt + this.#settings.mailRetryHorizonMs)
    const status = error === undefined ? 'sent' : givingUp ? 'failed' : 'pending'
    const at = new Date(done).toISOString()
    const recorded = await this.#db.transaction().execute(async trx => {
      const ours = await completeMail(trx, mail.id, mail.lock_token!, {
        status,
        at,
        nextAttemptAt: status === 'pending' ? new Date(done + mailRetryDelayMs(mail.attempts + 1, this.#settings)).toISOString() : at,
        error: error?.message ?? null
      })
      if (!ours || status === 'pending') return ours
      await recordEvent(trx, SYSTEM_CONTEXT, status === 'sent' ? 'mail.sent' : 'mail.failed', mail.user_id !== null ? { type: 'user', id: mail.user_id } : null, {
        mail_id: mail.id,
        template: mail.template,
        attempts: mail.attempts + 1,
        ...(error !== undefined ? { error: error.message } : {})
      })
      return true
    })
    if (!recorded) return
    if (error !== undefined) this.#log.warn({ mail: mail.id, template: mail.template, attempts: mail.attempts + 1, error: error.message, givenUp: givingUp }, 'mail not sent')
    if (!observed) return
    for (const observe of this.#observers) {
      observe({
        outcome: status === 'sent' ? 'sent' : status === 'failed' ? 'failed' : 'retry',
        seconds: (done - started) / 1000,
        lagSeconds: status === 'sent' ? (done - createdAt) / 1000 : undefined
      })
    }
  }
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The mail worker; undefined when no SMTP is configured. */
    mail: MailWorker | undefined
  }
}
