#!/usr/bin/env node
// The `gatehouse` command. Runs the compiled CLI (dist/, built by `npm install`
// through `prepare`, or `npm run build`) when it is at least as new as every
// file in src/; otherwise the TypeScript sources through tsx (a runtime
// dependency), so an edited checkout never runs a stale build.
import { existsSync, readdirSync, statSync } from 'node:fs'
import { createRequire } from 'node:module'

const root = new URL('../', import.meta.url)
const stamp = new URL('dist/.built', root)

function newestSource (dir) {
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = new URL(entry.name + (entry.isDirectory() ? '/' : ''), dir)
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs)
  }
  return newest
}

let main
if (existsSync(stamp) && statSync(stamp).mtimeMs >= newestSource(new URL('src/', root))) {
  // CommonJS (dist/package.json): required, so Node does not scan 3 MB for its export names first.
  ({ main } = createRequire(import.meta.url)('../dist/cli/main.js'))
} else {
  const { register } = await import('tsx/esm/api')
  register()
  ;({ main } = await import('../src/cli/main.ts'))
}
process.exitCode = await main(process.argv.slice(2))
