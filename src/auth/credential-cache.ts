import { hash } from 'node:crypto'
import {
  DeleteQueryNode, RawNode, UpdateQueryNode, sql,
  type KyselyPlugin, type PluginTransformQueryArgs, type PluginTransformResultArgs, type QueryResult, type RootOperationNode, type UnknownRow
} from 'kysely'
import type pg from 'pg'
import type { FastifyBaseLogger } from 'fastify'
import type { Config } from '../config.ts'
import { isPostgres, type Db } from '../db/database.ts'
import type { Principal } from './principal.ts'
import { loadPg } from '../db/pg-driver.ts'

/**
 * Checked credentials (API keys, session tokens), kept in process for at most
 * CREDENTIAL_CACHE_TTL_MS, so a busy client costs one database read per TTL
 * instead of one per request.
 *
 * How a change stops taking effect:
 * - In this process: any update or delete of users, api_keys or sessions made
 *   through this app's database handle empties the cache when the statement
 *   has run (`writesPlugin`), so the next request reads the database again.
 * - PostgreSQL, other instances and the CLI: triggers (migration 0007) send
 *   NOTIFY on commit; a dedicated connection listens and empties the cache.
 *   While that connection is down (not yet up, lost, reconnecting), nothing is
 *   read from or kept in the cache: every request reads the database.
 * - SQLite: other processes' commits (the CLI on the same file) are noticed
 *   through `PRAGMA data_version`, read once a second.
 * - In every case an entry lives at most the TTL and never past the
 *   credential's own expiry or idle time-out: that is the bound when a notice
 *   is lost without the connection failing.
 *
 * A read that started before an emptying is not kept (the generation check),
 * so a check racing a revocation cannot put the old answer back.
 */
export class CredentialCache {
  readonly #ttlMs: number
  readonly #maxEntries: number
  readonly #entries = new Map<string, { principal: Principal, until: number }>()
  #generation = 0
  /** False while invalidation cannot be trusted (PostgreSQL listener down). */
  #live: boolean

  constructor (ttlMs: number, live: boolean, maxEntries = 10_000) {
    this.#ttlMs = ttlMs
    this.#live = live && ttlMs > 0
    this.#maxEntries = maxEntries
  }

  get enabled (): boolean { return this.#live }

  /** The key entries are stored under: the secret's digest, so the heap holds no credential longer than a request does. */
  static keyOf (secret: string): string {
    // One-shot: no Hash object per request.
    return hash('sha256', secret, 'base64')
  }

  get (key: string, now = Date.now()): Principal | undefined {
    if (!this.#live) return undefined
    const entry = this.#entries.get(key)
    if (entry === undefined) return undefined
    if (entry.until <= now) {
      this.#entries.delete(key)
      return undefined
    }
    return entry.principal
  }

  /** Taken before the database read whose answer `set` may keep. */
  generation (): number { return this.#generation }

  set (key: string, principal: Principal, generation: number, now = Date.now()): void {
    if (!this.#live || generation !== this.#generation) return
    const until = Math.min(now + this.#ttlMs, principal.validUntil ?? Infinity)
    if (until <= now) return
    if (this.#entries.size >= this.#maxEntries) this.#entries.delete(this.#entries.keys().next().value!)
    this.#entries.set(key, { principal, until })
  }

  clear (): void {
    this.#generation++
    this.#entries.clear()
  }

  /** Down: bypass the cache until `up()`; up: start again from empty. */
  setLive (live: boolean): void {
    this.clear()
    this.#live = live && this.#ttlMs > 0
  }

  get size (): number { return this.#entries.size }
}

/**
 * Per table, the columns whose updates only record use or sign-in bookkeeping (as the triggers of migrations
 * 0007 and 0020 do). `last_login_at` is here because every successful sign-in writes it: counted as a
 * change, a sign-in storm emptied the cache at each sign-in and sent the gate's checks back to the database.
 */
const CREDENTIAL_TABLES = new Map([
  ['api_keys', new Set(['last_used_at'])],
  ['sessions', new Set(['last_seen_at'])],
  ['users', new Set(['failed_logins', 'locked_until', 'last_login_at'])]
])
const WRITE_SQL = /\b(update|delete)\b/i

function tableOf (node: RootOperationNode): string | undefined {
  if (UpdateQueryNode.is(node)) {
    const table = node.table
    return table !== undefined && 'table' in table ? (table as { table: { identifier: { name: string } } }).table.identifier.name : undefined
  }
  if (DeleteQueryNode.is(node)) {
    const from = node.from.froms[0]
    return from !== undefined && 'table' in from ? (from as { table: { identifier: { name: string } } }).table.identifier.name : undefined
  }
  return undefined
}

/** Whether a statement may end or narrow a credential; unknown raw SQL that updates or deletes counts. */
function mayChangeCredentials (node: RootOperationNode): boolean {
  if (UpdateQueryNode.is(node) || DeleteQueryNode.is(node)) {
    const table = tableOf(node)
    if (table === undefined) return true
    const bookkeeping = CREDENTIAL_TABLES.get(table)
    if (bookkeeping === undefined) return false
    if (DeleteQueryNode.is(node)) return true
    return (node.updates ?? []).some(update => {
      const column = update.column as { column?: { name?: string } }
      return column.column?.name === undefined || !bookkeeping.has(column.column.name)
    })
  }
  return RawNode.is(node) && node.sqlFragments.some(f => WRITE_SQL.test(f))
}

/** Whether a statement's result says it changed no row: its count of affected rows, or an empty RETURNING. */
function changedNothing (node: RootOperationNode, result: QueryResult<UnknownRow>): boolean {
  if (result.numAffectedRows !== undefined) return result.numAffectedRows === 0n
  return (UpdateQueryNode.is(node) || DeleteQueryNode.is(node)) && node.returning !== undefined && result.rows.length === 0
}

/**
 * Empties the cache after every statement that may change a credential, made
 * in this process, also inside a transaction. A read that refills the cache
 * before the commit is emptied again: on PostgreSQL by the NOTIFY on commit;
 * SQLite has one connection, which the transaction holds until it commits.
 * A statement that changed no row changes no credential: the hourly purge of
 * ended sessions, or ending the sessions of a user who has none, leaves the
 * cache as it was (as PostgreSQL's row triggers send no notice for it).
 */
export function writesPlugin (cache: CredentialCache): KyselyPlugin {
  const writes = new WeakMap<object, RootOperationNode>()
  return {
    transformQuery (args: PluginTransformQueryArgs): RootOperationNode {
      if (mayChangeCredentials(args.node)) writes.set(args.queryId, args.node)
      return args.node
    },
    async transformResult (args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
      const node = writes.get(args.queryId)
      if (node !== undefined && !changedNothing(node, args.result)) cache.clear()
      return args.result
    }
  }
}

const CHANNEL = 'gatehouse_credentials'

/**
 * Keeps the cache honest against changes made elsewhere; returns what stops it.
 * PostgreSQL: LISTEN on its own connection, reconnecting with back-off.
 * SQLite: a once-a-second look at `PRAGMA data_version`.
 */
export function watchCredentialChanges (db: Db, config: Config, cache: CredentialCache, log: FastifyBaseLogger): () => Promise<void> {
  if (config.credentialCacheTtlMs <= 0) return async () => {}
  return isPostgres(db) ? listen(config, cache, log) : pollDataVersion(db, cache, log)
}

function listen (config: Config, cache: CredentialCache, log: FastifyBaseLogger): () => Promise<void> {
  let client: pg.Client | undefined
  let timer: NodeJS.Timeout | undefined
  let stopped = false
  let delayMs = 250
  const schema = config.databaseSchema

  const lost = (err?: unknown): void => {
    if (stopped) return
    cache.setLive(false)
    const dead = client
    client = undefined
    dead?.removeAllListeners()
    dead?.on('error', () => {})
    dead?.end().catch(() => {})
    if (err !== undefined) log.warn({ err }, 'credential change listener lost; every request checks the database until it is back')
    timer = setTimeout(connect, delayMs)
    delayMs = Math.min(delayMs * 2, 10_000)
  }

  const connect = (): void => {
    timer = undefined
    // pg is loaded only where PostgreSQL is used (start-up on SQLite skips it).
    let Client: typeof pg.Client
    try {
      Client = loadPg().Client
    } catch (error) {
      lost(error as Error)
      return
    }
    if (!stopped) open(Client)
  }

  const open = (Client: typeof pg.Client): void => {
    const next = new Client({
      connectionString: config.databaseUrl,
      keepAlive: true,
      connectionTimeoutMillis: config.databaseAcquireTimeoutMs,
      application_name: 'gatehouse-credential-listener'
    })
    client = next
    next.on('error', lost)
    next.on('end', () => { if (client === next) lost(new Error('connection ended')) })
    next.on('notification', (message) => {
      if (message.channel === CHANNEL && (schema === undefined || message.payload === schema)) cache.clear()
    })
    next.connect()
      .then(async () => { await next.query(`LISTEN ${CHANNEL}`) })
      .then(() => {
        if (client !== next || stopped) return
        delayMs = 250
        // Whatever changed while nobody listened: start from empty.
        cache.setLive(true)
      })
      .catch((err: unknown) => { if (client === next) lost(err) })
  }

  connect()
  return async () => {
    stopped = true
    cache.setLive(false)
    if (timer !== undefined) clearTimeout(timer)
    const last = client
    client = undefined
    last?.removeAllListeners()
    last?.on('error', () => {})
    await last?.end().catch(() => {})
  }
}

function pollDataVersion (db: Db, cache: CredentialCache, log: FastifyBaseLogger): () => Promise<void> {
  let version: number | undefined
  let running: Promise<void> | undefined
  const check = async (): Promise<void> => {
    try {
      const { rows } = await sql<{ data_version: number }>`pragma data_version`.execute(db)
      const now = rows[0]?.data_version
      if (version !== undefined && now !== version) cache.clear()
      version = now
    } catch (err) {
      cache.clear()
      log.warn({ err }, 'could not read PRAGMA data_version; credential cache emptied')
    }
  }
  const timer = setInterval(() => { running = check() }, 1000).unref()
  running = check()
  return async () => {
    clearInterval(timer)
    await running
  }
}

declare module 'fastify' {
  interface FastifyInstance {
    credentials: CredentialCache
  }
}
