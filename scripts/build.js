// `npm run build`, and `npm install` through `prepare`: compiles src/ to dist/
// with tsc (tsconfig.build.json: `rewriteRelativeImportExtensions` turns the
// sources' `./x.ts` imports into `./x.js`), then copies the files tsc does not
// emit (the console's and MFA pages' CSS and scripts, read at run time next to
// their module). dist/ mirrors src/, so `../../package.json` from a module
// names the same file from either tree. dist/.built is written last: the
// `gatehouse` command (bin/gatehouse.js) runs dist/ only while it is newer than
// every file in src/.
import { cpSync, existsSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const src = join(root, 'src')
const dist = join(root, 'dist')

let tsc
try {
  tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
} catch {
  // `npm install --omit=dev` has no compiler: keep a dist/ built elsewhere.
  if (existsSync(join(dist, '.built'))) {
    process.stderr.write('gatehouse build: typescript is not installed; keeping the existing dist/\n')
    process.exit(0)
  }
  process.stderr.write('gatehouse build: typescript (a devDependency) is not installed and there is no dist/; run `npm install` with dev dependencies\n')
  process.exit(1)
}

rmSync(dist, { recursive: true, force: true })
const { status } = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' })
// 2: type errors, JavaScript written anyway. `npm run typecheck` (part of
// `npm test`) is the gate for those; failing here would also fail every
// `npm install <package>` in a checkout with work in progress.
if (status === 2) process.stderr.write('gatehouse build: dist/ written despite the type errors above (see `npm run typecheck`)\n')
else if (status !== 0) process.exit(status ?? 1)

function copyAssets (dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) copyAssets(path)
    else if (!name.endsWith('.ts')) cpSync(path, join(dist, relative(src, path)))
  }
}
copyAssets(src)
writeFileSync(join(dist, '.built'), `${new Date().toISOString()}\n`)
