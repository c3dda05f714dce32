import { createRequire } from 'node:module'
import type pg from 'pg'

const requireHere = createRequire(import.meta.url)
let driver: typeof pg | undefined

/** The pg package, loaded on first use, so a SQLite deployment never runs it. */
export function loadPg (): typeof pg {
  // In the bundle this is esbuild's require, which runs the bundled copy of pg on first use; from
  // the sources (an ES module, through tsx) there is no require, and Node loads pg.
  driver ??= (typeof require === 'function' ? require('pg') : requireHere('pg')) as typeof pg
  return driver
}
