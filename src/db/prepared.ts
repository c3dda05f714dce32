import { CompiledQuery, type Compilable } from 'kysely'
import { isPostgres, PREPARE_MARK, readDirect, type Db } from './database.ts'

const SENTINEL = '\u0000gatehouse-param:'

interface Template { sql: string, slots: Array<{ name: string } | { value: unknown }> }

const templates = new WeakMap<Db, Map<string, Template>>()

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
 * Reads only: on PostgreSQL, outside a transaction, the statement goes to a
 * pooled connection without Kysely's executor (database.ts `readDirect`),
 * which skips the plugins that watch writes.
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
  let perDb = templates.get(db)
  if (perDb === undefined) {
    perDb = new Map()
    templates.set(db, perDb)
  }
  const key = options.serverPrepared === false ? `${shape}:unnamed` : shape
  let template = perDb.get(key)
  if (template === undefined) {
    const compiled = build(name => SENTINEL + name).compile()
    template = {
      // PostgreSQL: also a named prepared statement on each connection, so it is parsed and planned once there.
      sql: isPostgres(db) && options.serverPrepared !== false ? PREPARE_MARK + compiled.sql : compiled.sql,
      slots: compiled.parameters.map(p =>
        typeof p === 'string' && p.startsWith(SENTINEL) ? { name: p.slice(SENTINEL.length) } : { value: p })
    }
    perDb.set(key, template)
  }
  const parameters = template.slots.map(slot => {
    if ('value' in slot) return slot.value
    if (!(slot.name in values)) throw new Error(`prepared query "${shape}" needs a value for ${slot.name}`)
    return values[slot.name]
  })
  if (isPostgres(db)) {
    const rows = await readDirect(db, template.sql, parameters)
    if (rows !== undefined) return rows as Row[]
  }
  const result = await db.executeQuery<Row>(CompiledQuery.raw(template.sql, parameters))
  return result.rows
}
