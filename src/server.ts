import { realpathSync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.ts'
import { bootstrap } from './bootstrap.ts'
import { ConfigError, loadConfig } from './config.ts'
import { AppError } from './errors.ts'

/**
 * The process entry: config, bootstrap, listen, graceful shutdown. Run by
 * `npm start` (this file) and by `gatehouse serve` (src/cli/main.ts).
 */
export async function startServer (): Promise<void> {
  let config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`gatehouse: ${error.message}\n`)
      process.exit(2)
    }
    throw error
  }

  const app = await buildApp({ config })
  let generatedKey: string | undefined
  try {
    ({ generatedKey } = await bootstrap(app.db, app.passwords, config, app.log))
  } catch (error) {
    // A bad GATEHOUSE_ADMIN_* value is a configuration mistake: say which, in one line.
    if (error instanceof ConfigError || error instanceof AppError) {
      process.stderr.write(`gatehouse: cannot create the first admin: ${error instanceof AppError ? error.detail : error.message}\n`)
      await app.close()
      process.exit(2)
    }
    throw error
  }
  const address = await app.listen({ host: config.host, port: config.port })
  const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${config.port}${config.basePath}`

  if (generatedKey !== undefined) {
    // Printed once, to the terminal only: the database keeps just its digest.
    process.stdout.write(
      `\nAdmin API key (shown once, store it now): ${generatedKey}\n` +
      `Open ${base}/docs, click Authorize, paste this key.\n\n`
    )
  }
  app.log.info({ address, docs: `${base}/docs` }, 'gatehouse is serving')

  closeWithGrace({ delay: 10_000 }, async ({ err }) => {
    if (err !== undefined) app.log.error({ err }, 'shutting down after an error')
    await app.close()
  })
}

// Started directly (`tsx src/server.ts`), not imported by the CLI.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  await startServer()
}
