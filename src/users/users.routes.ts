import { Readable } from 'node:stream'
import { Type } from 'typebox'
import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { coerceFormFields } from '../lib/forms.ts'
import { passwordPolicyOf } from '../lib/password-policy.ts'
import { setNextLink } from '../lib/paging.ts'
import { FAMILIES, problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import {
  IfMatchHeaders,
  Invitation,
  ListUsersQuery,
  User,
  UserCreate,
  UserCreated,
  UserIdParams,
  UserImport,
  UserImportItem,
  UserImportItemResult,
  UserImportResult,
  UserPatch
} from './users.schemas.ts'
import { AppError } from '../errors.ts'
import { replayWith } from '../idempotency/idempotency.plugin.ts'
import {
  createUser,
  deleteUserById,
  etagOf,
  getUser,
  importUsers,
  inviteUser,
  listUsersPage,
  revokeInvitation,
  passwordRuleErrors,
  streamUsers,
  unlockUser,
  updateUserById,
  type UsersDeps
} from './users.service.ts'

const CREATE_TYPES = ['application/json', 'application/x-www-form-urlencoded', 'multipart/form-data']
const PATCH_TYPES = ['application/merge-patch+json', 'application/json']
const IMPORT_TYPES = ['application/json']
/** 1000 users with hashes and names take some 300 KiB; the general body limit stays small for every other operation. */
const IMPORT_BODY_LIMIT = 4 * 1024 * 1024

export default async function usersRoutes (app: FastifyTypeBox): Promise<void> {
  const deps: UsersDeps = {
    db: app.db,
    passwords: app.passwords,
    passwordPolicy: passwordPolicyOf(app.config),
    invitations: app.config,
    pages: app.usersPages
  }
  const coerceForm = coerceFormFields(UserCreate)
  const UserRef = ref(User)
  for (const schema of [UserImportItem, UserImport, UserImportItemResult, UserImportResult]) app.addSchema(schema)

  // Only in the current family: 3.6.1 had no import, so it gets no legacy alias.
  app.post('/api/users/import', {
    schema: {
      tags: ['default'],
      security: SECURITY,
      operationId: 'import_users',
      summary: 'Import Users',
      description: 'Admins only. Creates up to 1000 users in one request, for moving users from another system: each item is a UserCreate ' +
        'that may carry `password_hash`, an existing PHC hash (argon2, bcrypt or scrypt, with bounded parameters), instead of `password`. ' +
        'Hashes are checked, never recomputed, and replaced by argon2id at the user\'s next sign-in. ' +
        'Each item gets a result (`created` with its `id`, or `error` with a `code`); one `user.created` event is written per created user. ' +
        'With `atomic: true` (the default) any failing item means nothing is created and the answer is a 422 Problem `import_failed` that also carries ' +
        '`atomic`, `created`, `failed` and `results` as in UserImportResult. ' +
        'A body that does not match the schema is refused as a whole (422 `validation_failed`, pointers name the items).',
      consumes: IMPORT_TYPES,
      body: ref(UserImport),
      response: {
        200: { ...ref(UserImportResult), description: 'The import was applied; `results` says what became of each item.' },
        ...problems(401, 403, 409, 413, 415, 422, 503)
      }
    },
    bodyLimit: Math.max(app.config.bodyLimitBytes, IMPORT_BODY_LIMIT),
    // Retry-safe like a single create: a migration script whose import timed out sends it again with the same key.
    config: { scope: 'admin', accepts: IMPORT_TYPES, idempotent: true }
  }, async (request, reply) => {
    const { status, ...report } = await importUsers(deps, request.principal!, requestContext(request), request.body)
    if (status === 200) return await reply.send(report)
    throw new AppError('import_failed', 422, `Nothing was imported: ${report.failed} of ${report.results.length} items failed (see results).`, { extensions: report })
  })

  // Only in the current family, like import: 3.6.1 had no sign-in lock.
  app.post('/api/users/:user_id/unlock', {
    schema: {
      tags: ['default'],
      security: SECURITY,
      operationId: 'unlock_user',
      summary: 'Reset Sign-in Lock',
      description: 'Admins only. Ends the account lock that repeated wrong passwords put on the user (see docs/security.md, "Account locking") ' +
        'and sets their count of failed sign-ins back to 0, with a `user.unlocked` event. An account with nothing to reset is answered the same, ' +
        'and no event is written. Throttling of sign-ins per address is not affected.',
      params: UserIdParams,
      response: { 204: { type: 'null', description: 'The account has no lock and no failed sign-ins counted.' }, ...problems(401, 403, 404, 422, 503) }
    },
    config: { scope: 'admin' }
  }, async (request, reply) => {
    await unlockUser(deps, request.principal!, requestContext(request), request.params.user_id)
    return await reply.code(204).send(null)
  })

  const INVITATION_DOC = ' See docs/email.md#invitations.'
  app.post('/api/users/:user_id/invitation', {
    schema: {
      tags: ['default'],
      security: SECURITY,
      operationId: 'invite_user',
      summary: 'Send or Resend an Invitation',
      description: 'Mails the user a new one-time link and code to set their password and sign in; the earlier link and code stop working ' +
        '(`user.invited`, with `resent: true` for a pending user). A user who has neither a password nor a sign-in yet becomes `invitation_pending`. ' +
        'Without SMTP nothing is mailed and the answer carries `url` and `code` to hand over. The link works for INVITATION_LIFETIME_HOURS (72 h).' + INVITATION_DOC,
      params: UserIdParams,
      response: { 200: { ...ref(Invitation), description: 'Issued.' }, ...problems(401, 403, 404, 409, 422, 503) }
    },
    config: { scope: 'users:write' }
  }, async (request) => await inviteUser(deps, request.principal!, requestContext(request), request.params.user_id))

  app.delete('/api/users/:user_id/invitation', {
    schema: {
      tags: ['default'],
      security: SECURITY,
      operationId: 'revoke_invitation',
      summary: 'Revoke an Invitation',
      description: 'The pending invitation\'s link and code stop working (`user.invitation_revoked`). The user stays pending: resend, or delete them.' + INVITATION_DOC,
      params: UserIdParams,
      response: { 204: { type: 'null', description: 'Revoked.' }, ...problems(401, 403, 404, 409, 422, 503) }
    },
    config: { scope: 'users:write' }
  }, async (request, reply) => {
    await revokeInvitation(deps, request.principal!, requestContext(request), request.params.user_id)
    return await reply.code(204).send(null)
  })

  for (const family of FAMILIES) {
    const base = `${family.prefix}/users`
    const common = { tags: [family.tag], deprecated: family.legacy || undefined, security: SECURITY }

    app.post(base, {
      schema: {
        ...common,
        operationId: family.operationId('create_user_users_post'),
        summary: 'Create User',
        description: 'Creates a user of the web UI. Takes JSON, form-urlencoded or multipart fields (all strings, as 3.6.1 clients send them). ' +
          'With `invite: true` and no password the user is invited: mailed a one-time link to set their password, or, without SMTP, the answer\'s `invitation` ' +
          'carries the link to hand over (docs/email.md#invitations). ' +
          'This does not create a database user; see the README for that optional step.',
        consumes: CREATE_TYPES,
        body: ref(UserCreate),
        response: {
          201: withHeaders({ ...ref(UserCreated), description: 'The created user (and, invited, the invitation); `Location` names it and `ETag` versions it.' }, 'Location', 'ETag'),
          ...problems(401, 403, 409, 413, 415, 422, 503)
        }
      },
      config: { scope: 'users:write', legacy: family.legacy, accepts: CREATE_TYPES, bodyRules: (body) => passwordRuleErrors(body, deps.passwordPolicy), idempotent: true },
      preValidation: coerceForm
    }, async (request, reply) => {
      const { user, version, invitation } = await createUser(deps, request.principal!, requestContext(request), request.body)
      // A retry is answered without the link and code: they are never stored (resend for a new one).
      if (invitation?.url !== undefined) replayWith(request, { ...user, invitation: { delivery: invitation.delivery, mailed: invitation.mailed, expires_at: invitation.expires_at } })
      return await reply.code(201)
        .header('Location', `${app.config.basePath}${base}/${user.id}`)
        .header('ETag', etagOf(version))
        .send(invitation !== undefined ? { ...user, invitation } : user)
    })

    app.get(base, {
      schema: {
        ...common,
        operationId: family.operationId('list_users_users_get'),
        summary: 'List Users',
        description: 'Without `limit`: every user matching the filters, as one JSON array streamed from the database (memory stays flat however many users exist). ' +
          'With `limit`: one page; the next page is in the `Link: rel="next"` header.',
        querystring: ListUsersQuery,
        // Unbounded without `limit`: every matching user (see docs/openapi-lint.md).
        response: { 200: withHeaders({ ...Type.Array(UserRef), description: 'Users, in the requested order.' }, 'Link'), ...problems(401, 403, 422, 503) }
      },
      config: { scope: 'users:read', legacy: family.legacy }
    }, async (request, reply) => {
      const { limit, cursor, sort = 'created_at', ...filter } = request.query
      if (limit === undefined && cursor === undefined) {
        // Each batch through the route's own serializer (the 200 schema, an array of User), its brackets left to the whole.
        const serialize = reply.getSerializationFunction('200') as unknown as (users: unknown[]) => string
        const batches = await streamUsers(deps, filter, sort)
        reply.type('application/json; charset=utf-8')
        return await reply.send(Readable.from(joinedArray(batches, serialize)) as never)
      }
      const page = await listUsersPage(deps, filter, sort, limit ?? 100, cursor)
      if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
      return page.users
    })

    app.get(`${base}/:user_id`, {
      schema: {
        ...common,
        operationId: family.operationId('get_user_users__user_id__get'),
        description: 'Admins and `users:read` credentials read anyone; a signed-in user may read their own record.',
        summary: 'Get User',
        params: UserIdParams,
        response: { 200: withHeaders({ ...UserRef, description: 'The user; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 404, 422, 503) }
      },
      config: { scope: 'users:read', self: true, legacy: family.legacy }
    }, async (request, reply) => {
      const { user, version } = await getUser(deps, request.params.user_id)
      return await reply.header('ETag', etagOf(version)).send(user)
    })

    app.patch(`${base}/:user_id`, {
      schema: {
        ...common,
        operationId: family.operationId('update_user_users__user_id__patch'),
        summary: 'Update User',
        description: 'A JSON merge patch (RFC 7396). Send `If-Match` with the ETag you read to refuse lost updates (412). ' +
          'A signed-in user may change their own email, first_name and last_name; everything else is for admins. ' +
          'Disabling a user, or setting their password, ends their sessions and revokes their API keys. The last enabled admin cannot be disabled or demoted (409 `last_admin`).',
        consumes: PATCH_TYPES,
        params: UserIdParams,
        headers: IfMatchHeaders,
        body: ref(UserPatch),
        response: { 200: withHeaders({ ...UserRef, description: 'The updated user; `ETag` versions it.' }, 'ETag'), ...problems(401, 403, 404, 409, 412, 413, 415, 422, 503) }
      },
      config: { scope: 'users:write', self: true, legacy: family.legacy, accepts: PATCH_TYPES, bodyRules: (body) => passwordRuleErrors(body, deps.passwordPolicy) }
    }, async (request, reply) => {
      const { user, version } = await updateUserById(deps, request.principal!, requestContext(request), request.params.user_id, request.body, request.headers['if-match'])
      return await reply.header('ETag', etagOf(version)).send(user)
    })

    app.delete(`${base}/:user_id`, {
      schema: {
        ...common,
        operationId: family.operationId('delete_user_users__user_id__delete'),
        summary: 'Delete User',
        description: 'Deletes the user whose `id` (from the list) is `user_id`, and their API keys. This does not remove a database user; see the README. ' +
          'The last enabled admin cannot be deleted (409 `last_admin`).',
        params: UserIdParams,
        headers: IfMatchHeaders,
        response: { 204: { type: 'null', description: 'Deleted.' }, ...problems(401, 403, 404, 409, 412, 422, 503) }
      },
      config: { scope: 'users:write', legacy: family.legacy }
    }, async (request, reply) => {
      await deleteUserById(deps, request.principal!, requestContext(request), request.params.user_id, request.headers['if-match'])
      return await reply.code(204).send(null)
    })
  }
}

/** One JSON array of every batch's elements, each batch serialized as an array of its own. */
async function * joinedArray (batches: AsyncIterable<unknown[]>, serialize: (items: unknown[]) => string): AsyncGenerator<string> {
  let separator = ''
  yield '['
  for await (const batch of batches) {
    yield separator + serialize(batch).slice(1, -1)
    separator = ','
  }
  yield ']'
}
