import Fastify, { type FastifyBaseLogger, type FastifyServerOptions, type RawReplyDefaultExpression, type RawRequestDefaultExpression, type RawServerDefault } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { Config } from './config.ts'
import type { Db } from './db/database.ts'
import { registerErrorHandling } from './errors.ts'
import type { FastifyTypeBox } from './lib/http.ts'
import { PasswordHasher } from './lib/passwords.ts'
import { drainRequestsOnClose } from './lib/request-drain.ts'
import { MailTemplates } from './mail/mail.templates.ts'
import authPlugin from './auth/auth.plugin.ts'
import idempotencyPlugin from './idempotency/idempotency.plugin.ts'
import usersRoutes from './users/users.routes.ts'
import { PageCache, USERS_PAGE_CACHE_BYTES } from './users/page-cache.ts'
import groupsRoutes from './groups/groups.routes.ts'
import apiKeysRoutes from './api-keys/api-keys.routes.ts'
import eventsRoutes from './events/events.routes.ts'
import databaseRolesRoutes from './database-roles/database-roles.routes.ts'
import webhooksRoutes from './webhooks/webhooks.routes.ts'
import scimRoutes from './scim/scim.routes.ts'
import signInRoutes, { prepareSignIn } from './sessions/sign-in.plugin.ts'
import landingRoutes from './system/landing.ts'
import systemRoutes from './system/system.routes.ts'
import { registerDocs } from './system/api-docs.ts'
import httpPolicy from './system/http-policy.plugin.ts'
import { LogDestination } from './system/log-destination.ts'
import metricsPlugin from './system/metrics.plugin.ts'
import { openDatabase } from './system/open-database.ts'
import { startOutboxWorkers } from './system/outbox-workers.ts'
import { connectRedis } from './system/redis.ts'
import retention from './system/retention.plugin.ts'
import { serverOptions } from './system/server-options.ts'
import { SHARED_SCHEMAS } from './system/shared-schemas.ts'
import { registerTracing } from './telemetry/telemetry.ts'

export interface BuildOptions {
  config: Config
  /** Pass a database to share it (tests, CLI); otherwise one is opened from config and closed with the app. */
  db?: Db
  /** Run migrations before serving (default true). */
  migrate?: boolean
  logger?: FastifyServerOptions['logger']
  /** Where the production logger writes (default stdout); tests read it to prove secrets never appear. */
  logStream?: { write: (line: string) => void }
}

/** The last flush of the log on close, within the shutdown cap (server.ts). */
const LOG_FLUSH_ON_CLOSE_MS = 2000

/**
 * The app, in the order it is put together: the server and its log, the stop,
 * the database, the workers and connections the routes share, what every
 * request meets, then the routes under BASE_PATH. Each step is a module of its own.
 */
export async function buildApp (options: BuildOptions): Promise<FastifyTypeBox> {
  const { config } = options
  // Read first, so that a broken template override stops the start before anything is opened.
  const mailTemplates = config.smtpUrl !== undefined ? new MailTemplates(config.mailTemplatesDir) : undefined
  // Log lines are gathered and written off the request's path (flushed on
  // close); a stdout whose reader is gone drops and counts lines instead of
  // holding the process (system/log-destination.ts). Tests pass their own stream.
  const stdoutLog = options.logStream === undefined && options.logger === undefined ? new LogDestination({ fd: 1, noticeFd: 2 }) : undefined
  const app = Fastify<RawServerDefault, RawRequestDefaultExpression, RawReplyDefaultExpression, FastifyBaseLogger>(
    serverOptions(config, options.logger, options.logStream ?? stdoutLog!)
  ).withTypeProvider<TypeBoxTypeProvider>()
  await registerTracing(app)
  app.decorate('stdoutLog', stdoutLog)

  // First of the stop: every request accepted is answered (503 once the stop has begun) before
  // anything it may use is stopped; the database closes last of all, in onClose.
  const stopping = drainRequestsOnClose(app)
  // Bounded: the last lines must not be what keeps a stopping process alive.
  if (stdoutLog !== undefined) app.addHook('onClose', async () => { await stdoutLog.flushWithin(LOG_FLUSH_ON_CLOSE_MS) })
  const { db, credentials } = await openDatabase(app, config, options.db, options.migrate !== false)

  const passwords = new PasswordHasher(config)
  app.addHook('onClose', async () => { await passwords.close() })
  app.decorate('config', config)
  app.decorate('db', db)
  app.decorate('credentials', credentials)
  app.decorate('usersPages', new PageCache(USERS_PAGE_CACHE_BYTES))
  app.decorate('passwords', passwords)
  const { webhooks, mail } = await startOutboxWorkers(app, config, mailTemplates)
  app.decorate('webhooks', webhooks)
  app.decorate('mail', mail)
  const redis = await connectRedis(app, config)
  const signIn = prepareSignIn(app, redis, mail)

  registerErrorHandling(app)
  for (const schema of SHARED_SCHEMAS) app.addSchema(schema)
  await app.register(httpPolicy, { redis, stopping })
  await app.register(retention)
  // Before the routes: it gives the routes that opt in (`config.idempotent`) their hooks as they are added.
  await app.register(idempotencyPlugin)
  if (config.docsEnabled) await registerDocs(app, config)
  if (config.metricsEnabled) await app.register(metricsPlugin, { path: `${config.basePath}/metrics` })

  await app.register(async (api: FastifyTypeBox) => {
    await api.register(authPlugin)
    await api.register(systemRoutes, { redis })
    await api.register(usersRoutes)
    await api.register(groupsRoutes)
    await api.register(apiKeysRoutes)
    await api.register(eventsRoutes)
    await api.register(databaseRolesRoutes)
    await api.register(webhooksRoutes, { sender: webhooks.sender })
    await api.register(scimRoutes, { prefix: '/scim/v2' })
    await api.register(signInRoutes, await signIn())
    await api.register(landingRoutes)
  }, { prefix: config.basePath })

  return app
}
