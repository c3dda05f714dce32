import { realpathSync, write as writeAsync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.ts'
import { issueFirstAdminKey, registerConfiguredAdmins } from './bootstrap.ts'
import { ConfigError, loadConfig, retiredSettingWarnings } from './config.ts'
import { SchemaBehindError } from './db/migrate.ts'
import { AppError } from './errors.ts'
import { KeyFileError, withEmbeddedKey } from './key-ring/key-file.ts'
import { unopenableWarnings } from './key-ring/key-ring.service.ts'

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
  let embedded
  try {
    embedded = withEmbeddedKey(config, { generate: true })
  } catch (error) {
    if (error instanceof KeyFileError) {
      process.stderr.write(`gatehouse: ${error.message}\n`)
      process.exit(2)
    }
    throw error
  }
  config = embedded.config

  let app
  try {
    app = await buildApp({ config })
  } catch (error) {
    // What buildApp reads besides the environment (MAIL_TEMPLATES_DIR's templates) can be a configuration mistake too,
    // and so is a database left behind with MIGRATE_ON_START=false.
    if (error instanceof ConfigError || error instanceof SchemaBehindError) {
      process.stderr.write(`gatehouse: ${error.message}\n`)
      process.exit(2)
    }
    throw error
  }
  for (const warning of retiredSettingWarnings(process.env)) app.log.warn(warning)
  for (const warning of await unopenableWarnings(app.db, config.mfaKeyRing)) {
    app.log.error({ key_id: warning.keyId, count: warning.count }, warning.message)
  }
  try {
    await registerConfiguredAdmins(app.db, app.passwords, config, app.log)
  } catch (error) {
    // A bad GATEHOUSE_ADMIN_* value is a configuration mistake: say which, in one line.
    if (error instanceof ConfigError || error instanceof AppError) {
      process.stderr.write(`gatehouse: cannot create the first admin: ${error instanceof AppError ? error.detail : error.message}\n`)
      await app.close()
      process.exit(2)
    }
    throw error
  }
  const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${config.port}${config.basePath}`
  let address: string
  try {
    address = await app.listen({ host: config.host, port: config.port })
  } catch (error) {
    const problem = listenProblem(error as NodeJS.ErrnoException, config.host, config.port)
    if (problem === undefined) throw error
    // No key was issued yet (below), so the start that succeeds prints it.
    process.stderr.write(`gatehouse: ${problem}\n`)
    await app.close()
    process.exit(1)
  }

  // Said once the port is bound, like the first key: a start that fails before says only why it failed.
  if (embedded.generated === true) {
    app.log.warn({ file: embedded.file }, `generated a key for authenticator apps (MFA_ENCRYPTION_KEY) into ${embedded.file}: keep it with the database, and back it up with it; docs/mfa.md says how to move to a key of your own`)
  } else if (embedded.file !== undefined) {
    app.log.info({ file: embedded.file }, `MFA_ENCRYPTION_KEY is the key in ${embedded.file}`)
  }
  const generatedKey = await issueFirstAdminKey(app.db, config)
  if (generatedKey !== undefined) printGeneratedKey(generatedKey, base)
  app.log.info({ address, docs: `${base}/docs` }, 'gatehouse is serving')

  // SIGPIPE stays ignored, as Node.js sets it: a stdout whose reader is gone
  // then fails writes with EPIPE, which the log destination turns into
  // dropped lines (system/log-destination.ts), rather than killing the
  // process without its shutdown. Past SHUTDOWN_CAP_MS close-with-grace ends
  // the process whatever is still open; nothing in the shutdown writes
  // synchronously or loops, so that timer always gets to run.
  closeWithGrace({ delay: SHUTDOWN_CAP_MS }, async ({ err, signal }) => {
    if (err !== undefined) app.log.error({ err }, 'shutting down after an error')
    else app.log.info({ signal }, 'shutting down')
    await app.close()
    const log = app.stdoutLog
    if (log !== undefined && log.droppedLines > 0) {
      await noticeOnStderr(`gatehouse: ${log.droppedLines} log line(s) could not be written to stdout${log.brokenBy !== undefined ? ` (${log.brokenBy})` : ''}\n`)
    }
  })
}

/** How long a shutdown may take, requests in flight and the last log lines included; then the process ends anyway. */
export const SHUTDOWN_CAP_MS = 10_000
const STDERR_NOTICE_MS = 250

/** Written asynchronously and waited for briefly: a stderr nobody reads must not hold the exit either. */
async function noticeOnStderr (text: string): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  await Promise.race([
    new Promise<void>(resolve => { writeAsync(2, text, () => { resolve() }) }),
    new Promise<void>(resolve => { timer = setTimeout(resolve, STDERR_NOTICE_MS) })
  ]).finally(() => { clearTimeout(timer) })
}

/** Printed once, to the terminal only: the database keeps just its digest. */
function printGeneratedKey (key: string, base: string): void {
  process.stdout.write(
    `\nAdmin API key (shown once, store it now): ${key}\n` +
    `Open ${base}/docs, click Authorize, paste this key.\n` +
    `For the admin console, open ${base}/admin/setup, paste this key and choose the first admin's username and password.\n\n`
  )
}

/** A listen failure the operator fixes through HOST or PORT, said in one line; undefined for anything else. */
function listenProblem (error: NodeJS.ErrnoException, host: string, port: number): string | undefined {
  switch (error.code) {
    case 'EADDRINUSE': return `port ${port} on ${host} is in use; set PORT to a free port, or stop the process that holds it`
    case 'EACCES': return `not allowed to listen on port ${port} on ${host} (ports below 1024 need privileges); set PORT to 1024 or above`
    case 'EADDRNOTAVAIL': return `cannot listen on ${host}: no network interface of this machine has that address; set HOST (0.0.0.0 for all)`
    case 'ENOTFOUND': case 'EAI_AGAIN': return `cannot listen on ${host}: the name does not resolve; set HOST to an address of this machine`
    default: return undefined
  }
}

// Started directly (`tsx src/server.ts`, or `node dist/server.js`, this file bundled), not imported.
// The name is checked too: in the CLI's bundle (dist/cli/main.js) this module shares the entry's
// import.meta.url.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href && /server\.[jt]s$/.test(process.argv[1])) {
  startServer().catch((error: unknown) => {
    // A failed start ends the process, without waiting on what a half-built app left open.
    console.error(error)
    process.exit(1)
  })
}
