// The entry of the service's bundle, dist/gatehouse.cjs: what the launchers
// (dist/server.js and dist/warm-code-cache.js) call.
export { startServer } from '../server.ts'
export { exerciseStart } from './exercise.ts'
export { setPackageImporter } from '../lib/import-package.ts'
