import type { Redis } from 'ioredis'
import type { Config } from '../config.ts'
import accountRoutes from '../account/account.routes.ts'
import accountPages from '../account/account-pages.ts'
import consoleRoutes from '../console/console.routes.ts'
import setupRoutes from '../console/setup.ts'
import { BackgroundTasks } from '../lib/background.ts'
import type { FastifyTypeBox } from '../lib/http.ts'
import { randomSecret } from '../lib/secrets.ts'
import type { MailWorker } from '../mail/mail.worker.ts'
import mfaPages from '../mfa/mfa-pages.ts'
import mfaRoutes from '../mfa/mfa.routes.ts'
import { PASSWORD_RESET_REQUEST, resolvePasswordResetRequest } from '../password-resets/password-resets.service.ts'
import { deviceKeyOf } from './device-trust.ts'
import { memoryFailureCounter, redisFailureCounter } from './failure-counter.ts'
import loginPage from './login-page.ts'
import sessionsRoutes from './sessions.routes.ts'
import type { SessionsDeps } from './sessions.types.ts'
import oidcRoutes from '../sso/oidc.routes.ts'
import { prepareCode } from '../tokens/token-codes.ts'

/** What every door a person signs in at shares, once its dummy hash is ready. */
export type SignInWiring = SessionsDeps & { config: Config, background: BackgroundTasks }

/**
 * Sets up what the sign-in doors share: the failure counter (in Redis when
 * there is one, so every instance counts the same failures), the hash a
 * sign-in without a real one verifies against, the device-trust key, and the
 * background tasks a request starts without waiting for. Call it before the
 * other routes are registered: the dummy hash is computed on the thread pool
 * meanwhile, and awaited by `ready`.
 */
export function prepareSignIn (app: FastifyTypeBox, redis: Redis | undefined, mail: MailWorker | undefined): () => Promise<SignInWiring> {
  const { db, passwords, config } = app
  const failures = redis !== undefined ? redisFailureCounter(redis) : memoryFailureCounter()
  app.addHook('onClose', async () => { await failures.close() })
  // Verified against when a sign-in has no real hash to check, so every failure costs one argon2 verification.
  const dummyHashing = passwords.hashAtStartUp(randomSecret('dummy_'))
  dummyHashing.catch(() => {}) // a failure surfaces in `ready`, not as an unhandled rejection meanwhile
  const deviceKey = deviceKeyOf(db)
  // What a request started and does not wait for (a password-reset request's look-up), finished before the database closes.
  const background = new BackgroundTasks(app.log)
  app.addHook('preClose', async () => { await background.drain() })
  // With SMTP a reset request is queued in the outbox and resolved by the mail worker, which imports no service.
  mail?.resolveRequests(PASSWORD_RESET_REQUEST, async () => {
    const code = await prepareCode(passwords)
    return async (trx, data) => await resolvePasswordResetRequest({ failures, config }, trx, data, code)
  })
  return async () => ({ db, passwords, failures, config, dummyHash: await dummyHashing, deviceKey, background })
}

/** The doors people sign in at, and the pages behind them: the API's sessions, the sign-in, second-factor, SSO, console, setup and account pages. */
export default async function signInRoutes (api: FastifyTypeBox, wiring: SignInWiring): Promise<void> {
  const doors: Array<(app: FastifyTypeBox, deps: SignInWiring) => Promise<void>> = [sessionsRoutes, loginPage, mfaRoutes, mfaPages, oidcRoutes, consoleRoutes, setupRoutes, accountRoutes, accountPages]
  for (const routes of doors) {
    await api.register(routes, wiring)
  }
}
