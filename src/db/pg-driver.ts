import { createRequire } from 'node:module'
import type pg from 'pg'
import { withGlobalHidden } from '../lib/hidden-global.ts'

const requireHere = createRequire(import.meta.url)
let driver: typeof pg | undefined

/**
 * The pg package, loaded on first use, so a SQLite deployment never runs it.
 * Loaded synchronously with `Response` hidden: on Node 20, which has no
 * `navigator`, pg asks whether it runs on Cloudflare Workers by making a
 * `new Response()`, and that loads Node's fetch implementation. Nothing else
 * can run while the global is hidden.
 */
export function loadPg (): typeof pg {
  // In the bundle (CommonJS) this is esbuild's require, which runs the bundled copy of pg on first
  // use; from the sources (an ES module, through tsx) there is no require, and Node loads pg.
  driver ??= withGlobalHidden('Response', () => (typeof require === 'function' ? require('pg') : requireHere('pg')) as typeof pg)
  return driver
}
