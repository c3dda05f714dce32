import { CompiledQuery, SelectQueryNode, type Compilable, type RootOperationNode } from 'kysely'
import { isPostgres, PREPARE_MARK, queryDirect, type Db } from './database.ts'

const SENTINEL = '\u0000gatehouse-param:'

interface Template {
  sql: string
  slots: Array<{ name: string } | { value: unknown }>
  /** PostgreSQL: may be written on a read pipeline (database.ts ReadPipelines). */
  pipelined: boolean
}

/*
 * Keyed by the dialect's adapter, which a Kysely instance shares with its
 * transactions and plugin-wrapped copies: keyed by the handle, each
 * transaction (a new handle) compiled its statements again. The text depends
 * only on the dialect (the PostgreSQL schema is the connection's search_path).
 * With a password sign-in's statements through here (sessions.repository.ts,
 * insertEvent, factorCounts), the server's main thread per sign-in went from
 * 1.73 to 1.36 ms on SQLite and 2.64 to 2.46 ms on PostgreSQL (`npm run
 * bench:storm`'s "sign-ins alone", BENCH_SERVER interleaved, load 7 to 10;
 * bench/README.md, "Issue 20: third pass").
 */
const templates = new WeakMap<object, Map<string, Template>>()

/**
 * Runs a query that is built and compiled once per shape, then only bound.
 *
 * Kysely builds and compiles a query on every call; for a short query on
 * SQLite that costs several times the query itself, on the paths every
 * request takes (the credential check, the list page). `build` receives
 * `param(name)` placeholders instead of values and must not look inside
 * them; `shape` must name everything that changes the SQL text (which
 * filters are present, the sort order), because queries are cached by it.
 *
 * A statement run here skips the plugins' `transformQuery`, so the
 * credential cache's writes plugin (auth/credential-cache.ts) never sees it:
 * only reads, inserts and updates of bookkeeping columns may come this way,
 * never a change that may end or narrow a credential. Outside a transaction
 * it runs without Kysely's executor, on a pooled PostgreSQL connection or on
 * SQLite's connection (database.ts `queryDirect`).
 */
export async function executePrepared<Row> (
  db: Db,
  shape: string,
  build: (param: (name: string) => any) => Compilable<Row>,
  values: Record<string, unknown>,
  /**
   * PostgreSQL: false sends the text unnamed, so that it is planned with its
   * values every time. A named statement is planned generically after five
   * runs, with the values unknown: for `LIKE '%…%'` that plan walked the
   * sort's index and filtered every row instead of asking the trigram
   * indexes (users.repository.ts).
   */
  options: { serverPrepared?: boolean } = {}
): Promise<Row[]> {
  const adapter = db.getExecutor().adapter
  let perDb = templates.get(adapter)
  if (perDb === undefined) {
    perDb = new Map()
    templates.set(adapter, perDb)
  }
  const key = options.serverPrepared === false ? `${shape}:unnamed` : shape
  let template = perDb.get(key)
  if (template === undefined) {
    const compiled = build(name => SENTINEL + name).compile()
    const named = isPostgres(db) && options.serverPrepared !== false
    template = {
      // PostgreSQL: also a named prepared statement on each connection, so it is parsed and planned once there.
      sql: named ? PREPARE_MARK + compiled.sql : compiled.sql,
      slots: compiled.parameters.map(p =>
        typeof p === 'string' && p.startsWith(SENTINEL) ? { name: p.slice(SENTINEL.length) } : { value: p }),
      // Planned once, so short; and neither locking nor writing, so nothing written behind it waits for a lock.
      pipelined: named && isPlainRead(compiled.query)
    }
    perDb.set(key, template)
  }
  const parameters = template.slots.map(slot => {
    if ('value' in slot) return slot.value
    if (!(slot.name in values)) throw new Error(`prepared query "${shape}" needs a value for ${slot.name}`)
    return values[slot.name]
  })
  const rows = await queryDirect(db, template.sql, parameters, { pipelined: template.pipelined })
  if (rows !== undefined) return rows as Row[]
  const result = await db.executeQuery<Row>(CompiledQuery.raw(template.sql, parameters))
  return result.rows
}

/** One SELECT without a WITH clause (where a write may hide: data-modifying CTEs) or a locking clause (FOR UPDATE and the like). */
function isPlainRead (query: RootOperationNode): boolean {
  return SelectQueryNode.is(query) && query.with === undefined && query.endModifiers === undefined
}
