// `npm run build`, and `npm install` through `prepare`: bundles src/ into
// dist/ with esbuild, so that start-up reads a few files instead of the
// hundreds of small modules under node_modules. Measured (issue 17, Node 20,
// 2-core VM shared with other work, medians of 7 starts to the first 2xx of
// /auth/healthz, builds interleaved, SQLite / PostgreSQL): this bundle 288 /
// 459 ms and 96 / 96 MiB idle RSS; src/ alone bundled, the packages loaded
// from node_modules (`packages: 'external'`), 795 / 1,009 ms and 119 to 122
// MiB. The goals are < 500 ms and < 100 MiB (bench/README.md, "Issue 17").
//
// - Two CommonJS bundles: dist/server.js (`npm start`) and dist/cli/main.js
//   (the `gatehouse` command, which also serves); dist/package.json says
//   they are CommonJS. The same bundle as an ES module held 4 to 5 MiB more
//   idle RSS (100 to 102 MiB after the first requests, against 96 to 97):
//   over the goal.
// - Left outside the bundle: native addons, ioredis (it reads its own
//   package.json through __dirname; Swagger UI, which serves its files from
//   there, is bundled with its own directory put back: OWN_DIRNAME below),
//   and the packages only some deployments load, lazily (passkeys, TOTP, OIDC,
//   LDAP).
// - Modules that read files next to themselves (the console's and the MFA
//   pages' CSS and scripts, `new URL('./assets/…', import.meta.url)`) run from
//   dist/server.js or dist/cli/main.js, so those files are copied to
//   dist/assets/ and dist/cli/assets/.
// - Types are not checked here: `npm run typecheck` (part of `npm test`) is
//   the gate for those.
// dist/.built is written last: the `gatehouse` command (bin/gatehouse.js)
// runs dist/ only while it is newer than every file in src/.
import { cpSync, existsSync, mkdirSync, readdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
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
  // Imported lazily, with import(), when a deployment first needs them: outside
  // the bundle, a start-up that does not need them neither loads nor compiles them.
  '@simplewebauthn/server', 'otplib', 'qrcode', 'openid-client', 'ldapts', 'nodemailer',
  // Tracing (src/telemetry/tracing.ts), only with an OTLP endpoint configured.
  '@opentelemetry/*', '@fastify/otel',
  // Resolved (not loaded) by OWN_DIRNAME's modules below, at run time.
  '@fastify/swagger-ui/package.json'
]

// Bundled CommonJS packages that find their own files through __dirname:
// each of their modules gets the directory it has in node_modules, found at
// run time from the bundle (so a moved installation still works). Left
// outside the bundle instead, Swagger UI cost 24 ms of start-up and 4 MiB of
// idle RSS (303 against 279 ms, 98 to 100 against 95 to 96 MiB, medians of 7).
const OWN_DIRNAME = ['@fastify/swagger-ui']
const ownDirname = {
  name: 'own-dirname',
  setup (build) {
    for (const name of OWN_DIRNAME) {
      // Real path: esbuild names modules by theirs, also where node_modules (or a package in it) is a
      // symbolic link, as pnpm and monorepos make it; the filter must match those names.
      const dir = realpathSync(join(root, 'node_modules', name))
      let seen = false
      build.onEnd(() => {
        if (!seen) throw new Error(`gatehouse build: no module of ${name} was bundled from ${dir}; its __dirname would be wrong`)
      })
      build.onLoad({ filter: new RegExp(`^${dir.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}[\\/].*\\.js$`) }, async (args) => {
        seen = true
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
  entryPoints: { server: join(src, 'server.ts'), 'cli/main': join(src, 'cli/main.ts') },
  outdir: dist,
  bundle: true,
  format: 'cjs',
  platform: 'node',
  target: 'node20',
  external: EXTERNAL,
  // The sources are ES modules: strict, and import.meta.url is the bundle's own file URL. (The
  // banner comes before esbuild's own "use strict", which would no longer be a directive.)
  banner: { js: "'use strict'; var __gatehouseModuleUrl = require('node:url').pathToFileURL(__filename).href;" },
  define: { 'import.meta.url': '__gatehouseModuleUrl' },
  minifyWhitespace: true,
  minifySyntax: true,
  sourcemap: 'linked',
  metafile: true,
  logLevel: 'warning',
  plugins: [ownDirname]
})
if (result.errors.length > 0) process.exit(1)

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
writeFileSync(join(dist, 'meta.json'), JSON.stringify(result.metafile))
writeFileSync(join(dist, 'package.json'), '{ "type": "commonjs" }\n')
writeFileSync(join(dist, '.built'), `${new Date().toISOString()}\n`)
