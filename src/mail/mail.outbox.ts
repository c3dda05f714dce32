import { hkdfSync, randomBytes } from 'node:crypto'
import { EventEmitter } from 'node:events'
import type { KyselyPlugin, PluginTransformQueryArgs, PluginTransformResultArgs, QueryResult, RootOperationNode, UnknownRow } from 'kysely'
import type { NoticeKind } from '../config.ts'
import type { Db } from '../db/database.ts'
import { deploymentSecret } from '../db/deployment-secrets.ts'
import { newId, nowIso } from '../lib/ids.ts'
import { deviceOf } from '../lib/user-agent.ts'
import { keyId, open, seal, SecretBoxError } from '../lib/secret-box.ts'
import { findMailRecipient, findSessionOrigin, insertMail } from './mail.repository.ts'
import { TEMPLATE_NAMES } from './mail.templates.ts'

/**
 * The mail outbox's entry points, called in the transaction of what the mail
 * tells about, so the message is queued if and only if that commits; the mail
 * worker sends it later, and no HTTP answer waits on SMTP.
 *
 * Whether this deployment sends mail, and which notices, is the app's
 * configuration; it reaches these data-level functions on the database handle
 * itself (a Kysely plugin that changes no query, and that every transaction
 * begun on the handle carries), so neither every caller nor recordEvent
 * needs the configuration passed down. A handle without it (the CLI's own,
 * a test's) queues nothing.
 */
export interface MailPolicy {
  /** SMTP is configured: mail is queued (and sent by some instance's worker). */
  readonly sending: boolean
  readonly notices: ReadonlySet<NoticeKind>
  /** The key payloads are sealed under when the deployment has one outside the database (mailKeyOf); else the database's own. */
  readonly sealKey: Buffer | undefined
}

export class MailPolicyPlugin implements KyselyPlugin {
  readonly policy: MailPolicy
  constructor (policy: MailPolicy) {
    this.policy = policy
  }

  transformQuery (args: PluginTransformQueryArgs): RootOperationNode {
    return args.node
  }

  async transformResult (args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    return args.result
  }
}

export function mailPolicyOf (db: Db): MailPolicy | undefined {
  for (const plugin of db.getExecutor().plugins) if (plugin instanceof MailPolicyPlugin) return plugin.policy
  return undefined
}

const queued = new EventEmitter()
queued.setMaxListeners(0)

/** Wakes this process's worker; only a hint (it may come before the commit), the worker's polling guarantees sending. */
export function onMailQueued (listener: () => void): () => void {
  queued.on('queued', listener)
  return () => { queued.off('queued', listener) }
}

/**
 * The keys that seal payloads, so that what a message carries (a one-time
 * link, the address) is not readable in the outbox table, in an export of it
 * or in a query log; it is erased from the row once the message is sent or
 * given up. With MFA_ENCRYPTION_KEY, which lives in the configuration and
 * never in the database, the key is derived from it (HKDF, its own label), and
 * a dump of the database alone opens nothing. Without it, a secret of the
 * deployment kept in gatehouse_meta.
 */
const KEY_NAME = 'mail_payload_key'
export async function databaseMailKey (db: Db): Promise<Buffer> {
  return Buffer.from(await deploymentSecret(db, KEY_NAME, () => randomBytes(32).toString('base64url')), 'base64url')
}

export function mailKeyOf (mfaEncryptionKey: Buffer | undefined): Buffer | undefined {
  return mfaEncryptionKey === undefined ? undefined : Buffer.from(hkdfSync('sha256', mfaEncryptionKey, Buffer.alloc(0), 'gatehouse mail payload v1', 32))
}

/** What a sealed payload holds. */
export interface MailPayload {
  to: string
  data: Record<string, unknown>
}

/** The context a payload is sealed for: its own row, so a payload copied onto another message does not open. */
export const contextOf = (id: string): string => `mail:${id}`

/**
 * Opens a payload with whichever of `keys` sealed it (the key id is part of
 * the sealed value), so messages queued before MFA_ENCRYPTION_KEY was set
 * still go out after it is. A SecretBoxError when none did.
 */
export function openPayload (keys: Buffer[], id: string, sealed: string): MailPayload {
  const sealedBy = sealed.split('.')[1]
  const key = keys.find(k => keyId(k) === sealedBy)
  if (key === undefined) throw new SecretBoxError('sealed under a key this deployment no longer has')
  return JSON.parse(open(key, sealed, contextOf(id))) as MailPayload
}

export interface MailRequest {
  /** The recipient's address. */
  to: string
  /** A template's name (mail.templates.ts, docs/email.md#templates). */
  template: string
  /** The template's values; sealed in the outbox. */
  data: Record<string, unknown>
  /** The account it is about: its mail goes when it is deleted. */
  userId?: string | null
}

/**
 * Queues one message in the caller's transaction. Returns false, queueing
 * nothing, when this deployment sends no mail (no SMTP_URL): the caller
 * decides what happens instead (docs/email.md#without-smtp).
 */
export async function enqueueMail (trx: Db, mail: MailRequest): Promise<boolean> {
  if (!TEMPLATE_NAMES.has(mail.template)) throw new Error(`there is no mail template ${mail.template}`)
  const policy = mailPolicyOf(trx)
  if (policy?.sending !== true) return false
  const id = newId()
  await insertMail(trx, {
    id,
    user_id: mail.userId ?? null,
    template: mail.template,
    payload: await sealPayload(trx, id, { to: mail.to, data: mail.data }),
    created_at: nowIso()
  })
  queued.emit('queued')
  return true
}

/** Seals a payload for the outbox row `id`, under the deployment's key (see databaseMailKey). */
export async function sealPayload (trx: Db, id: string, payload: MailPayload): Promise<string> {
  return seal(mailPolicyOf(trx)?.sealKey ?? await databaseMailKey(trx), JSON.stringify(payload), contextOf(id))
}

/**
 * Queues a request that the mail worker resolves into a message later, or
 * into none: a row of kind `kind` (not a template) whose sealed payload holds
 * `data`. The worker hands it to the resolver sessions/sign-in.plugin.ts registered for the kind
 * (MailWorker.resolveRequests), which decides and writes in one transaction
 * with the row's change (docs/email.md#password-reset). What a request
 * handler must not decide before answering goes here: the row is the same
 * whatever `data` names, and survives a crash after the answer. Returns
 * false, queueing nothing, without SMTP.
 */
export async function enqueueMailRequest (trx: Db, kind: string, data: Record<string, unknown>): Promise<boolean> {
  if (TEMPLATE_NAMES.has(kind)) throw new Error(`the mail request kind ${kind} is the name of a template`)
  if (mailPolicyOf(trx)?.sending !== true) return false
  const id = newId()
  await insertMail(trx, { id, user_id: null, template: kind, payload: await sealPayload(trx, id, { to: '', data }), created_at: nowIso() })
  // A hint on a later turn of the event loop: what the request names is looked at after its answer is on its way.
  setImmediate(() => { queued.emit('queued') })
  return true
}

/** Whether `enqueueMail` queues anything on this handle. */
export function isMailSending (db: Db): boolean {
  return mailPolicyOf(db)?.sending === true
}

// ---------------------------------------------------------------- security notices

export interface RecordedEvent {
  type: string
  occurredAt: string
  target: { type: string, id: string } | null
  data: Record<string, unknown>
  clientIp: string | null
}

const FACTOR_ADDED: Record<string, string> = { 'user.totp_enrolled': 'totp', 'user.passkey_added': 'passkey' }
const FACTOR_REMOVED: Record<string, string> = { 'user.totp_removed': 'totp', 'user.passkey_removed': 'passkey', 'user.mfa_reset': 'all' }

/**
 * In an event's data, `notices: false` says the change needs no notice: its
 * user made it in a way that already tells them (accepting an invitation sets
 * the first password). Pass it as the lifecycle's `extra`; the event log then
 * shows that no notice went.
 */
export const NO_NOTICES = { notices: false } as const

/** The notices an event calls for, and to whom when not the account's current address. */
function noticesOf (event: RecordedEvent): Array<{ kind: NoticeKind, to?: string, data: Record<string, unknown> }> {
  if (event.data.notices === false) return []
  const notices: Array<{ kind: NoticeKind, to?: string, data: Record<string, unknown> }> = []
  const changes = event.type === 'user.updated' ? event.data.changes as Record<string, unknown> | undefined : undefined
  if (event.type === 'user.password_changed' || changes?.password !== undefined) notices.push({ kind: 'password_changed', data: {} })
  const email = changes?.email as { from: string | null, to: string | null } | undefined
  // To the address it was changed from: the owner there is who must hear of it.
  if (email !== undefined && typeof email.from === 'string') notices.push({ kind: 'email_changed', to: email.from, data: { new_email: email.to ?? '' } })
  // A new name is what the account is signed in with from now on (ASVS 5.0 6.3.6 names it beside the address).
  const username = changes?.username as { from: string, to: string } | undefined
  if (username !== undefined) notices.push({ kind: 'username_changed', data: { old_username: username.from } })
  if (FACTOR_ADDED[event.type] !== undefined) notices.push({ kind: 'factor_added', data: { factor: FACTOR_ADDED[event.type], [`factor_${FACTOR_ADDED[event.type]!}`]: true } })
  if (FACTOR_REMOVED[event.type] !== undefined) notices.push({ kind: 'factor_removed', data: { factor: FACTOR_REMOVED[event.type], [`factor_${FACTOR_REMOVED[event.type]!}`]: true } })
  if (event.type === 'user.login_succeeded' && event.data.new_device === true) notices.push({ kind: 'new_device_sign_in', data: {} })
  return notices
}

/**
 * Queues the security notices an event calls for (docs/email.md#security-notices),
 * in the event's transaction: recordEvent calls it for every event, so every
 * door that changes a password, a factor or an address, or opens a session,
 * notifies the same way. Nothing is queued without SMTP, for a notice
 * switched off, or for an account without an address.
 */
export async function queueNotices (trx: Db, event: RecordedEvent): Promise<void> {
  if (event.target?.type !== 'user') return
  const policy = mailPolicyOf(trx)
  if (policy?.sending !== true) return
  const notices = noticesOf(event).filter(n => policy.notices.has(n.kind))
  if (notices.length === 0) return
  const userId = event.target.id
  const user = await findMailRecipient(trx, userId)
  if (user === undefined) return
  let origin: { client_ip: string | null, user_agent: string | null } | undefined
  for (const notice of notices) {
    const to = notice.to ?? user.email
    if (to === null || to === '') continue
    if (notice.kind === 'new_device_sign_in' && typeof event.data.session_id === 'string') origin ??= await findSessionOrigin(trx, event.data.session_id)
    await enqueueMail(trx, {
      to,
      template: notice.kind,
      userId,
      data: {
        username: user.username,
        at: event.occurredAt,
        client_ip: origin?.client_ip ?? event.clientIp ?? '',
        device: deviceOf(origin?.user_agent ?? null) ?? 'unknown',
        ...notice.data
      }
    })
  }
}
