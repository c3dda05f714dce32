import { readFileSync } from 'node:fs'
import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext, sessionCookieOf } from '../auth/auth.plugin.ts'
import type { Principal } from '../auth/principal.ts'
import { AppError, logFailure, toAppError } from '../errors.ts'
import { createApiKey, listApiKeysOf, revokeApiKeyById, rotateApiKey } from '../api-keys/api-keys.service.ts'
import { ApiKeyIdParams } from '../api-keys/api-keys.schemas.ts'
import { listEventsPage, partyNamesOf, userIdOfUsername } from '../events/events.service.ts'
import { mfaStatus, resetFactors } from '../mfa/mfa.service.ts'
import { queryOf, sendHtmlPage, type SafeHtml } from '../lib/html.ts'
import { userCsvHeader, userCsvLine } from '../lib/users-csv.ts'
import { issuePasswordReset } from '../password-resets/password-resets.service.ts'
import { passwordPolicyOf } from '../lib/password-policy.ts'
import { sameOriginRedirect } from '../lib/redirect.ts'
import { type SessionsDeps } from '../sessions/sessions.types.ts'
import { UserSessionParams } from '../sessions/sessions.schemas.ts'
import { authenticateSession, endUserSession, listUserSessions } from '../sessions/sessions.service.ts'
import { UserIdParams, type User } from '../users/users.schemas.ts'
import { GroupIdParams, GroupMemberParams } from '../groups/groups.schemas.ts'
import { addMembers, createGroup, deleteGroupById, getGroup, listGroupsPage, listMembersPage, removeMember, updateGroupById } from '../groups/groups.service.ts'
import { findUserById } from '../users/users.repository.ts'
import { findProvisionerName, findProvisioningOf } from '../scim/scim.repository.ts'
import { mailAlert, mailPages, mailStateOf } from './mail-status.ts'
import { findInvitationMail } from '../mail/mail.repository.ts'
import { WebhookDeliveryParams, WebhookIdParams, type WebhookTestResult } from '../webhooks/webhooks.schemas.ts'
import {
  createWebhook,
  deleteWebhook,
  getWebhook,
  listWebhookAttempts,
  listWebhookDeliveries,
  listWebhooks,
  pingWebhook,
  retryWebhookDelivery,
  rotateWebhookSecret,
  updateWebhook
} from '../webhooks/webhooks.service.ts'
import {
  createUser,
  deleteUserById,
  endUserSessions,
  etagOf,
  getSignInState,
  getUser,
  inviteUser,
  listUsersPage,
  revokeInvitation,
  unlockUser,
  updateUserById,
  type IssuedInvitation,
  type UsersDeps
} from '../users/users.service.ts'
import {
  fieldOfError,
  formValuesFrom,
  formValuesOf,
  originalValuesFrom,
  parseCreate,
  parseEventsFilter,
  parseKey,
  parsePatch,
  SCIM_OWNED_FIELDS,
  FIELD_NAMES,
  parseUsersQuery,
  parseWebhook,
  parseWebhookQuery,
  text,
  webhookValuesFrom,
  type FieldErrors,
  type Fields,
  type WebhookFormValues
} from './console.forms.ts'
import {
  apiKeysPage,
  conflictPage,
  deletedNotice,
  deletePage,
  deleteWebhookPage,
  errorPage,
  eventsPage,
  groupPage,
  groupsPage,
  mfaResetPage,
  newUserPage,
  notAdminPage,
  secretPage,
  userPage,
  usersPage,
  webhookPage,
  webhookSecretPage,
  webhooksPage,
  type UserView,
  type ViewContext
} from './console.views.ts'

const asset = (name: string): string => readFileSync(new URL(`./assets/${name}`, import.meta.url), 'utf8')
const CSS = asset('console.css')
const JS = asset('console.js')

/**
 * Only this console's own files: no inline script or style anywhere, no other
 * origin, forms that post back here only.
 */
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

const FORM = ['application/x-www-form-urlencoded']
const PAGE_SIZE = 50
/** Users read per query by Export CSV: the list operation's largest page. */
const EXPORT_PAGE_SIZE = 1000
const USER_EVENTS = 20
/** Rows of each list on an endpoint's page. */
const WEBHOOK_ROWS = 20

/** The message that explains the last-admin rule where it stops an action. */
function lastAdminText (username: string): string {
  return `${username} is the last enabled admin. gatehouse always keeps at least one enabled admin, so that someone can still manage users and keys. ` +
    'Make another user an admin first (open them and set Role to admin), then try again.'
}

const NOTICES: Record<string, string> = {
  created: 'User created.',
  saved: 'Changes saved.',
  unchanged: 'Nothing to save: the form matched the stored user.',
  disabled: 'User disabled: their sessions ended and their API keys were revoked.',
  enabled: 'User enabled.',
  unlocked: 'Sign-in lock reset: the failure count is 0 and the account is not locked.',
  'not-locked': 'There was nothing to reset: the account had no lock and no failed sign-ins counted.',
  'sessions-ended': 'Every session of this user has ended.',
  'session-ended': 'The session has ended: its token and cookie stopped working.',
  revoked: 'Key revoked.',
  'webhook-enabled': 'Endpoint enabled: its queued deliveries are sent again.',
  'webhook-disabled': 'Endpoint disabled: nothing is sent to it; new events still queue for it.',
  retried: 'Delivery queued: it is sent again shortly.',
  'mfa-reset': 'Second factor reset: the authenticator app, passkeys and recovery codes are removed.',
  invited: 'User created and invited: the invitation is queued for mailing to them; its delivery shows below.',
  'invitation-sent': 'A new invitation is queued for mailing: the earlier link and code stopped working.',
  'invitation-revoked': 'Invitation revoked: its link and code stopped working. Resend it, or delete the user.',
  'reset-sent': 'A password-reset link is queued for mailing to the user; the earlier one stopped working.',
  'group-created': 'Group created.',
  'group-renamed': 'Group renamed: every member\'s groups hold the new name.',
  'member-added': 'Member added.',
  'member-removed': 'Member removed.'
}

/** An event filter's value that is an id rather than a username: a UUID, or `cli` (the command line's actor). */
const EVENT_PARTY_ID = /^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|cli)$/i

declare module 'fastify' {
  interface FastifyRequest {
    consoleUser?: string
    /** The mail banner's state for this page (mail-status.ts); undefined without SMTP. */
    consoleMail?: { alert: SafeHtml | undefined }
  }
}

/** `sessions` is what the second-factor service needs, as the MFA routes get it. */
export default async function consoleRoutes (app: FastifyTypeBox, sessions: SessionsDeps): Promise<void> {
  const base = app.config.basePath
  const admin = `${base}/admin`
  const deps: UsersDeps = { db: app.db, passwords: app.passwords, passwordPolicy: passwordPolicyOf(app.config), invitations: app.config, pages: app.usersPages }
  app.decorateRequest('consoleUser', undefined)
  app.decorateRequest('consoleMail', undefined)

  const viewOf = (request: FastifyRequest, notice?: SafeHtml | string): ViewContext =>
    ({ base, username: request.consoleUser, notice, mail: request.consoleMail })

  const sendPage = (reply: FastifyReply, status: number, page: string): FastifyReply => sendHtmlPage(reply, status, page, CSP)

  const seeOther = (reply: FastifyReply, location: string): FastifyReply => reply.code(303).header('Location', location).send()

  app.setErrorHandler(async (error, request, reply) => {
    // Fastify's own refusals (a body over the limit, one without a content type) keep their 4xx, as in the API.
    const appError = !(error instanceof AppError) && (error as { validation?: unknown }).validation !== undefined
      ? new AppError('validation_failed', 422, 'This address is not one the console knows (an id or parameter is not valid).')
      : toAppError(error)
    logFailure(request.log, appError, error)
    const status = appError.status
    const message = appError.code === 'internal_error' ? `Something went wrong on our side. Quote request id ${request.id} when reporting it.` : appError.detail
    for (const [name, value] of Object.entries(appError.headers)) reply.header(name, value)
    const title = status === 404 ? 'Not found' : status === 403 ? 'Refused' : status >= 500 ? 'Something went wrong' : 'Not done'
    return sendPage(reply, status, errorPage(viewOf(request), title, message))
  })

  // Who may use the console: a signed-in admin, through the browser's session cookie.
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.url?.startsWith(`${admin}/assets/`) === true) return
    const token = sessionCookieOf(request)
    const principal: Principal | undefined = token !== undefined && token !== '' ? await authenticateSession({ db: app.db, config: app.config }, token) : undefined
    if (principal === undefined) {
      // Only an address sign-in will follow back (lib/redirect.ts: a path of at most 2,048 characters), so the
      // Location stays far from the 16 KiB of headers clients accept; anything else returns to the console's start.
      const next = request.method === 'GET' && sameOriginRedirect(request.url) !== undefined ? request.url : admin
      return await seeOther(reply, `${base}/login?next=${encodeURIComponent(next)}`)
    }
    request.principal = principal
    await app.spendCredentialBudget?.(request, reply)
    // Every change rides on the cookie, so it must come from our own pages.
    if (request.method !== 'GET' && request.method !== 'HEAD') assertSameOrigin(request, app.config.trustedOrigins)
    if (principal.user?.role !== 'admin') {
      // An admin whose session had no second factor acts as a user where MFA_REQUIRED applies: say how to get in.
      const storedRole = principal.userId !== null && principal.mfa !== true && app.config.mfaRequired !== 'off' ? (await findUserById(app.db, principal.userId))?.role : undefined
      return await sendPage(reply, 403, notAdminPage(viewOf(request), principal.user?.username ?? '', storedRole === 'admin'))
    }
    request.consoleUser = principal.user.username
    if (app.mail !== undefined) request.consoleMail = { alert: mailAlert(base, await mailStateOf(app.db, app.mail)) }
  })

  const hidden = { hide: true }
  const formPost = { config: { accepts: FORM } }

  if (app.mail !== undefined) {
    await app.register(mailPages, {
      worker: app.mail,
      viewOf,
      sendPage,
      ownAddress: async (request) => (await findUserById(app.db, request.principal!.userId!))?.email ?? ''
    })
  }
  app.get('/admin/assets/console.css', { schema: hidden }, async (_request, reply) => await reply.type('text/css; charset=utf-8').send(CSS))
  app.get('/admin/assets/console.js', { schema: hidden }, async (_request, reply) => await reply.type('text/javascript; charset=utf-8').send(JS))
  app.get('/admin', { schema: hidden }, async (_request, reply) => await seeOther(reply, `${admin}/users`))
  // Any other address under the console is a console page that does not exist, answered as a page.
  app.get('/admin/*', { schema: hidden }, async () => { throw new AppError('route_not_found', 404, 'There is no console page at this address.') })

  // -------------------------------------------------------------------------
  // Users

  const isLastAdmin = async (user: User): Promise<boolean> => {
    if (user.role !== 'admin' || user.disabled) return false
    const admins = await listUsersPage(deps, { role: 'admin', disabled: false }, 'created_at', 2, undefined)
    return admins.users.length < 2
  }

  /**
   * The identity provider that keeps the user's SCIM-owned fields (the name
   * of its SCIM key), when one provisions them; undefined otherwise.
   */
  const scimOwnerOf = async (id: string, provisioning?: { externalId: string | null, provisionedAt: string | null }): Promise<string | undefined> => {
    const facts = provisioning ?? await findProvisioningOf(app.db, id)
    if (facts === undefined || (facts.externalId === null && facts.provisionedAt === null)) return undefined
    return await findProvisionerName(app.db, id) ?? 'the identity provider'
  }
  const keptByIdp = (owner: string, what: string): string => `${what.charAt(0).toUpperCase()}${what.slice(1)} kept by ${owner}, which provisions this user through SCIM: change it there; its next sync would overwrite a change made here.`

  const renderUser = async (request: FastifyRequest, reply: FastifyReply, status: number, id: string, extra: Partial<UserView> = {}, notice?: SafeHtml | string): Promise<FastifyReply> => {
    const { user, version } = await getUser(deps, id)
    const [signIn, events, lastAdmin, mfa, liveSessions, provisioning] = await Promise.all([
      getSignInState(deps, id),
      listEventsPage(app.db, { target_id: id, limit: USER_EVENTS }),
      isLastAdmin(user),
      mfaStatus(sessions, id),
      listUserSessions(app, request.principal!, id),
      findProvisioningOf(app.db, id)
    ])
    const eventNames = await partyNamesOf(app.db, events.events)
    const provisioner = await scimOwnerOf(id, provisioning)
    const invitationMail = user.invitation_pending && app.mail !== undefined ? await findInvitationMail(app.db, id) ?? null : undefined
    return sendPage(reply, status, userPage(viewOf(request, notice), {
      user, version, signIn, events: events.events, eventNames, moreEvents: events.nextCursor !== undefined, lastAdmin, mfa, sessions: liveSessions, provisioning: provisioning === undefined ? undefined : { ...provisioning, provisioner }, invitationMail, ...extra
    }))
  }

  app.get('/admin/users', { schema: hidden }, async (request, reply) => {
    const query = parseUsersQuery(request.query)
    const page = await listUsersPage(deps, { q: query.q, role: query.role, group: query.group, disabled: query.disabled }, query.sort ?? 'created_at', PAGE_SIZE, query.cursor)
    const q = request.query as Record<string, unknown>
    const notice = q.done === 'deleted' && typeof q.username === 'string' ? deletedNotice(viewOf(request), q.username) : undefined
    return sendPage(reply, 200, usersPage(viewOf(request, notice), { users: page.users, query, nextCursor: page.nextCursor }))
  })

  /**
   * The users the list shows, with its filters and order, every page of them,
   * as the CSV that `gatehouse users import` reads (lib/users-csv.ts). The
   * first page is read before the answer starts, so a database that is down
   * gets the error page rather than a cut-off file; a BOM leads, so that a
   * spreadsheet opened on it reads UTF-8.
   */
  app.get('/admin/users/export', { schema: hidden }, async (request, reply) => {
    const query = parseUsersQuery(request.query)
    const filter = { q: query.q, role: query.role, group: query.group, disabled: query.disabled }
    const sort = query.sort ?? 'created_at'
    const first = await listUsersPage(deps, filter, sort, EXPORT_PAGE_SIZE, undefined)
    async function * csv (): AsyncGenerator<string> {
      yield '\uFEFF' + userCsvHeader()
      for (let page = first; ; page = await listUsersPage(deps, filter, sort, EXPORT_PAGE_SIZE, page.nextCursor)) {
        yield page.users.map(userCsvLine).join('')
        if (page.nextCursor === undefined) break
      }
    }
    const day = new Date().toISOString().slice(0, 10)
    return await reply.type('text/csv; charset=utf-8')
      .header('Content-Disposition', `attachment; filename="gatehouse-users-${day}.csv"`)
      .header('Cache-Control', 'no-store')
      .send(Readable.from(csv()))
  })

  app.get('/admin/users/new', { schema: hidden }, async (request, reply) => {
    return sendPage(reply, 200, newUserPage(viewOf(request), formValuesFrom({}), {}))
  })

  app.post('/admin/users', { schema: hidden, ...formPost }, async (request, reply) => {
    const fields = (request.body ?? {}) as Fields
    const parsed = parseCreate(fields, deps.passwordPolicy)
    const invite = text(fields, 'invite') === 'true'
    if (!parsed.ok) return sendPage(reply, 422, newUserPage(viewOf(request), formValuesFrom(fields), parsed.errors, undefined, invite))
    try {
      const { user, invitation } = await createUser(deps, request.principal!, requestContext(request), parsed.value)
      // An unmailed invitation's link is shown on this answer only: a redirect would put it in the address bar and history.
      if (invitation !== undefined && !invitation.mailed) return await renderUser(request, reply, 201, user.id, { created: true, invitation: shownInvitation(invitation) }, 'User created and invited.')
      return await seeOther(reply, `${admin}/users/${user.id}?done=${invitation !== undefined ? 'invited' : 'created'}`)
    } catch (error) {
      const field = error instanceof AppError ? fieldOfError(error) : undefined
      if (field === undefined) throw error
      return sendPage(reply, (error as AppError).status, newUserPage(viewOf(request), formValuesFrom(fields), { [field]: (error as AppError).detail.replace(/\.$/, '') }, undefined, invite))
    }
  })

  const userRoute = { schema: { ...hidden, params: UserIdParams } }
  type UserRequest = FastifyRequest<{ Params: { user_id: string } }>

  app.get('/admin/users/:user_id', userRoute, async (request: UserRequest, reply) => {
    const done = (request.query as Record<string, unknown>).done
    const notice = typeof done === 'string' ? NOTICES[done] : undefined
    return await renderUser(request, reply, 200, request.params.user_id, { created: done === 'created' }, notice)
  })

  /** The version the form was read at; required, since without it the edit could overwrite a change unseen. */
  const versionOf = (fields: Fields): string => {
    const version = text(fields, 'version')
    if (!/^\d{1,12}$/.test(version)) throw new AppError('validation_failed', 422, 'The form is missing the version it was read at; reload the page and try again.')
    return etagOf(Number(version))
  }

  app.post('/admin/users/:user_id', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    const fields = (request.body ?? {}) as Fields
    const ifMatch = versionOf(fields)
    const values = formValuesFrom(fields)
    const original = originalValuesFrom(fields)
    // Shown again, the form keeps the version and values it was read at, so a concurrent change is still caught.
    const again = { values, original, formVersion: Number(ifMatch.slice(1, -1)) }
    const parsed = parsePatch(fields, deps.passwordPolicy)
    if (!parsed.ok) return await renderUser(request, reply, 422, id, { ...again, errors: parsed.errors })
    const owner = await scimOwnerOf(id)
    // Without the form's original values every field is in the patch: only a value that differs from the stored one is a change.
    const current = owner === undefined ? undefined : (await getUser(deps, id)).user as unknown as Record<string, unknown>
    const patch = parsed.value as Record<string, unknown>
    const ownedChanges = current === undefined ? [] : SCIM_OWNED_FIELDS.filter(field => field in patch && patch[field] !== current[field])
    if (owner !== undefined && ownedChanges.length > 0) {
      return await renderUser(request, reply, 409, id, { ...again, blocked: keptByIdp(owner, `${ownedChanges.map(field => FIELD_NAMES[field]).join(', ')} ${ownedChanges.length === 1 ? 'is' : 'are'}`) })
    }
    if (Object.keys(parsed.value).length === 0) return await seeOther(reply, `${admin}/users/${id}?done=unchanged`)
    try {
      await updateUserById(deps, request.principal!, requestContext(request), id, parsed.value, ifMatch)
      return await seeOther(reply, `${admin}/users/${id}?done=saved`)
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      if (error.code === 'precondition_failed') {
        const current = await getUser(deps, id)
        return sendPage(reply, 409, conflictPage(viewOf(request), current.user, current.version, values, original ?? formValuesOf(current.user), text(fields, 'password') !== ''))
      }
      if (error.code === 'last_admin') return await renderUser(request, reply, 409, id, { ...again, blocked: lastAdminText(values.username) })
      const field = fieldOfError(error)
      if (field !== undefined) return await renderUser(request, reply, error.status, id, { ...again, errors: { [field]: error.detail.replace(/\.$/, '') } })
      throw error
    }
  })

  for (const [action, disabled] of [['disable', true], ['enable', false]] as const) {
    app.post(`/admin/users/:user_id/${action}`, { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
      const id = request.params.user_id
      const owner = await scimOwnerOf(id)
      if (owner !== undefined) return await renderUser(request, reply, 409, id, { blocked: keptByIdp(owner, 'Whether the account is disabled is') })
      try {
        await updateUserById(deps, request.principal!, requestContext(request), id, { disabled }, undefined)
      } catch (error) {
        if (!(error instanceof AppError) || error.code !== 'last_admin') throw error
        const { user } = await getUser(deps, id)
        return await renderUser(request, reply, 409, id, { blocked: lastAdminText(user.username) })
      }
      if (disabled && id === request.principal!.userId) return await seeOther(reply, `${base}/login`)
      return await seeOther(reply, `${admin}/users/${id}?done=${action}d`)
    })
  }

  const shownInvitation = (invitation: IssuedInvitation): UserView['invitation'] =>
    invitation.url !== undefined && invitation.code !== undefined ? { url: invitation.url, code: invitation.code, expires_at: invitation.expires_at } : undefined

  app.post('/admin/users/:user_id/invitation', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    const invitation = await inviteUser(deps, request.principal!, requestContext(request), id)
    if (!invitation.mailed) return await renderUser(request, reply, 200, id, { invitation: shownInvitation(invitation) }, 'A new invitation link: the earlier one stopped working.')
    return await seeOther(reply, `${admin}/users/${id}?done=invitation-sent`)
  })

  app.post('/admin/users/:user_id/password-reset', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    try {
      const link = await issuePasswordReset({ db: app.db, passwords: app.passwords, config: app.config }, requestContext(request), id)
      if (link.mailed) return await seeOther(reply, `${admin}/users/${id}?done=reset-sent`)
      return await renderUser(request, reply, 200, id, { resetLink: { url: link.url!, code: link.code!, expires_at: link.expires_at } }, 'A password-reset link: the earlier one stopped working.')
    } catch (error) {
      if (!(error instanceof AppError) || error.status !== 409) throw error
      return await renderUser(request, reply, 409, id, { blocked: error.detail })
    }
  })

  app.post('/admin/users/:user_id/invitation/revoke', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    await revokeInvitation(deps, request.principal!, requestContext(request), request.params.user_id)
    return await seeOther(reply, `${admin}/users/${request.params.user_id}?done=invitation-revoked`)
  })

  app.post('/admin/users/:user_id/unlock', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const cleared = await unlockUser(deps, request.principal!, requestContext(request), request.params.user_id)
    return await seeOther(reply, `${admin}/users/${request.params.user_id}?done=${cleared !== undefined ? 'unlocked' : 'not-locked'}`)
  })

  app.post('/admin/users/:user_id/end-sessions', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    await endUserSessions(deps, request.principal!, requestContext(request), id)
    // Ending one's own sessions ends this one too.
    if (id === request.principal!.userId) return await seeOther(reply, `${base}/login?next=${encodeURIComponent(admin)}`)
    return await seeOther(reply, `${admin}/users/${id}?done=sessions-ended`)
  })

  // The same as DELETE /api/users/{user_id}/sessions/{session_id}.
  app.post('/admin/users/:user_id/sessions/:session_id/end', { schema: { ...hidden, params: UserSessionParams }, ...formPost }, async (request, reply) => {
    const { user_id: id, session_id: sessionId } = request.params as { user_id: string, session_id: string }
    const { current } = await endUserSession(app.db, requestContext(request), request.principal!, id, sessionId)
    // The admin's own session, ended from their own page: they are signed out.
    if (current) return await seeOther(reply, `${base}/login?next=${encodeURIComponent(admin)}`)
    return await seeOther(reply, `${admin}/users/${id}?done=session-ended`)
  })

  // The same reset as DELETE /api/users/{user_id}/mfa, after a page that says what goes.
  app.get('/admin/users/:user_id/mfa-reset', userRoute, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    const [{ user }, mfa] = await Promise.all([getUser(deps, id), mfaStatus(sessions, id)])
    return sendPage(reply, 200, mfaResetPage(viewOf(request), user, mfa))
  })

  app.post('/admin/users/:user_id/mfa-reset', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    await resetFactors(sessions, requestContext(request), request.params.user_id)
    return await seeOther(reply, `${admin}/users/${request.params.user_id}?done=mfa-reset`)
  })

  app.get('/admin/users/:user_id/delete', userRoute, async (request: UserRequest, reply) => {
    const { user, version } = await getUser(deps, request.params.user_id)
    return sendPage(reply, 200, deletePage(viewOf(request), user, version, await isLastAdmin(user) ? lastAdminText(user.username) : undefined))
  })

  app.post('/admin/users/:user_id/delete', { ...userRoute, ...formPost }, async (request: UserRequest, reply) => {
    const id = request.params.user_id
    const ifMatch = versionOf((request.body ?? {}) as Fields)
    const { user } = await getUser(deps, id)
    try {
      await deleteUserById(deps, request.principal!, requestContext(request), id, ifMatch)
    } catch (error) {
      if (!(error instanceof AppError) || (error.code !== 'precondition_failed' && error.code !== 'last_admin')) throw error
      const current = await getUser(deps, id)
      const why = error.code === 'last_admin'
        ? lastAdminText(current.user.username)
        : 'The user was changed after this page was opened. Check the details below and confirm again.'
      return sendPage(reply, 409, deletePage(viewOf(request), current.user, current.version, why))
    }
    if (id === request.principal!.userId) return await seeOther(reply, `${base}/login`)
    return await seeOther(reply, `${admin}/users?done=deleted&username=${encodeURIComponent(user.username)}`)
  })

  // -------------------------------------------------------------------------
  // API keys

  const keysPage = async (request: FastifyRequest, reply: FastifyReply, status: number, form = { name: '', scopes: [] as string[], expires: '' }, errors: FieldErrors = {}, general?: string, notice?: string): Promise<FastifyReply> => {
    const includeRevoked = (request.query as Record<string, unknown>).include_revoked === 'true'
    const keys = await listApiKeysOf(app.db, includeRevoked)
    return sendPage(reply, status, apiKeysPage(viewOf(request, notice), keys, includeRevoked, form, errors, general))
  }

  app.get('/admin/api-keys', { schema: hidden }, async (request, reply) => {
    const done = (request.query as Record<string, unknown>).done
    return await keysPage(request, reply, 200, undefined, {}, undefined, typeof done === 'string' ? NOTICES[done] : undefined)
  })

  app.post('/admin/api-keys', { schema: hidden, ...formPost }, async (request, reply) => {
    const fields = (request.body ?? {}) as Fields
    const parsed = parseKey(fields)
    const form = { name: text(fields, 'name'), scopes: ([] as unknown[]).concat(fields.scopes ?? []).filter((s): s is string => typeof s === 'string'), expires: parsed.expires }
    if (!parsed.ok) return await keysPage(request, reply, 422, form, parsed.errors)
    try {
      const key = await createApiKey(app.db, request.principal!, requestContext(request), parsed.value, app.config.apiKeysPerOwner)
      return sendPage(reply, 201, secretPage(viewOf(request), key, false))
    } catch (error) {
      const pointer = error instanceof AppError ? error.errors?.[0]?.pointer : undefined
      if (pointer === undefined) throw error
      return await keysPage(request, reply, (error as AppError).status, form, { [pointer.slice(1)]: (error as AppError).errors![0]!.detail })
    }
  })

  const keyRoute = { schema: { ...hidden, params: ApiKeyIdParams }, ...formPost }
  type KeyRequest = FastifyRequest<{ Params: { key_id: string } }>

  app.post('/admin/api-keys/:key_id/revoke', keyRoute, async (request: KeyRequest, reply) => {
    await revokeApiKeyById(app.db, requestContext(request), request.params.key_id)
    return await seeOther(reply, `${admin}/api-keys?done=revoked`)
  })

  app.post('/admin/api-keys/:key_id/rotate', keyRoute, async (request: KeyRequest, reply) => {
    const key = await rotateApiKey(app.db, requestContext(request), request.params.key_id)
    return sendPage(reply, 200, secretPage(viewOf(request), key, true))
  })

  // -------------------------------------------------------------------------
  // Groups

  const groupsDeps = { db: app.db }
  const GROUP_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
  const queryText = (request: FastifyRequest, name: string): string | undefined => {
    const value = (request.query as Record<string, unknown>)[name]
    return typeof value === 'string' && value !== '' ? value : undefined
  }
  /** A group name as the form sent it: the API's bounds, said as a field error. */
  const groupNameError = (name: string): string | undefined =>
    name === '' ? 'is required' : [...name].length > 64 ? 'must be at most 64 characters' : undefined

  const renderGroups = async (request: FastifyRequest, reply: FastifyReply, status: number, form = { display_name: '' }, errors: FieldErrors = {}): Promise<FastifyReply> => {
    const q = queryText(request, 'q')?.slice(0, 64)
    const cursor = queryText(request, 'cursor')
    const page = await listGroupsPage(groupsDeps, { q }, PAGE_SIZE, cursor)
    const done = queryText(request, 'done')
    const name = queryText(request, 'name')
    const notice = done === 'group-deleted' && name !== undefined ? `Deleted the group ${name}; its members' groups no longer hold it.` : undefined
    return sendPage(reply, status, groupsPage(viewOf(request, notice), { groups: page.groups, q, cursor, nextCursor: page.nextCursor, form, errors }))
  }

  app.get('/admin/groups', { schema: hidden }, async (request, reply) => await renderGroups(request, reply, 200))

  app.post('/admin/groups', { schema: hidden, ...formPost }, async (request, reply) => {
    const name = text((request.body ?? {}) as Fields, 'display_name').trim()
    const invalid = groupNameError(name)
    if (invalid !== undefined) return await renderGroups(request, reply, 422, { display_name: name }, { display_name: invalid })
    try {
      const { group } = await createGroup(groupsDeps, requestContext(request), { display_name: name })
      return await seeOther(reply, `${admin}/groups/${group.id}?done=group-created`)
    } catch (error) {
      if (!(error instanceof AppError) || error.code !== 'group_exists') throw error
      return await renderGroups(request, reply, 409, { display_name: name }, { display_name: 'is the name of another group' })
    }
  })

  const groupRoute = { schema: { ...hidden, params: GroupIdParams } }
  type GroupRequest = FastifyRequest<{ Params: { group_id: string } }>

  const renderGroup = async (request: GroupRequest, reply: FastifyReply, status: number, form?: { display_name?: string, username?: string }, errors: FieldErrors = {}): Promise<FastifyReply> => {
    const { group, version } = await getGroup(groupsDeps, request.params.group_id)
    const cursor = queryText(request, 'cursor')
    const members = await listMembersPage(groupsDeps, group.id, PAGE_SIZE, cursor)
    const done = queryText(request, 'done')
    return sendPage(reply, status, groupPage(viewOf(request, done !== undefined ? NOTICES[done] : undefined), {
      group, version, members: members.users, cursor, nextCursor: members.nextCursor, form: { display_name: form?.display_name ?? group.display_name, username: form?.username ?? '' }, errors
    }))
  }

  app.get('/admin/groups/:group_id', groupRoute, async (request: GroupRequest, reply) => await renderGroup(request, reply, 200))

  app.post('/admin/groups/:group_id', { ...groupRoute, ...formPost }, async (request: GroupRequest, reply) => {
    const fields = (request.body ?? {}) as Fields
    const name = text(fields, 'display_name').trim()
    const invalid = groupNameError(name)
    if (invalid !== undefined) return await renderGroup(request, reply, 422, { display_name: name }, { display_name: invalid })
    try {
      await updateGroupById(groupsDeps, requestContext(request), request.params.group_id, { display_name: name }, versionOf(fields) /* a user's ETag and a group's are the same strong tag */)
      return await seeOther(reply, `${admin}/groups/${request.params.group_id}?done=group-renamed`)
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      if (error.code === 'group_exists') return await renderGroup(request, reply, 409, { display_name: name }, { display_name: 'is the name of another group' })
      if (error.code === 'precondition_failed') return await renderGroup(request, reply, 409, undefined, { display_name: 'was changed by someone else meanwhile; this page now shows the group as it is' })
      throw error
    }
  })

  app.post('/admin/groups/:group_id/members', { ...groupRoute, ...formPost }, async (request: GroupRequest, reply) => {
    const who = text((request.body ?? {}) as Fields, 'username').trim()
    if (who === '') return await renderGroup(request, reply, 422, { username: who }, { username: 'is required' })
    const userId = await userIdOfUsername(app.db, who) ?? (GROUP_ID.test(who) && await findUserById(app.db, who.toLowerCase()) !== undefined ? who.toLowerCase() : undefined)
    if (userId === undefined) return await renderGroup(request, reply, 422, { username: who }, { username: 'is not the username or id of a user' })
    try {
      await addMembers(groupsDeps, requestContext(request), request.params.group_id, [userId], undefined)
      return await seeOther(reply, `${admin}/groups/${request.params.group_id}?done=member-added`)
    } catch (error) {
      if (!(error instanceof AppError) || error.code !== 'too_many_groups') throw error
      return await renderGroup(request, reply, 409, { username: who }, { username: 'is in 100 groups already, the most a user can be in' })
    }
  })

  app.post('/admin/groups/:group_id/members/:user_id/remove', { schema: { ...hidden, params: GroupMemberParams }, ...formPost }, async (request: FastifyRequest<{ Params: { group_id: string, user_id: string } }>, reply) => {
    await removeMember(groupsDeps, requestContext(request), request.params.group_id, request.params.user_id, undefined)
    return await seeOther(reply, `${admin}/groups/${request.params.group_id}?done=member-removed`)
  })

  app.post('/admin/groups/:group_id/delete', { ...groupRoute, ...formPost }, async (request: GroupRequest, reply) => {
    const { group } = await getGroup(groupsDeps, request.params.group_id)
    await deleteGroupById(groupsDeps, requestContext(request), group.id, undefined)
    return await seeOther(reply, `${admin}/groups${queryOf({ done: 'group-deleted', name: group.display_name })}`)
  })

  // -------------------------------------------------------------------------
  // Events

  app.get('/admin/events', { schema: hidden }, async (request, reply) => {
    const filter = parseEventsFilter(request.query)
    const view = { filter: filter.values, errors: filter.errors, cursor: filter.query.cursor, unmatched: [] as string[] }
    if (Object.keys(filter.errors).length > 0) {
      return sendPage(reply, 422, eventsPage(viewOf(request), { ...view, events: [], names: await partyNamesOf(app.db, []), nextCursor: undefined }))
    }
    // A username first (a user may be named like an id), else an id; neither lists nothing and says so, rather than failing the page.
    const idOf = async (value: string, role: 'actor' | 'target'): Promise<string | undefined> => {
      if (value === '') return undefined
      const id = await userIdOfUsername(app.db, value)
      if (id !== undefined) return id
      if (EVENT_PARTY_ID.test(value)) return value.toLowerCase()
      view.unmatched.push(`No user is named “${value}” (the ${role} filter).`)
      return undefined
    }
    const [actorId, targetId] = [await idOf(filter.values.actor, 'actor'), await idOf(filter.values.target, 'target')]
    const page = view.unmatched.length > 0
      ? { events: [], nextCursor: undefined }
      : await listEventsPage(app.db, { ...filter.query, actor_id: actorId, target_id: targetId, limit: PAGE_SIZE })
    const names = await partyNamesOf(app.db, page.events)
    return sendPage(reply, 200, eventsPage(viewOf(request), { ...view, events: page.events, names, nextCursor: page.nextCursor }))
  })

  // -------------------------------------------------------------------------
  // Webhooks

  const webhooksList = async (request: FastifyRequest, reply: FastifyReply, status: number, form: WebhookFormValues = { url: '', event_types: '', description: '' }, errors: FieldErrors = {}, general?: string): Promise<FastifyReply> => {
    const q = request.query as Record<string, unknown>
    const notice = q.done === 'deleted' && typeof q.url === 'string' ? `Deleted the endpoint ${q.url}.` : undefined
    return sendPage(reply, status, webhooksPage(viewOf(request, notice), await listWebhooks(app.db), form, errors, general))
  }

  app.get('/admin/webhooks', { schema: hidden }, async (request, reply) => await webhooksList(request, reply, 200))

  app.post('/admin/webhooks', { schema: hidden, ...formPost }, async (request, reply) => {
    const fields = (request.body ?? {}) as Fields
    const form = webhookValuesFrom(fields)
    const parsed = parseWebhook(fields)
    if (!parsed.ok) return await webhooksList(request, reply, 422, form, parsed.errors)
    try {
      const webhook = await createWebhook(app.db, requestContext(request), app.config, parsed.value)
      return sendPage(reply, 201, webhookSecretPage(viewOf(request), webhook, false))
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      // The service's refusals (an internal address, an unknown event type) belong next to their field.
      const first = error.errors?.[0]
      if (first?.pointer !== undefined) return await webhooksList(request, reply, error.status, form, { [first.pointer.split('/')[1]!]: first.detail })
      if (error.status === 409) return await webhooksList(request, reply, 409, form, {}, error.detail)
      throw error
    }
  })

  const webhookRoute = { schema: { ...hidden, params: WebhookIdParams } }
  type WebhookRequest = FastifyRequest<{ Params: { webhook_id: string } }>

  const renderWebhook = async (request: WebhookRequest, reply: FastifyReply, status: number, ping?: WebhookTestResult): Promise<FastifyReply> => {
    const id = request.params.webhook_id
    const q = request.query as Record<string, unknown>
    const query = parseWebhookQuery(q)
    const [webhook, deliveries, attempts] = await Promise.all([
      getWebhook(app.db, id),
      listWebhookDeliveries(app.db, id, { ...query.deliveries, limit: WEBHOOK_ROWS }),
      listWebhookAttempts(app.db, id, { limit: WEBHOOK_ROWS, ...(query.attemptsCursor !== undefined ? { cursor: query.attemptsCursor } : {}) })
    ])
    const notice = typeof q.done === 'string' ? NOTICES[q.done] : undefined
    return sendPage(reply, status, webhookPage(viewOf(request, notice), {
      webhook,
      deliveries: deliveries.deliveries,
      status: query.deliveries.status,
      cursor: query.deliveries.cursor,
      nextCursor: deliveries.nextCursor,
      attempts: attempts.attempts,
      attemptsCursor: query.attemptsCursor,
      nextAttemptsCursor: attempts.nextCursor,
      ping
    }))
  }

  app.get('/admin/webhooks/:webhook_id', webhookRoute, async (request: WebhookRequest, reply) => await renderWebhook(request, reply, 200))

  for (const [action, enabled] of [['enable', true], ['disable', false]] as const) {
    app.post(`/admin/webhooks/:webhook_id/${action}`, { ...webhookRoute, ...formPost }, async (request: WebhookRequest, reply) => {
      await updateWebhook(app.db, requestContext(request), app.config, request.params.webhook_id, { enabled })
      return await seeOther(reply, `${admin}/webhooks/${request.params.webhook_id}?done=webhook-${action}d`)
    })
  }

  app.post('/admin/webhooks/:webhook_id/rotate', { ...webhookRoute, ...formPost }, async (request: WebhookRequest, reply) => {
    const webhook = await rotateWebhookSecret(app.db, requestContext(request), app.config, request.params.webhook_id)
    return sendPage(reply, 200, webhookSecretPage(viewOf(request), webhook, true))
  })

  // The answer is shown on the endpoint's page itself: a ping is not stored anywhere a redirect could find it.
  app.post('/admin/webhooks/:webhook_id/ping', { ...webhookRoute, ...formPost }, async (request: WebhookRequest, reply) => {
    const result = await pingWebhook(app.db, requestContext(request), app.webhooks.sender, request.params.webhook_id)
    return await renderWebhook(request, reply, 200, result)
  })

  app.get('/admin/webhooks/:webhook_id/delete', webhookRoute, async (request: WebhookRequest, reply) => {
    return sendPage(reply, 200, deleteWebhookPage(viewOf(request), await getWebhook(app.db, request.params.webhook_id)))
  })

  app.post('/admin/webhooks/:webhook_id/delete', { ...webhookRoute, ...formPost }, async (request: WebhookRequest, reply) => {
    const { url } = await getWebhook(app.db, request.params.webhook_id)
    await deleteWebhook(app.db, requestContext(request), request.params.webhook_id)
    return await seeOther(reply, `${admin}/webhooks?done=deleted&url=${encodeURIComponent(url)}`)
  })

  app.post('/admin/webhooks/:webhook_id/deliveries/:event_id/retry', { schema: { ...hidden, params: WebhookDeliveryParams }, ...formPost }, async (request: FastifyRequest<{ Params: { webhook_id: string, event_id: string } }>, reply) => {
    await retryWebhookDelivery(app.db, app.config, request.params.webhook_id, request.params.event_id)
    return await seeOther(reply, `${admin}/webhooks/${request.params.webhook_id}?done=retried`)
  })
}
