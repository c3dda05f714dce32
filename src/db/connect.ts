import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import type SQLite from 'better-sqlite3'
import {
  Kysely,
  PostgresDialect,
  SqliteDialect,
  SqliteDriver,
  sql,
  type PostgresPool,
  type PostgresPoolClient,
  type DatabaseConnection,
  type SqliteDatabase
} from 'kysely'
import type pg from 'pg'
import type { Config } from '../config.ts'
import type { Database, Db } from './schema.ts'
import { Sqlite } from './sqlite-binding.ts'
import { checkpointInBackground } from './sqlite-checkpoint.ts'
import { loadPg } from './pg-driver.ts'
import { DatabaseConnectionError } from './connection-failure.ts'
import { statementLog } from '../lib/tracing.ts'

/** Without `sqliteMmapMib`, SQLite reads the file without a memory map (SQLite's own default). */
export function createDb (config: Pick<Config, 'databaseUrl' | 'databaseSchema' | 'databasePoolSize' | 'databaseStatementTimeoutMs' | 'databaseQueryTimeoutMs' | 'databaseAcquireTimeoutMs'> & Partial<Pick<Config, 'sqliteMmapMib' | 'sqliteWalLimitMib'>>): Db {
  if (config.databaseUrl.startsWith('sqlite:')) {
    const walLimitBytes = config.sqliteWalLimitMib !== undefined ? config.sqliteWalLimitMib * 1024 * 1024 : WAL_SIZE_LIMIT_BYTES
    return new Kysely<Database>({
      dialect: new WalResettingSqliteDialect(openSqlite(config.databaseUrl.slice('sqlite:'.length), config.databaseStatementTimeoutMs, config.sqliteMmapMib ?? 0, walLimitBytes)),
      ...statementLog('sqlite')
    })
  }
  // Kysely calls this on the first query: pg is loaded then, so a SQLite deployment never loads it.
  const openPool = async (): Promise<PostgresPool> => {
    const { Pool, types } = loadPg()
    const connection = {
      // timestamptz as the API's own text: no Date object made and formatted again for every value read.
      types: { getTypeParser: ((oid: number, format?: string) => oid === TIMESTAMPTZ_OID && format !== 'binary' ? isoFromTimestamptz : types.getTypeParser(oid, format as 'text')) as typeof types.getTypeParser },
      connectionString: config.databaseUrl,
      // Both the wait for a free connection and opening a new one: a server that
      // accepts the connection but never answers would otherwise hold it for ever.
      connectionTimeoutMillis: config.databaseAcquireTimeoutMs,
      statement_timeout: config.databaseStatementTimeoutMs,
      // DATABASE_QUERY_TIMEOUT_MS, the client-side deadline for a server that has gone dark and never sends the
      // statement_timeout error, is kept by our seams (answeredWithin), not by pg's query_timeout: pg's says so
      // only in its error's text.
      // UTC, so every timestamptz arrives as `…+00` (isoFromTimestamptz).
      options: `-c TimeZone=UTC${config.databaseSchema !== undefined ? ` -c search_path=${config.databaseSchema}` : ''}`
    }
    const pool = new Pool({ ...connection, max: config.databasePoolSize, idleTimeoutMillis: IDLE_CONNECTION_MS })
    // An idle client losing its server must not crash the process; the next query reports it.
    pool.on('error', () => {})
    return discardingStalled(pool, config.databaseQueryTimeoutMs)
  }
  return new Kysely<Database>({ dialect: new PostgresDialect({ pool: openPool }), ...statementLog('postgresql') })
}

/** How long an unused connection is kept open in the pool. */
const IDLE_CONNECTION_MS = 30_000

/** SQLite through Kysely's dialect, with a driver that lets the checkpointer empty the WAL between uses of the connection. */
class WalResettingSqliteDialect extends SqliteDialect {
  readonly #database: OpenSqlite
  constructor (database: OpenSqlite) {
    super({ database })
    this.#database = database
  }

  override createDriver (): SqliteDriver {
    return new WalResettingSqliteDriver(this.#database)
  }
}

/**
 * Kysely's driver, which holds the one connection for a statement or a whole
 * transaction; before it hands the connection out, it lets the checkpointer
 * empty a WAL that has passed its limit (sqlite-checkpoint.ts). That is the
 * one moment no transaction is open and nothing else can use the connection.
 */
class WalResettingSqliteDriver extends SqliteDriver {
  readonly #database: OpenSqlite
  constructor (database: OpenSqlite) {
    super({ database })
    this.#database = database
  }

  override async acquireConnection (): Promise<DatabaseConnection> {
    const connection = await super.acquireConnection()
    const reset = this.#database.beforeUse()
    if (reset !== undefined) await reset
    return connection
  }
}

const TIMESTAMPTZ_OID = 1184
const UTC_TIMESTAMP = /^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,6}))?\+00$/

/**
 * PostgreSQL's text for a timestamptz in a UTC session, `2024-01-01
 * 00:00:00.123456+00`, as the `toISOString()` form SQLite stores and the API
 * writes (milliseconds, `Z`). Anything else (another offset, a year past
 * 9999, BC, infinity) goes through Date, as pg would have parsed it.
 */
export function isoFromTimestamptz (text: string): string {
  const match = UTC_TIMESTAMP.exec(text)
  if (match === null) {
    const date = new Date(text.replace(' ', 'T').replace(/([+-]\d{2})$/, '$1:00'))
    return Number.isNaN(date.getTime()) ? text : date.toISOString()
  }
  return `${match[1]}T${match[2]}.${(match[3] ?? '').padEnd(3, '0').slice(0, 3)}Z`
}

/**
 * `running`, unless it is not settled within `timeoutMs`: then a
 * DatabaseConnectionError('query_timeout'), handed first to `giveUp` (which
 * takes the connection out of use). What `running` comes to after that is dropped.
 */
async function answeredWithin<T> (running: Promise<T>, timeoutMs: number, giveUp: (error: DatabaseConnectionError) => void): Promise<T> {
  return await new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const error = new DatabaseConnectionError('query_timeout')
      giveUp(error)
      reject(error)
    }, timeoutMs)
    running.then(value => { clearTimeout(timer); resolve(value) }, (error: unknown) => { clearTimeout(timer); reject(error) })
  })
}

/**
 * Why opening a connection failed, as DatabaseConnectionError('connect'):
 * anything pg or pg-pool rejects with (its own timeouts, a refused or reset
 * socket, a closed pool) but the server's own refusal (pg's DatabaseError: a
 * wrong password, a database that does not exist, too many connections),
 * which keeps its SQLSTATE code for errors.ts and the callers that read it.
 */
function connectFailure (error: unknown): unknown {
  return error instanceof loadPg().DatabaseError ? error : new DatabaseConnectionError('connect', error)
}

/**
 * Why a statement failed: the server's refusal as it is; anything else,
 * on a connection that pg reported failed or ended, as connection_lost.
 * Any other failure (a value pg cannot send, a row it cannot read) is ours.
 */
function failureOn (error: unknown, connectionLost: boolean): unknown {
  if (error instanceof DatabaseConnectionError || error instanceof loadPg().DatabaseError || !connectionLost) return error
  return new DatabaseConnectionError('connection_lost', error)
}

/**
 * Pooled connections that are given up once a query on them outlives
 * DATABASE_QUERY_TIMEOUT_MS. Such a connection still owes that answer, which
 * may never come: kept, it would make the next query on it wait behind the
 * lost one. Later queries on it (a transaction's ROLLBACK) fail at once with
 * the same error instead of waiting out another timeout, and releasing it
 * closes it. Failures are classified here (connectFailure, failureOn).
 */
function discardingStalled (pool: pg.Pool, queryTimeoutMs: number): PostgresPool {
  // Clients whose connection pg reported failed or ended. pg-pool listens for
  // errors only on idle clients; this listener also keeps one in use from
  // crashing the process (the query in flight is failed anyway, and the
  // client dropped on release).
  const lost = new WeakSet<pg.Client>()
  pool.on('connect', (client) => {
    client.on('error', () => { lost.add(client) })
    client.on('end', () => { lost.add(client) })
  })
  return {
    connect: async () => {
      let client: pg.PoolClient
      try {
        client = await pool.connect()
      } catch (error) {
        throw connectFailure(error)
      }
      let stalled: Error | undefined
      const query = async (text: string, parameters: ReadonlyArray<unknown>): Promise<pg.QueryResult> => {
        if (stalled !== undefined) throw stalled
        try {
          const running = client.query(text, parameters as unknown[])
          // Released with this error, the client is closed: pg destroys the socket of a client with a statement in flight.
          return await answeredWithin(running, queryTimeoutMs, (error) => { stalled = error })
        } catch (error) {
          throw failureOn(error, lost.has(client))
        }
      }
      // Kysely's overloads include cursors, which nothing here uses.
      return { query: query as unknown as PostgresPoolClient['query'], release: () => { client.release(stalled) } }
    },
    end: async () => { await pool.end() }
  }
}

/**
 * The WAL's limit unless SQLITE_WAL_LIMIT_MIB says otherwise: the size SQLite cuts the WAL file back to once it has
 * been checkpointed (Rails's and Hanami's default too), and the size past which it is emptied (sqlite-checkpoint.ts).
 */
export const WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024

/** The connection as Kysely's driver takes it, and its WAL's keeper. */
interface OpenSqlite extends SqliteDatabase {
  /** Checkpointer.beforeUse: to be awaited, when it answers a promise, before the connection is used. */
  beforeUse: () => Promise<void> | undefined
}

function openSqlite (path: string, busyTimeoutMs: number, mmapMib: number, walLimitBytes: number): OpenSqlite {
  const file = path === ':memory:' || path === '' ? ':memory:' : path
  if (file !== ':memory:') mkdirSync(dirname(file), { recursive: true })
  const raw = new Sqlite(file, { timeout: busyTimeoutMs })
  // A new file gets pages of 8 KiB rather than SQLite's 4: the index that carries the users' stored texts (migration
  // 0024) then holds twice as many users a page, and an uncached page of 50 visits half as many b-tree pages. At
  // 100,000 users the server's CPU per uncached page was 0.88 to 0.95 of what it was with 4 KiB (eight interleaved
  // rounds, the builds in both places; the statement alone 24.3 to 25.0 µs against 31.0 to 33.8, and 25.4 to 25.9
  // with 16 KiB). An event's insert costs 3 to 5 µs more, a user's lookup or update the same (bench/README.md before 2 December 2026 (git history),
  // "Issue 20: 8 KiB pages and SQLite's reads"). The size is fixed when the first table is made: an existing file
  // keeps its own (docs/configuration.md says how to convert one).
  raw.pragma('page_size = 8192')
  raw.pragma('journal_mode = WAL')
  raw.pragma('synchronous = NORMAL')
  raw.pragma('foreign_keys = ON')
  // Pages are read where the kernel already holds them instead of copied into
  // SQLite's page cache by a read(2) each: an uncached users page (51 users,
  // about ten pages of an index) cost the server 0.916 of its CPU per response
  // with 256 MiB mapped (median of eight interleaved rounds at 100,000 users,
  // a 190 MiB file; bench/README.md before 2 December 2026 (git history), "Issue 20: the access line and the memory
  // map"). Writes still go through write(2): SQLite never writes through the map.
  if (file !== ':memory:' && mmapMib > 0) raw.pragma(`mmap_size = ${mmapMib * 1024 * 1024}`)
  // SQLite never shrinks the WAL file of its own accord: after a write of more than this (an import, an upgrade's
  // migrations: 1.6 GiB for 0021 to 0024 at 1,000,000 users) the file kept that size for as long as the server ran.
  // With a limit, the first commit after a checkpoint has copied the whole WAL back cuts the file down to it. A
  // server's WAL is checkpointed at 4 MiB (sqlite-checkpoint.ts), so in steady use it never reaches 64 MiB and this
  // costs nothing. Under writes that never pause, the checkpointer empties the WAL once it passes the limit.
  raw.pragma(`journal_size_limit = ${walLimitBytes}`)
  // Checkpoints off the event loop: see sqlite-checkpoint.ts. An in-memory database has no WAL.
  const checkpointer = file === ':memory:' ? undefined : checkpointInBackground(raw, file, busyTimeoutMs, { limitBytes: walLimitBytes })
  // Kysely prepares every statement anew; preparing is a large share of a short query's cost.
  const statements = new Map<string, SqliteStatement>()
  return {
    close: () => {
      checkpointer?.stop()
      raw.close()
    },
    prepare: (text: string) => {
      let statement = statements.get(text)
      if (statement === undefined) {
        if (statements.size >= 1000) statements.clear()
        statement = withIntegerBooleans(raw.prepare(text))
        statements.set(text, statement)
      }
      return statement
    },
    beforeUse: () => checkpointer?.beforeUse()
  }
}

type SqliteStatement = ReturnType<SqliteDatabase['prepare']>

/**
 * better-sqlite3 refuses to bind booleans, and SQLite stores them as 0/1
 * anyway: convert at the binding, which costs one pass over the parameters
 * (a Kysely plugin would rewrite every query's syntax tree instead).
 */
function withIntegerBooleans (statement: SQLite.Statement): SqliteStatement {
  const bind = (parameters: ReadonlyArray<unknown>): unknown[] =>
    parameters.map(p => typeof p === 'boolean' ? (p ? 1 : 0) : p)
  return {
    reader: statement.reader,
    all: (parameters) => statement.all(bind(parameters)),
    run: (parameters) => statement.run(bind(parameters)),
    iterate: (parameters) => statement.iterate(bind(parameters))
  }
}

/** Cheap round trip used by /readyz. */
export async function pingDb (db: Db): Promise<void> {
  await sql`select 1`.execute(db)
}
