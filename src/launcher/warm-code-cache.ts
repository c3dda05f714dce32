// dist/warm-code-cache.js, run by `npm run build` (and so by `npm install`):
// compiles the bundle the way a start does and keeps the code (code-cache.ts).
import { fileURLToPath } from 'node:url'
import { loadBundle } from './code-cache.ts'

const { exports, codeCache } = loadBundle<typeof import('./bundle.ts')>(fileURLToPath(new URL('./gatehouse.cjs', import.meta.url)))
exports.setPackageImporter(async specifier => await import(specifier))
if (codeCache.state !== 'off') {
  await exports.exerciseStart()
  codeCache.save()
}
