// dist/server.js, what `npm start` runs (built from this file by scripts/build.js):
// loads the service's bundle with the code V8 compiled for it before, and starts it.
import { fileURLToPath } from 'node:url'
import { loadBundle } from './code-cache.ts'

const { exports, codeCache } = loadBundle<typeof import('./bundle.ts')>(fileURLToPath(new URL('./gatehouse.cjs', import.meta.url)))
exports.setPackageImporter(async specifier => await import(specifier))
await exports.startServer({ codeCache })
