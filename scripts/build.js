// `npm run build`, and `npm install` through `prepare`: bundles src/ into
// dist/ with esbuild, so that start-up reads a few files instead of the
// hundreds of small modules under node_modules (measured: start-up to the
// first 2xx about halved, idle RSS 15 MiB lower; see bench/README.md).
//
// - Two bundles, dist/gatehouse.js (the service, started by dist/server.js:
//   `npm start`) and dist/cli/main.js (the `gatehouse` command, which also
//   serves).
// - dist/server.js is a launcher of a few lines, written below: it turns on
//   Node's compile cache (Node 22.1 and later) before the bundle is loaded, so
//   V8 compiles the bundle's code once, not at every start. The cache must be
//   on before the module it caches is compiled, hence a file of its own.
// - Left outside the bundle: native addons, ioredis (it reads its own
//   package.json through __dirname; Swagger UI, which serves its files from
//   there, is bundled with its own directory put back: OWN_DIRNAME below),
//   and the packages only some deployments load, lazily (PostgreSQL, passkeys,
//   TOTP, OIDC, LDAP).
// - Modules that read files next to themselves (the console's and the MFA
//   pages' CSS and scripts, `new URL('./assets/…', import.meta.url)`) run from
//   dist/gatehouse.js or dist/cli/main.js, so those files are copied to
//   dist/assets/ and dist/cli/assets/.
// - Types are not checked here: `npm run typecheck` (part of `npm test`) is
//   the gate for those.
// dist/.built is written last: the `gatehouse` command (bin/gatehouse.js)
// runs dist/ only while it is newer than every file in src/.
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
  // Imported lazily (`await import()`), when a deployment first needs them:
  // outside the bundle, a start-up that does not need them neither loads nor
  // compiles them, and Node's own import gives CommonJS packages their named exports.
  'pg', '@simplewebauthn/server', 'otplib', 'qrcode', 'openid-client', 'ldapts'
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
const result = await esbuild.build({
  absWorkingDir: root,
  entryPoints: { gatehouse: join(src, 'server.ts'), 'cli/main': join(src, 'cli/main.ts') },
  outdir: dist,
  bundle: true,
  // No code splitting: esbuild then turns a dependency's `await import()` of a
  // CommonJS package into a chunk exporting only `default` (@fastify/cookie's
  // import of cookie broke that way). Lazily imported modules stay lazy inside
  // each bundle: they are wrapped, and run on first import.
  format: 'esm',
  platform: 'node',
  target: 'node20',
  external: EXTERNAL,
  // CommonJS packages inside an ES module bundle still call require() and read __dirname.
  banner: {
    js: [
      "import { createRequire as __gatehouseRequire } from 'node:module'",
      "import { fileURLToPath as __gatehouseFileUrl } from 'node:url'",
      'const require = __gatehouseRequire(import.meta.url)',
      'const __filename = __gatehouseFileUrl(import.meta.url)',
      "const __dirname = __gatehouseFileUrl(new URL('.', import.meta.url))"
    ].join('\n')
  },
  minifyWhitespace: true,
  minifySyntax: true,
  sourcemap: 'linked',
  logLevel: 'warning',
  metafile: true,
  plugins: [ownDirname]
})
if (result.errors.length > 0) process.exit(1)

// V8 keeps a module's source for as long as the process runs (functions are
// compiled from it when first called), one byte a character while every
// character is Latin-1 and two bytes once a single one is not: 5 MB instead of
// 2.5 MB of the server's heap. esbuild escapes such characters in strings but
// cannot in tagged templates (the console's HTML): write them as HTML entities.
for (const file of ['gatehouse.js', 'cli/main.js']) {
  const code = readFileSync(join(dist, file), 'utf8')
  const at = code.search(/[\u0100-\uffff]/)
  if (at !== -1) {
    process.stderr.write(`gatehouse build: dist/${file} holds a character beyond Latin-1 (${JSON.stringify(code.slice(Math.max(0, at - 60), at + 20))}); write it as an escape or an HTML entity\n`)
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
writeFileSync(join(dist, 'server.js'), [
  '// Written by scripts/build.js. Node 22.1 and later keep the code V8 compiles for the',
  '// bundle in a cache (os.tmpdir()/node-compile-cache, or NODE_COMPILE_CACHE; off with',
  '// NODE_DISABLE_COMPILE_CACHE=1), so a start reuses it; on Node 20 this is a no-op.',
  "import module from 'node:module'",
  'module.enableCompileCache?.()',
  "const { startServer } = await import('./gatehouse.js')",
  'await startServer()',
  ''
].join('\n'))
writeFileSync(join(dist, 'meta.json'), JSON.stringify(result.metafile))
writeFileSync(join(dist, '.built'), `${new Date().toISOString()}\n`)
