import { createRequire } from 'node:module'
import type BetterSqlite3 from 'better-sqlite3'

const require = createRequire(import.meta.url)

/**
 * Which better-sqlite3 runs depends on the Node.js that runs gatehouse.
 *
 * Release 12 is built on V8's `node::ObjectWrap`. Since Node 24.19 that
 * class's destructor requires a current Node environment, which a statement
 * freed by a background garbage collection or at exit does not have, and the
 * process aborts (nodejs/node#65446; WiseLibs/better-sqlite3#1515 was closed
 * without a fix). Release 13 is built on Node-API and is not affected, but it
 * needs Node-API 10 (Node 22.14 and later), so it cannot load on Node 20.
 *
 * Both are installed (package.json: `better-sqlite3` is 12,
 * `better-sqlite3-node-api` is 13); the one this Node.js can run safely is
 * loaded. Their JavaScript APIs are the same. Drop 12 with Node 20.
 */
export const BETTER_SQLITE3_PACKAGE = Number(process.versions.napi) >= 10 ? 'better-sqlite3-node-api' : 'better-sqlite3'

export const Sqlite: typeof BetterSqlite3 = require(BETTER_SQLITE3_PACKAGE)

/** Where that package is, for a worker thread that opens a connection of its own (sqlite-checkpoint.ts). */
export const BETTER_SQLITE3_PATH = require.resolve(BETTER_SQLITE3_PACKAGE)
