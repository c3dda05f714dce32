import type {
  FastifyBaseLogger,
  FastifyInstance,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault
} from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FieldError } from '../errors.ts'

/**
 * The instance every routes plugin is given: TypeBox schemas type its requests
 * and replies. It lives here, not in app.ts, so that routes never import the
 * composition root that imports them (docs/architecture.md). What app.ts
 * decorates the instance with is declared next to what it is: `config` in
 * config.ts, `db` in db/database.ts, and so on.
 */
export type FastifyTypeBox = FastifyInstance<RawServerDefault, RawRequestDefaultExpression, RawReplyDefaultExpression, FastifyBaseLogger, TypeBoxTypeProvider>

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Served at a 3.6.1 path: answered with Deprecation, Sunset and successor Link headers. */
    legacy?: boolean
    /** Media types the body may have; others get 415 before the body is read. */
    accepts?: string[]
    /**
     * Rules beyond the body's schema (a password's), asked when the body does
     * not match it, so that one 422 lists every problem (errors.ts).
     */
    bodyRules?: (body: unknown) => FieldError[]
    /**
     * Retry-safe with an `Idempotency-Key` header (idempotency/idempotency.plugin.ts,
     * docs/api.md "Retry-safe writes"): a retry with the same key and body gets
     * the first answer again. Needs a `scope`: keys are kept per credential.
     */
    idempotent?: boolean
    /**
     * A sign-in or password operation, whose secrets travel in the body: a
     * secret-bearing query parameter (lib/query-string.ts isSecretParam) is
     * refused with 400 `credentials_in_query` before anything is read, so a
     * client that put the password in the URL (which proxies and browsers
     * keep) learns of it at once.
     */
    secretsInBody?: boolean
  }
}
