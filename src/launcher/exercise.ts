import { buildApp } from '../app.ts'
import { bootstrap } from '../bootstrap.ts'
import { loadConfig } from '../config.ts'
import { loadPg } from '../db/pg-driver.ts'

/**
 * Runs what a start runs, on an in-memory database and without a port, then
 * answers one health check: `npm run build` calls it (through
 * dist/warm-code-cache.js) so that the code V8 compiles on the way is kept,
 * and the first `npm start` after an install does not compile it again.
 */
export async function exerciseStart (): Promise<void> {
  const config = loadConfig({ DATABASE_URL: 'sqlite::memory:', LOG_LEVEL: 'silent' })
  // pg's own start-up (its modules, run once) is kept too, for deployments on PostgreSQL; connecting needs a server.
  loadPg()
  const app = await buildApp({ config })
  try {
    await bootstrap(app.db, app.passwords, config, app.log)
    await app.ready()
    const health = await app.inject({ url: `${config.basePath}/healthz` })
    if (health.statusCode !== 200) throw new Error(`the health check answered ${health.statusCode}: ${health.body}`)
  } finally {
    await app.close()
  }
}
