import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { Config } from '../config.ts'
import type { FastifyTypeBox } from '../lib/http.ts'
import { finishDocument, operationTransform } from '../lib/openapi.ts'
import { SCIM_SECURITY_SCHEME } from '../scim/scim.schemas.ts'
import { DOCS_THEME } from './docs-theme.ts'
import { LICENSE } from './release.ts'
import { RELEASE } from './system.routes.ts'

/**
 * Relative, so it is the origin the document was fetched from: wherever this
 * deployment answers. `x-internal: false`: the document is for every client.
 */
const DOCUMENT_SERVER = { url: '/', description: 'This deployment (production, staging or local): the origin serving this document.', 'x-internal': false }

/** The OpenAPI document at `/auth/openapi.json` and Swagger UI at `/auth/docs`, built from the routes' schemas. */
export async function registerDocs (app: FastifyTypeBox, config: Config): Promise<void> {
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
    uiHooks: { onRequest: async (_request, reply) => { reply.header('X-Frame-Options', 'DENY') } },
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
