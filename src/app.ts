import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import Fastify, {
  errorCodes,
  LogController,
  type FastifyBaseLogger,
  type FastifyReply,
  type FastifyRequest,
  type FastifyServerOptions,
  type RawReplyDefaultExpression,
  type RawRequestDefaultExpression,
  type RawServerDefault
} from 'fastify'
import { AjvCompiler, type BuildCompilerFromPool, type RouteDefinition } from '@fastify/ajv-compiler'
import { SerializerSelector } from '@fastify/fast-json-stringify-compiler'
import cookie from '@fastify/cookie'
import formbody from '@fastify/formbody'
import multipart from '@fastify/multipart'
import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyTypeBox } from './lib/http.ts'
import type { Config } from './config.ts'
import { createDb, isPostgres, type Db } from './db/database.ts'
import { CredentialCache, watchCredentialChanges, writesPlugin } from './auth/credential-cache.ts'
import { prepareSchemaAtStart } from './db/migrate.ts'
import { answerClientError, answerFrameworkError, AppError, registerErrorHandling } from './errors.ts'
import { secretParamsOf } from './lib/query-string.ts'
import { PasswordHasher } from './lib/passwords.ts'
import { rejectNulBytes } from './lib/nul-bytes.ts'
import { rejectPrototypeNames } from './lib/object-keys.ts'
import { trustFunction, withForwarding } from './lib/forwarded.ts'
import { decimalNumbersOnly } from './lib/decimal-numbers.ts'
import { jsonParserWithPosition } from './lib/json-body.ts'
import { finishDocument, operationTransform, Problem } from './lib/openapi.ts'
import { lazySerializer, lazyValidator } from './lib/lazy-compile.ts'
import { referencedSchemas } from './lib/schema-refs.ts'
import authPlugin from './auth/auth.plugin.ts'
import { Invitation, User, UserCreate, UserCreated, UserPatch } from './users/users.schemas.ts'
import usersRoutes from './users/users.routes.ts'
import { GROUP_SCHEMAS } from './groups/groups.schemas.ts'
import groupsRoutes from './groups/groups.routes.ts'
import { ApiKey, ApiKeyCreate, ApiKeyWithSecret } from './api-keys/api-keys.schemas.ts'
import apiKeysRoutes from './api-keys/api-keys.routes.ts'
import { Event } from './events/events.schemas.ts'
import eventsRoutes from './events/events.routes.ts'
import databaseRolesRoutes from './database-roles/database-roles.routes.ts'
import { DatabaseRoleChange } from './database-roles/database-roles.schemas.ts'
import { WEBHOOK_SCHEMAS } from './webhooks/webhooks.schemas.ts'
import webhooksRoutes from './webhooks/webhooks.routes.ts'
import { WebhookWorker } from './webhooks/webhooks.worker.ts'
import { purgeWebhookHistory } from './webhooks/webhooks.service.ts'
import { mailKeyOf, MailPolicyPlugin } from './mail/mail.outbox.ts'
import { deleteFinishedMailBefore } from './mail/mail.repository.ts'
import { MailTemplates } from './mail/mail.templates.ts'
import { MailWorker } from './mail/mail.worker.ts'
import { PASSWORD_RESET_REQUEST, resolvePasswordResetRequest } from './password-resets/password-resets.service.ts'
import { prepareCode } from './tokens/token-codes.ts'
import systemRoutes, { RELEASE } from './system/system.routes.ts'
import { LICENSE } from './system/release.ts'
import metricsPlugin from './system/metrics.plugin.ts'
import { DOCS_THEME } from './system/docs-theme.ts'
import { LogDestination } from './system/log-destination.ts'
import { ACCESS_MESSAGE, accessLine, loggerOptions } from './system/access-log.ts'
import { LoginBody, PasswordChange, Session, SessionsEnded, SessionSummary } from './sessions/sessions.schemas.ts'
import sessionsRoutes from './sessions/sessions.routes.ts'
import loginPage from './sessions/login-page.ts'
import { MFA_SCHEMAS } from './mfa/mfa.schemas.ts'
import mfaRoutes from './mfa/mfa.routes.ts'
import mfaPages from './mfa/mfa-pages.ts'
import { SSO_SCHEMAS } from './sso/oidc.schemas.ts'
import oidcRoutes from './sso/oidc.routes.ts'
import { deleteChallengesBefore } from './mfa/mfa.repository.ts'
import consoleRoutes from './console/console.routes.ts'
import setupRoutes from './console/setup.ts'
import landingRoutes from './system/landing.ts'
import accountRoutes, { ACCOUNT_SCHEMAS } from './account/account.routes.ts'
import accountPages from './account/account-pages.ts'
import { BackgroundTasks } from './lib/background.ts'
import { RequestDrain } from './lib/request-drain.ts'
import { deleteTokensEndedBefore } from './tokens/tokens.repository.ts'
import { purgeSignInHistory } from './sessions/sessions.service.ts'
import { memoryFailureCounter, redisFailureCounter } from './sessions/failure-counter.ts'
import { deviceKeyOf } from './sessions/device-trust.ts'
import { randomSecret } from './lib/secrets.ts'
import rateLimitPlugin from './system/rate-limit.plugin.ts'
import idempotencyPlugin from './idempotency/idempotency.plugin.ts'
import { purgeIdempotencyKeys } from './idempotency/idempotency.service.ts'
import scimRoutes, { canonicalScimUrl } from './scim/scim.routes.ts'
import { SCIM_SCHEMAS, SCIM_SECURITY_SCHEME } from './scim/scim.schemas.ts'

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

/** How long the outbox keeps a message sent or given up (its payload is gone already): for the event log's mail ids. */
const MAIL_RETENTION_MS = 30 * 86_400_000
/** The last flush of the log on close, within the shutdown cap (server.ts). */
const LOG_FLUSH_ON_CLOSE_MS = 2000
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/
const AJV_OPTIONS = { removeAdditional: false, useDefaults: true, allErrors: true } as const
const ajvCompilers = AjvCompiler()

/** Two Ajv instances over the same shared schemas: exact for bodies, coercing for the textual parts. */
const buildValidators: BuildCompilerFromPool = (externalSchemas) => {
  // The Ajv instances too are made by the first request that validates (see lib/lazy-compile.ts).
  type Compile = ReturnType<typeof ajvCompilers>
  let exact: Compile | undefined
  let coercing: Compile | undefined
  return ((route: RouteDefinition) => lazyValidator(() => route.httpPart === 'body'
    ? (exact ??= ajvCompilers(externalSchemas, { customOptions: { ...AJV_OPTIONS, coerceTypes: false } }))(route)
    : decimalNumbersOnly((coercing ??= ajvCompilers(externalSchemas, { customOptions: { ...AJV_OPTIONS, coerceTypes: 'array' } }))(route)))) as ReturnType<BuildCompilerFromPool>
}
const serializerSelector = SerializerSelector()
/**
 * Response serializers, compiled on first use (see lib/lazy-compile.ts), each
 * given only the shared schemas its response refers to: fast-json-stringify
 * checks every schema it is given against the JSON Schema meta-schema at each
 * build, which with all of them cost a route's first request some 15 ms.
 */
const buildSerializers: typeof serializerSelector = (externalSchemas, options) => {
  return (route) => lazySerializer(() => serializerSelector(referencedSchemas(route.schema, (externalSchemas ?? {}) as Record<string, unknown>), options)(route))
}
const SHARED_SCHEMAS = [Problem, User, UserCreate, UserPatch, Invitation, UserCreated, ApiKey, ApiKeyCreate, ApiKeyWithSecret, Event, LoginBody, Session, PasswordChange, SessionSummary, SessionsEnded, ...MFA_SCHEMAS, ...SSO_SCHEMAS, ...ACCOUNT_SCHEMAS, ...GROUP_SCHEMAS, DatabaseRoleChange, ...SCIM_SCHEMAS]

export async function buildApp (options: BuildOptions): Promise<FastifyTypeBox> {
  const { config } = options
  // Log lines are gathered and written 32 KiB at a time, off the request's
  // path (at most 250 ms late, flushed on close): one write(2) per request line
  // was a tenth of a list request's cost. A stdout whose reader is gone drops
  // and counts lines instead of holding the process (system/log-destination.ts).
  // Tests pass their own stream.
  // Read first, so that a broken template override stops the start before anything is opened.
  const mailTemplates = config.smtpUrl !== undefined ? new MailTemplates(config.mailTemplatesDir) : undefined
  const stdoutLog = options.logStream === undefined && options.logger === undefined ? new LogDestination({ fd: 1, noticeFd: 2 }) : undefined
  const logDestination = options.logStream ?? stdoutLog!
  const logAccess = (request: FastifyRequest, reply: FastifyReply): void => {
    if (options.logger === undefined) {
      const line = accessLine(request, reply)
      if (line !== undefined) logDestination.write(line)
    } else {
      request.log.info({ req: request, res: reply, responseTime: reply.elapsedTime }, ACCESS_MESSAGE)
    }
  }
  const forwarding = config.trustProxy !== false ? trustFunction(config.trustProxy) : undefined
  const app = Fastify<RawServerDefault, RawRequestDefaultExpression, RawReplyDefaultExpression, FastifyBaseLogger>({
    logger: options.logger ?? loggerOptions(config.logLevel, logDestination),
    // Unknown and read-only fields are an error, not something to drop silently.
    // Query strings, path and headers are text, so they are coerced to the
    // declared types; JSON bodies are taken exactly as sent (form bodies are
    // coerced by the routes that accept them, see lib/forms.ts).
    schemaController: {
      compilersFactory: {
        buildValidator: buildValidators,
        buildSerializer: buildSerializers
      }
    },
    bodyLimit: config.bodyLimitBytes,
    requestTimeout: config.requestTimeoutMs,
    // Node's own deadline for the headers (60 s), checked every 30 s, would
    // otherwise hold a slow client for up to 90 s whatever REQUEST_TIMEOUT_MS says.
    http: { requestTimeout: config.requestTimeoutMs, headersTimeout: config.requestTimeoutMs, connectionsCheckingInterval: 1000 },
    // What is refused before routing (an undecodable URL) or before a request
    // exists (oversized headers, a timeout) is answered as a problem too.
    // No hook runs for these, so their access line is written here.
    frameworkErrors: (error, request, reply) => {
      const seen = forwarding !== undefined ? withForwarding(request, forwarding) : request
      answerFrameworkError(error, seen, reply, config.hsts)
      logAccess(seen, reply)
    },
    clientErrorHandler: answerClientError,
    trustProxy: config.trustProxy,
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    requestIdHeader: false,
    genReqId: (req) => {
      const given = req.headers['x-request-id']
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID()
    },
    return503OnClosing: true,
    // SCIM endpoint names in any case (scim/scim.routes.ts); every other URL as it came.
    rewriteUrl: (req) => canonicalScimUrl(req.url ?? '/', config.basePath),
    // One line per request (written in onResponse below) instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true }),
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 200 }
  }).withTypeProvider<TypeBoxTypeProvider>()

  app.decorate('stdoutLog', stdoutLog)
  // First of the stop: every request accepted is answered (503 once the stop has begun, Fastify's
  // return503OnClosing) before anything it may use is stopped; the database closes last of all, in onClose.
  let shuttingDown = false
  const requests = new RequestDrain(app.server)
  app.addHook('preClose', async () => {
    shuttingDown = true
    await requests.drain()
  })
  // Bounded: the last lines must not be what keeps a stopping process alive.
  if (stdoutLog !== undefined) app.addHook('onClose', async () => { await stdoutLog.flushWithin(LOG_FLUSH_ON_CLOSE_MS) })
  const ownDb = options.db ?? createDb(config)
  if (options.db === undefined) app.addHook('onClose', async () => { await ownDb.destroy() })
  // Checked credentials are cached briefly; every write through this handle that could end one empties the cache.
  const credentials = new CredentialCache(config.credentialCacheTtlMs, !isPostgres(ownDb))
  // Whether mail is queued, and which notices, travels on the handle into every transaction (mail/mail.outbox.ts).
  const db = ownDb.withPlugin(writesPlugin(credentials))
    .withPlugin(new MailPolicyPlugin({ sending: config.smtpUrl !== undefined, notices: new Set(config.mailNotices), sealKey: mailKeyOf(config.mfaEncryptionKey) }))
  const stopWatching = watchCredentialChanges(db, config, credentials, app.log)
  app.addHook('preClose', stopWatching)
  if (options.migrate !== false) {
    try {
      await prepareSchemaAtStart(db, config.databaseSchema, { migrate: config.migrateOnStart, log: app.log })
    } catch (error) {
      // Nobody gets this app to close: what it opened goes now, or the PostgreSQL pool and the
      // credential listener's reconnecting would keep the process (a test file, the CLI) alive.
      await stopWatching()
      if (options.db === undefined) await ownDb.destroy().catch(() => {})
      throw error
    }
  }

  const passwords = new PasswordHasher(config)
  app.addHook('onClose', async () => { await passwords.close() })
  app.decorate('config', config)
  app.decorate('db', db)
  app.decorate('credentials', credentials)
  app.decorate('passwords', passwords)
  // Delivers queued webhook events; stopped before the database closes, after its deliveries in flight are recorded.
  const webhooks = new WebhookWorker(db, config, app.log, `gatehouse-webhooks/${RELEASE}`)
  app.decorate('webhooks', webhooks)
  if (config.webhookDelivery) app.addHook('onReady', async () => { webhooks.start() })
  app.addHook('preClose', async () => { await webhooks.stop() })
  // Sends queued mail when SMTP is configured.
  const mail = mailTemplates !== undefined ? await MailWorker.create(db, config, mailTemplates, app.log) : undefined
  app.decorate('mail', mail)
  if (mail !== undefined && config.mailDelivery) app.addHook('onReady', async () => { mail.start() })
  if (mail !== undefined) app.addHook('preClose', async () => { await mail.stop() })
  if (mailTemplates !== undefined && mailTemplates.unused.length > 0) {
    app.log.warn({ files: mailTemplates.unused }, 'MAIL_TEMPLATES_DIR holds files that match no mail template; they are ignored (docs/email.md#templates)')
  }
  if (mail === undefined) app.log.info('no SMTP_URL: no mail is sent, and security notices are not queued (docs/email.md#without-smtp)')
  const redis = config.redisUrl !== undefined
    // Imported only when configured: ioredis is a tenth of start-up's module loading.
    ? new (await import('ioredis')).Redis(config.redisUrl, {
      // Every command has a deadline, also while it waits for a (re)connection
      // in the offline queue; past it the request gets 503 (errors.ts).
      commandTimeout: config.redisCommandTimeoutMs,
      // A connection that owes answers and receives nothing for this long is
      // dead though never closed (a network dropping packets): drop it and
      // reconnect, rather than send every later command into the void.
      socketTimeout: config.redisCommandTimeoutMs,
      connectTimeout: config.redisCommandTimeoutMs,
      maxRetriesPerRequest: 2
    })
    : undefined
  // Connection errors surface on the commands that need the connection; the event must still be handled.
  redis?.on('error', () => {})
  // The first requests after start would otherwise race the connection's
  // handshake against their command deadline. A Redis that does not come up
  // in time does not stop the start: requests that need it get 503 and
  // /readyz says so until it answers.
  if (redis !== undefined) {
    app.addHook('onReady', async () => {
      if (redis.status === 'ready') return
      let timer: NodeJS.Timeout | undefined
      await Promise.race([
        once(redis, 'ready').catch(() => {}),
        new Promise(resolve => { timer = setTimeout(resolve, config.redisCommandTimeoutMs) })
      ]).finally(() => clearTimeout(timer))
    })
  }
  const failures = redis !== undefined ? redisFailureCounter(redis) : memoryFailureCounter()
  app.addHook('onClose', async () => {
    await failures.close()
    // QUIT waits for an answer, which a stalled Redis never gives.
    await redis?.quit().catch(() => { redis.disconnect() })
  })
  // Verified against when a sign-in has no real hash to check, so every failure costs one argon2 verification.
  // Hashed on the thread pool while the routes below are set up; awaited before the sign-in routes need it.
  const dummyHashing = passwords.hashAtStartUp(randomSecret('dummy_'))
  dummyHashing.catch(() => {}) // a failure surfaces at the await below, not as an unhandled rejection meanwhile
  const deviceKey = deviceKeyOf(db)
  // What a request started and does not wait for (a password-reset request's look-up), finished before the database closes.
  const background = new BackgroundTasks(app.log)
  app.addHook('preClose', async () => { await background.drain() })
  // With SMTP a reset request is queued in the outbox and resolved by the mail worker, which imports no service.
  mail?.resolveRequests(PASSWORD_RESET_REQUEST, async () => {
    const code = await prepareCode(passwords)
    return async (trx, data) => await resolvePasswordResetRequest({ failures, config }, trx, data, code)
  })

  registerErrorHandling(app)
  for (const schema of [...SHARED_SCHEMAS, ...WEBHOOK_SCHEMAS]) app.addSchema(schema)
  // First of all hooks: a request the limiter (or anything else) refuses still names itself.
  // The hooks every request passes are written with `done` rather than async:
  // an async hook costs a promise and a microtask turn per request (see bench/README.md, "Issue 20: the request pipeline").
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-Id', request.id)
    done()
  })

  await app.register(cookie)
  await app.register(rateLimitPlugin, { redis })
  await app.register(formbody, { bodyLimit: config.bodyLimitBytes })
  await app.register(multipart, {
    attachFieldsToBody: 'keyValues',
    limits: { files: 0, fields: 50, fieldSize: config.bodyLimitBytes, parts: 50, fieldNameSize: 100 }
  })
  // Fastify's own JSON parsing, with syntax errors that say where (lib/json-body.ts).
  const parseJson = jsonParserWithPosition(app)
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson)
  app.addContentTypeParser('application/merge-patch+json', { parseAs: 'string', bodyLimit: config.bodyLimitBytes }, parseJson)
  // After multipart's own preValidation hook, which is where a multipart body is parsed.
  app.addHook('preValidation', rejectNulBytes)
  app.addHook('preValidation', rejectPrototypeNames)

  app.addHook('onResponse', (request, reply, done) => {
    logAccess(request, reply)
    // Node discards the rest of a body only when nothing began to read it. A
    // multipart upload refused part-way (a file part, too many fields) was begun
    // by busboy and then dropped: the connection stopped reading, and the
    // client's next request on it waited for REQUEST_TIMEOUT_MS and got 408.
    // Discarding the rest as Node would keeps the connection in step; the
    // request timeout still bounds how long that reading may take.
    const raw = request.raw
    if (!raw.complete && !raw.destroyed) {
      raw.unpipe()
      raw.removeAllListeners('data')
      raw.resume()
    }
    done()
  })
  app.addHook('onRequest', (request, _reply, done) => {
    const secrets = request.routeOptions.config.secretsInBody === true ? secretParamsOf(request.url) : []
    if (secrets.length === 0) {
      done()
      return
    }
    const names = [...new Set(secrets)].map(name => JSON.stringify(name.slice(0, 64))).join(', ')
    done(new AppError('credentials_in_query', 400, `Send ${names} in the body, not in the URL: addresses are kept in logs and browser history. Treat what the URL held as exposed.`))
  })
  app.addHook('preParsing', (request, reply, payload, done) => {
    const type = request.headers['content-type']
    if (type === undefined) {
      done(null, payload)
      return
    }
    const essence = type.split(';')[0]!.trim().toLowerCase()
    const accepts = request.routeOptions.config.accepts
    if (accepts !== undefined && !accepts.includes(essence)) {
      done(new AppError('unsupported_media_type', 415, `This operation takes ${accepts.join(', ')}; got ${essence}.`))
      return
    }
    // Fastify holds the bodies it reads itself (JSON, forms) to the route's
    // limit; busboy reads multipart bodies and knows only its per-part limits,
    // so a larger one was read to its end. One declared over the limit is
    // refused before it is read, and, as Fastify does, the connection is closed
    // rather than read on to the end of that body.
    if (essence === 'multipart/form-data' && Number(request.headers['content-length']) > request.routeOptions.bodyLimit) {
      reply.header('Connection', 'close')
      done(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE())
      return
    }
    done(null, payload)
  })
  const successorOffset = config.basePath.length
  const hsts = config.hsts
  app.addHook('onSend', (request, reply, payload, done) => {
    // A request answered during a shutdown ends its connection: a client keeping
    // it open would otherwise hold the shutdown until the cap (server.ts).
    if (shuttingDown) reply.header('Connection', 'close')
    reply.header('Cache-Control', 'no-store')
    reply.header('X-Content-Type-Options', 'nosniff')
    // Only over HTTPS (directly, or through TRUST_PROXY's X-Forwarded-Proto): RFC 6797 bars it from plain HTTP answers.
    if (hsts !== undefined && request.protocol === 'https') reply.header('Strict-Transport-Security', hsts)
    // Pages with forms set their own (see sessions/login-page.ts); everything else sends no Referer at all.
    if (!reply.hasHeader('Referrer-Policy')) reply.header('Referrer-Policy', 'no-referrer')
    if (request.routeOptions.config.legacy === true) {
      const path = request.url.split('?')[0]!
      reply.header('Deprecation', `@${Math.floor(DEPRECATED_AT.getTime() / 1000)}`)
      reply.header('Sunset', config.legacySunset.toUTCString())
      reply.header('Link', appendLink(reply.getHeader('Link'), `<${config.basePath}/api${path.slice(successorOffset)}>; rel="successor-version"`))
    }
    done(null, payload)
  })

  const purge = async (): Promise<void> => {
    try {
      const removed = await purgeSignInHistory(db, config)
      // Sign-in and passkey challenges live minutes; an hour past their end they are of no use to anyone.
      await deleteChallengesBefore(db, new Date(Date.now() - 3_600_000).toISOString())
      const webhookHistory = await purgeWebhookHistory(db, config)
      if (webhookHistory.deliveries > 0 || webhookHistory.attempts > 0) app.log.info({ removed: webhookHistory }, 'purged old webhook deliveries and attempts')
      if (removed.sessions > 0 || removed.addresses > 0) app.log.info({ removed }, 'purged old sessions and sign-in addresses')
      const mails = await deleteFinishedMailBefore(db, new Date(Date.now() - MAIL_RETENTION_MS).toISOString())
      if (mails > 0) app.log.info({ removed: { mails } }, 'purged mail sent or given up more than 30 days ago')
      // Invitation, reset and confirmation tokens a day past their end: the event log keeps what happened.
      await deleteTokensEndedBefore(db, new Date(Date.now() - 86_400_000).toISOString())
      const idempotencyKeys = await purgeIdempotencyKeys(db)
      if (idempotencyKeys > 0) app.log.info({ removed: { idempotencyKeys } }, 'purged idempotency keys older than a day')
    } catch (err) {
      app.log.warn({ err }, 'could not purge old sessions; will try again')
    }
  }
  // One purge at a time, none once closing begins, and the last awaited before the database closes.
  let purging: Promise<void> = Promise.resolve()
  let closing = false
  const purgeInBackground = (): void => {
    if (!closing) purging = purging.then(purge)
  }
  const purgeTimer = setInterval(purgeInBackground, 3_600_000).unref()
  // At start as well, once the server listens: nothing waits on it, so the start does not either.
  app.addHook('onReady', async () => { setImmediate(purgeInBackground) })
  app.addHook('preClose', async () => {
    closing = true
    clearInterval(purgeTimer)
    await purging
  })

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
    const dummyHash = await dummyHashing
    await api.register(sessionsRoutes, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(loginPage, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(mfaRoutes, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(mfaPages, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(oidcRoutes, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(consoleRoutes, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(setupRoutes, { db, passwords, failures, config, dummyHash, deviceKey })
    await api.register(accountRoutes, { db, passwords, failures, config, dummyHash, deviceKey, background })
    await api.register(accountPages, { db, passwords, failures, config, dummyHash, deviceKey, background })
    await api.register(landingRoutes)
  }, { prefix: config.basePath })

  return app
}

/** When the 3.6.1 paths were deprecated: the first release that serves /api. */
const DEPRECATED_AT = new Date('2026-11-01T00:00:00Z')

function appendLink (existing: unknown, link: string): string {
  return typeof existing === 'string' && existing !== '' ? `${existing}, ${link}` : link
}

/**
 * Relative, so it is the origin the document was fetched from: wherever this
 * deployment answers. `x-internal: false`: the document is for every client.
 */
const DOCUMENT_SERVER = { url: '/', description: 'This deployment (production, staging or local): the origin serving this document.', 'x-internal': false }

async function registerDocs (app: FastifyTypeBox, config: Config): Promise<void> {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'gatehouse: Auth API',
        version: RELEASE,
        license: { name: LICENSE, identifier: LICENSE },
        description: 'Manages the users of the web UI of the workflow and data-pipeline service: list, create, read, update and delete them; ' +
          'issue revocable API keys; read the event log. Operations tagged `default` are the current release (`/api/...`); ' +
          'those tagged `legacy` are release 3.6.1\'s paths, kept as deprecated aliases.\n\n' +
          'Authorize with an API key: as `?API_KEY=` (as the main API does), `X-API-Key`, or `Authorization: Bearer`. ' +
          'People sign in with `POST /auth/api/login` (a session token, and a cookie for browsers); see the `sessions` tag. ' +
          'Every error is `application/problem+json` with a stable `code`.'
      },
      servers: [DOCUMENT_SERVER],
      tags: [
        { name: 'default', description: 'Users: the current release\'s paths.' },
        { name: 'sessions', description: 'Sign-in for web-UI users, self-service, and the reverse-proxy check.' },
        { name: 'mfa', description: 'Second factors (TOTP, passkeys, recovery codes) and the second step of sign-in.' },
        { name: 'sso', description: 'Single sign-on: OpenID Connect providers and the identities linked to users.' },
        { name: 'groups', description: 'Groups of users: each member\'s `groups` holds the group\'s name.' },
        { name: 'api-keys', description: 'Revocable API keys.' },
        { name: 'events', description: 'The record of every change.' },
        { name: 'webhooks', description: 'Endpoints that receive events, signed per Standard Webhooks; their deliveries and attempts.' },
        { name: 'scim', description: 'SCIM 2.0 provisioning (RFC 7643, RFC 7644) for identity providers, at `/auth/scim/v2` (docs/scim.md): `application/scim+json`, SCIM\'s error bodies, and only an API key with the `scim` scope (`ScimBearer`).' },
        { name: 'system', description: 'Version, health and readiness.' },
        { name: 'legacy', description: 'Release 3.6.1 paths: same operations, deprecated.' }
      ],
      components: {
        securitySchemes: {
          ApiKeyQuery: { type: 'apiKey', in: 'query', name: 'API_KEY', description: 'The main API\'s form, for API keys only (a session token is refused here); can be switched off.' },
          ApiKeyHeader: { type: 'apiKey', in: 'header', name: 'X-API-Key', description: 'An API key, or a session token.' },
          Bearer: { type: 'http', scheme: 'bearer', description: 'An API key, or a session token, as a bearer token.' },
          ScimBearer: SCIM_SECURITY_SCHEME
        }
      }
    },
    // Keep the $id names (User, Problem, …) in components.schemas instead of def-0, def-1, ….
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => typeof json.$id === 'string' ? json.$id : `def-${i}` },
    // What hooks and route config make the server send (headers, 429, public routes) is documented from that config.
    transform: operationTransform({ rateLimited: config.rateLimitPerAddress > 0 || config.rateLimitPerCredential > 0 }),
    transformObject: finishDocument
  })
  await app.register(swaggerUi, {
    routePrefix: `${config.basePath}/docs`,
    // BaseLayout: without the standalone top bar, whose logo, document-URL box (which the CSP below would refuse
    // anyway) and dark-mode switch have no text alternative or label (docs/api.md, "Accessibility of /auth/docs").
    uiConfig: { deepLinking: true, persistAuthorization: false, displayRequestDuration: true, tryItOutEnabled: false, layout: 'BaseLayout' },
    theme: DOCS_THEME,
    staticCSP: true,
    // For browsers that do not read frame-ancestors (below).
    uiHooks: { onRequest: (_request, reply, done) => { reply.header('X-Frame-Options', 'DENY'); done() } },
    // Everything is served from here, so nothing needs other https: origins; and
    // upgrade-insecure-requests would blank the page for anyone reaching the
    // service over plain HTTP by a name other than localhost. Never framed, not
    // even by this origin, like every other page (a framed Authorize dialog
    // is a clickjacking target).
    transformStaticCSP: (header) => header
      .replace("frame-ancestors 'self'", "frame-ancestors 'none'")
      .replace(/\s*upgrade-insecure-requests;/, '')
      .replace(' https: data:;', ' data:;')
      .replace(' validator.swagger.io', '')
      .replace("style-src 'self' https: ", "style-src 'self' ")
  })
  app.get(`${config.basePath}/openapi.json`, { schema: { hide: true } }, async () => app.swagger())
}
