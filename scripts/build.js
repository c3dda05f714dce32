// `npm run build`, and `npm install` through `prepare`: bundles src/ into
// dist/ with esbuild, so that start-up reads a few files instead of the
// hundreds of small modules under node_modules (measured: start-up to the
// first 2xx about halved, idle RSS 15 MiB lower; see bench/README.md).
//
// - Two CommonJS bundles: dist/gatehouse.cjs (the service, written inside
//   Node's module function: see below) and dist/cli/main.cjs (the `gatehouse`
//   command, which also serves).
// - dist/server.js (`npm start`) is a launcher of a few lines,
//   src/launcher/server.ts: it runs the service's bundle with the code V8
//   compiled for it at an earlier start (src/launcher/code-cache.ts). That
//   needs a script V8 compiles as one piece, hence CommonJS: Node 20 keeps no
//   compiled code for ES modules, and Node 22's compile cache writes only
//   when the process exits.
// - The build ends by running dist/warm-code-cache.js: a start on an
//   in-memory database, whose compiled code is kept, so that the first
//   `npm start` after an install already has it.
// - Left outside the bundle: native addons, ioredis (it reads its own
//   package.json through __dirname; Swagger UI, which serves its files from
//   there, is bundled with its own directory put back: OWN_DIRNAME below),
//   and the packages only some deployments load, lazily (passkeys, TOTP, OIDC,
//   LDAP).
// - Modules that read files next to themselves (the console's and the MFA
//   pages' CSS and scripts, `new URL('./assets/…', import.meta.url)`) run from
//   dist/gatehouse.cjs or dist/cli/main.cjs, so those files are copied to
//   dist/assets/ and dist/cli/assets/.
// - Types are not checked here: `npm run typecheck` (part of `npm test`) is
//   the gate for those.
// dist/.built is written last: the `gatehouse` command (bin/gatehouse.js)
// runs dist/ only while it is newer than every file in src/.
import { spawnSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { dirname, join, relative, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const src = join(root, 'src')
const dist = join(root, 'dist')

let esbuild
try {
  esbuild = await import('esbuild')
} catch {
  // `npm install --omit=dev` has no bundler: keep a dist/ built elsewhere.
  if (existsSync(join(dist, '.built'))) {
    process.stderr.write('gatehouse build: esbuild is not installed; keeping the existing dist/\n')
    process.exit(0)
  }
  process.stderr.write('gatehouse build: esbuild (a devDependency) is not installed and there is no dist/; run `npm install` with dev dependencies\n')
  process.exit(1)
}

const EXTERNAL = [
  // Native addons (and the optional one pg tries).
  'better-sqlite3', 'better-sqlite3-node-api', '@node-rs/argon2', '@node-rs/bcrypt', 'pg-native',
  // It locates its own package.json through __dirname.
  'ioredis',
  // Imported lazily (src/lib/import-package.ts), when a deployment first needs them:
  // outside the bundle, a start-up that does not need them neither loads nor
  // compiles them, and Node's own import gives CommonJS packages their named exports.
  // (pg is inside: required on first use, src/db/pg-driver.ts, and a PostgreSQL start
  // then reads it from the bundle's compiled code rather than compiling some 30 files.)
  '@simplewebauthn/server', 'otplib', 'qrcode', 'openid-client', 'ldapts',
  // Resolved (not loaded) by OWN_DIRNAME's modules below, at run time.
  '@fastify/swagger-ui/package.json'
]

// Bundled CommonJS packages that find their own files through __dirname:
// each of their modules gets the directory it has in node_modules, found at
// run time from the bundle (so a moved installation still works).
const OWN_DIRNAME = ['@fastify/swagger-ui']
const ownDirname = {
  name: 'own-dirname',
  setup (build) {
    for (const name of OWN_DIRNAME) {
      const dir = join(root, 'node_modules', name)
      build.onLoad({ filter: new RegExp(`^${dir.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}[\\/].*\\.js$`) }, async (args) => {
        const within = relative(dir, dirname(args.path)).split(sep).join('/')
        const contents = await readFile(args.path, 'utf8')
        return {
          contents: `var __dirname = require('node:path').join(require('node:path').dirname(require.resolve(${JSON.stringify(`${name}/package.json`)})), ${JSON.stringify(within)});\n${contents}`,
          loader: 'js',
          resolveDir: dirname(args.path)
        }
      })
    }
  }
}

rmSync(dist, { recursive: true, force: true })
const bundleOptions = {
  absWorkingDir: root,
  outdir: dist,
  outExtension: { '.js': '.cjs' },
  bundle: true,
  // No code splitting: esbuild then turns a dependency's `await import()` of a
  // CommonJS package into a chunk exporting only `default` (@fastify/cookie's
  // import of cookie broke that way). Lazily imported modules stay lazy inside
  // each bundle: they are wrapped, and run on first import.
  format: 'cjs',
  platform: 'node',
  target: 'node20',
  external: EXTERNAL,
  // The sources are ES modules: import.meta.url becomes the bundle's own file URL.
  define: { 'import.meta.url': '__gatehouseModuleUrl' },
  minifyWhitespace: true,
  minifySyntax: true,
  sourcemap: 'linked',
  logLevel: 'warning',
  plugins: [ownDirname]
}
// Strict, as the ES modules it is made of: esbuild's own "use strict" comes after this banner, where it
// is no longer a directive.
const moduleUrl = "'use strict'; var __gatehouseModuleUrl = require('node:url').pathToFileURL(__filename).href;"
// The service's bundle is written inside the function Node wraps a CommonJS module in, so that the
// launcher compiles the file's text as it is (src/launcher/code-cache.ts), without first copying
// 2.5 MB into a wrapped string. It is run only by the launchers, never by require().
const result = await esbuild.build({
  ...bundleOptions,
  entryPoints: { gatehouse: join(src, 'launcher/bundle.ts') },
  banner: { js: `(function (exports, require, module, __filename, __dirname) { ${moduleUrl}` },
  footer: { js: '})' },
  metafile: true
})
if (result.errors.length > 0) process.exit(1)
const cli = await esbuild.build({
  ...bundleOptions,
  entryPoints: { 'cli/main': join(src, 'cli/main.ts') },
  banner: { js: moduleUrl }
})
if (cli.errors.length > 0) process.exit(1)

// V8 keeps a module's source for as long as the process runs (functions are
// compiled from it when first called), one byte a character while every
// character is Latin-1 and two bytes once a single one is not: 5 MB instead of
// 2.5 MB of the server's heap. esbuild escapes such characters in strings but
// cannot in tagged templates (the console's HTML): write them as HTML entities.
for (const file of ['gatehouse.cjs', 'cli/main.cjs']) {
  const code = readFileSync(join(dist, file), 'utf8')
  const at = code.search(/[\u0100-\uffff]/)
  if (at !== -1) {
    process.stderr.write(`gatehouse build: dist/${file} holds a character beyond Latin-1 (${JSON.stringify(code.slice(Math.max(0, at - 60), at + 20))}); write it as an escape or an HTML entity\n`)
    process.exit(1)
  }
}
// The service's bundle runs as a vm.Script (src/launcher/code-cache.ts), where import() has no loader:
// packages outside the bundle are imported through src/lib/import-package.ts.
{
  // Less the default importer there, which the launcher replaces.
  const code = readFileSync(join(dist, 'gatehouse.cjs'), 'latin1').replace('importer=async specifier=>await import(specifier)', '')
  const at = code.search(/\bimport\(/)
  if (at !== -1) {
    process.stderr.write(`gatehouse build: dist/gatehouse.cjs calls import() (${JSON.stringify(code.slice(Math.max(0, at - 60), at + 40))}); import packages through importPackage (src/lib/import-package.ts)\n`)
    process.exit(1)
  }
}

for (const target of [join(dist, 'assets'), join(dist, 'cli', 'assets')]) {
  mkdirSync(target, { recursive: true })
  for (const feature of readdirSync(src, { withFileTypes: true })) {
    const assets = join(src, feature.name, 'assets')
    if (!feature.isDirectory() || !existsSync(assets)) continue
    for (const name of readdirSync(assets)) {
      // One folder for every feature's assets: two files of one name would silently become one.
      if (existsSync(join(target, name))) throw new Error(`gatehouse build: two features have an asset named ${name}`)
      cpSync(join(assets, name), join(target, name), { recursive: true })
    }
  }
}
// The launchers: small ES modules of their own, outside the bundle they load.
const launchers = await esbuild.build({
  absWorkingDir: root,
  entryPoints: { server: join(src, 'launcher/server.ts'), 'warm-code-cache': join(src, 'launcher/warm-code-cache.ts') },
  outdir: dist,
  bundle: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  logLevel: 'warning'
})
if (launchers.errors.length > 0) process.exit(1)
writeFileSync(join(dist, 'meta.json'), JSON.stringify(result.metafile))

// A failed warm-up costs the first start its compile time, not the installation.
const warm = spawnSync(process.execPath, [join(dist, 'warm-code-cache.js')], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'], timeout: 120_000 })
if (warm.status !== 0) process.stderr.write(`gatehouse build: could not keep the compiled code for the first start (exit ${warm.status ?? warm.signal}); it will be kept by that start\n`)

writeFileSync(join(dist, '.built'), `${new Date().toISOString()}\n`)
