import type { ApiKey, ApiKeyWithSecret } from '../api-keys/api-keys.schemas.ts'
import type { Group } from '../groups/groups.schemas.ts'
import { SCOPES } from '../auth/principal.ts'
import { roleNameProblem, SUPERUSER_PRIVILEGES_OPTION } from '../lib/pg-role-name.ts'
import { EVENT_TYPES, type Event } from '../events/events.schemas.ts'
import type { PartyNames } from '../events/events.service.ts'
import type { EnterpriseFacts } from '../scim/scim.repository.ts'
import { toIso } from '../db/database.ts'
import type { MailRow } from '../mail/mail.repository.ts'
import type { MfaStatus } from '../mfa/mfa.schemas.ts'
import { signInText, type SessionSummary } from '../sessions/sessions.schemas.ts'
import { SORTS, type ListUsersQuery, type User } from '../users/users.schemas.ts'
import type { SignInState } from '../users/users.service.ts'
import type { Webhook, WebhookAttempt, WebhookDelivery, WebhookTestResult, WebhookWithSecret } from '../webhooks/webhooks.schemas.ts'
import { changedFields, formValuesOf, type EventsFilterValues, type FieldErrors, type UserFormValues, type WebhookFormValues } from './console.forms.ts'
import { html, queryOf, type SafeHtml } from '../lib/html.ts'

/** What every page needs to know: where it is served and who is looking. */
export interface ViewContext {
  base: string
  /** The signed-in admin, for the header; undefined on pages shown before that is known. */
  username: string | undefined
  /** A sentence to show at the top of the page (a finished action). */
  notice?: SafeHtml | string | undefined
  /** With SMTP configured: the Mail page is in the menu, and a banner says when mail is not going out (mail-status.ts). */
  mail?: { alert: SafeHtml | undefined } | undefined
}

type Section = 'users' | 'groups' | 'api-keys' | 'events' | 'webhooks' | 'mail' | undefined

export function layout (ctx: ViewContext, title: string, section: Section, body: SafeHtml): string {
  const admin = `${ctx.base}/admin`
  const link = (href: string, name: string, key: Section): SafeHtml =>
    html`<li><a href="${href}"${section === key ? html` aria-current="page"` : ''}>${name}</a></li>`
  const header = ctx.username !== undefined
    ? html`<nav aria-label="Console"><ul>${link(`${admin}/users`, 'Users', 'users')}${link(`${admin}/groups`, 'Groups', 'groups')}${link(`${admin}/api-keys`, 'API keys', 'api-keys')}${link(`${admin}/events`, 'Events', 'events')}${link(`${admin}/webhooks`, 'Webhooks', 'webhooks')}${ctx.mail !== undefined ? link(`${admin}/mail`, 'Mail', 'mail') : ''}</ul></nav>
<div class="who"><span>Signed in as <strong>${ctx.username}</strong></span>
<a href="${ctx.base}/account">Account security</a>
<form method="post" action="${ctx.base}/logout"><button type="submit">Sign out</button></form></div>`
    : ''
  const notice = ctx.notice !== undefined && ctx.notice !== '' ? html`<div class="notice" role="status">${ctx.notice}</div>` : ''
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · gatehouse admin</title>
<link rel="stylesheet" href="${admin}/assets/console.css">
<script src="${admin}/assets/console.js" defer></script>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top"><a class="brand" href="${admin}">gatehouse admin</a>${header}</header>
<main id="main" tabindex="-1">
${ctx.mail?.alert ?? ''}${notice}${body}
</main>
<div id="live" class="visually-hidden" aria-live="polite"></div>
</body>
</html>
`.text
}

/** The enterprise extension a SCIM client keeps (docs/scim.md), as one line of the account facts; nothing when none of it is set. */
function enterpriseFacts (facts: EnterpriseFacts | undefined, users: string): SafeHtml | '' {
  if (facts === undefined) return ''
  const parts: SafeHtml[] = []
  for (const [label, value] of [['employee number', facts.employeeNumber], ['cost center', facts.costCenter], ['organization', facts.organization], ['division', facts.division], ['department', facts.department]] as const) {
    if (value !== null) parts.push(html`${label} <code>${value}</code>`)
  }
  if (facts.manager !== null) parts.push(html`manager <a href="${users}/${facts.manager.id}">${facts.manager.username}</a>`)
  if (parts.length === 0) return ''
  return html`<dt>Organization</dt><dd id="enterprise">${parts.map((part, i) => html`${i > 0 ? '; ' : ''}${part}`)} (from SCIM)</dd>`
}

function date (iso: string | null): SafeHtml {
  if (iso === null) return html`<span class="muted">never</span>`
  return html`<time datetime="${iso}">${iso.slice(0, 16).replace('T', ' ')} UTC</time>`
}

function options<T extends string> (values: ReadonlyArray<readonly [T, string]>, selected: string | undefined): SafeHtml[] {
  return values.map(([value, label]) => html`<option value="${value}"${value === selected ? html` selected` : ''}>${label}</option>`)
}

/** An input with its label, hint and error, wired together for screen readers. */
function input (name: string, label: string, value: string, errors: FieldErrors, extra: { type?: string, hint?: string, required?: boolean, autocomplete?: string, filter?: boolean, readonly?: boolean } = {}): SafeHtml {
  const error = errors[name]
  const described = [extra.hint !== undefined ? `${name}-hint` : '', error !== undefined ? `${name}-error` : ''].filter(Boolean).join(' ')
  return html`<div class="field">
<label for="${name}">${label}${extra.required === true || extra.filter === true ? '' : html` <span class="muted">(optional)</span>`}</label>
<input id="${name}" name="${name}" type="${extra.type ?? 'text'}" value="${value}"${extra.required === true ? html` required` : ''}${extra.readonly === true ? html` readonly` : ''}${extra.autocomplete !== undefined ? html` autocomplete="${extra.autocomplete}"` : ''}${described !== '' ? html` aria-describedby="${described}"` : ''}${error !== undefined ? html` aria-invalid="true"` : ''}>
${extra.hint !== undefined ? html`<p class="hint" id="${name}-hint">${extra.hint}</p>` : ''}
${error !== undefined ? html`<p class="field-error" id="${name}-error">${label} ${error}.</p>` : ''}
</div>`
}

const LABELS: Record<string, string> = {
  username: 'Username', email: 'Email', first_name: 'First name', last_name: 'Last name', groups: 'Groups', role: 'Role', password: 'Password', disabled: 'Disabled', name: 'Name', expires_at: 'Expires', scopes: 'Scopes', url: 'URL', event_types: 'Event types', description: 'Description'
}

function errorSummary (errors: FieldErrors, general: string | undefined): SafeHtml {
  const items = Object.entries(errors)
  if (items.length === 0 && general === undefined) return html``
  return html`<div class="error" role="alert" id="form-errors"><strong>Nothing was saved.</strong>${general !== undefined ? html` ${general}` : ''}
${items.length > 0 ? html`<ul>${items.map(([name, detail]) => html`<li><a href="#${name}">${LABELS[name] ?? name}</a> ${detail}</li>`)}</ul>` : ''}</div>`
}

/** The values the edit form was filled with, sent back with it so that only changed fields are written. */
function originalFields (original: UserFormValues): SafeHtml[] {
  return (Object.keys(original) as Array<keyof UserFormValues>).map(field => html`<input type="hidden" name="was_${field}" value="${String(original[field])}">`)
}

/**
 * The user's fields; with `ownedBy` (an identity provider that provisions the
 * user through SCIM) the ones it keeps are read-only, since its next sync
 * would overwrite a change made here. The disabled box, which a browser does
 * not send while disabled, sends its value in a hidden field instead.
 */
function userFields (values: UserFormValues, errors: FieldErrors, passwordHint: string, ownedBy?: string): SafeHtml {
  const owned = ownedBy !== undefined
  const keptThere = owned ? `Kept by ${ownedBy} (SCIM): change it there.` : undefined
  return html`<div class="grid">
${input('username', 'Username', values.username, errors, { required: true, autocomplete: 'off', hint: keptThere ?? 'Letters, digits and . _ @ -; unique ignoring case.', readonly: owned })}
${input('email', 'Email', values.email, errors, { type: 'email', autocomplete: 'off', hint: keptThere, readonly: owned })}
${input('first_name', 'First name', values.first_name, errors, { autocomplete: 'off', hint: keptThere, readonly: owned })}
${input('last_name', 'Last name', values.last_name, errors, { autocomplete: 'off', hint: keptThere, readonly: owned })}
${input('groups', 'Groups', values.groups, errors, { hint: 'Separated by commas, e.g. analysts, ops.', autocomplete: 'off' })}
<div class="field"><label for="role">Role</label>
<select id="role" name="role">${options([['user', 'user'], ['admin', 'admin']], values.role)}</select></div>
${input('password', 'Password', '', errors, { type: 'password', autocomplete: 'new-password', hint: passwordHint })}
</div>
${owned
  ? html`<div class="field"><label class="check"><input type="checkbox" value="true" disabled aria-describedby="disabled-hint"${values.disabled ? html` checked` : ''}> Disabled (cannot sign in; API keys stop working)</label>
${values.disabled ? html`<input type="hidden" name="disabled" value="true">` : ''}<p class="hint" id="disabled-hint">${keptThere}</p></div>`
  : html`<div class="field"><label class="check"><input type="checkbox" name="disabled" value="true"${values.disabled ? html` checked` : ''}> Disabled (cannot sign in; API keys stop working)</label></div>`}`
}

/** Who keeps the user's SCIM-owned fields, when an identity provider provisions them; undefined otherwise. */
function scimOwnerOf (view: UserView): string | undefined {
  const provisioning = view.provisioning
  if (provisioning === undefined || (provisioning.externalId === null && provisioning.provisionedAt === null)) return undefined
  return provisioning.provisioner ?? 'the identity provider'
}

// ---------------------------------------------------------------------------
// Users

export interface UsersListView {
  users: User[]
  query: ListUsersQuery
  nextCursor: string | undefined
}

export function usersPage (ctx: ViewContext, view: UsersListView): string {
  const list = `${ctx.base}/admin/users`
  const q = view.query
  const filters = { q: q.q, role: q.role, group: q.group, disabled: q.disabled === undefined ? undefined : String(q.disabled), sort: q.sort }
  const filtered = q.q !== undefined || q.role !== undefined || q.group !== undefined || q.disabled !== undefined
  const sortLabels: Record<string, string> = {
    created_at: 'Oldest first', '-created_at': 'Newest first', username: 'Username A–Z', '-username': 'Username Z–A', updated_at: 'Least recently changed', '-updated_at': 'Most recently changed'
  }
  const rows = view.users.map(user => html`<tr>
<td data-label="Username"><a href="${list}/${user.id}">${user.username}</a></td>
<td data-label="Name">${[user.first_name, user.last_name].filter(Boolean).join(' ')}</td>
<td data-label="Email">${user.email ?? ''}</td>
<td data-label="Role">${user.role === 'admin' ? html`<span class="badge admin">admin</span>` : 'user'}</td>
<td data-label="Groups">${user.groups.join(', ')}</td>
<td data-label="Status">${user.disabled ? html`<span class="badge off">disabled</span>` : 'enabled'}</td>
<td data-label="Created">${date(user.created_at)}</td>
<td data-label="ID" class="id">${user.id}</td>
</tr>`)
  const body = html`<div class="actions"><h1>Users</h1><a class="button" href="${list}/new">Create user</a>
<a class="button secondary" href="${list}/export${queryOf(filters)}" download>Export CSV${filtered ? html`<span class="visually-hidden"> of the users matching the filters</span>` : ''}</a></div>
<form class="panel filters" method="get" action="${list}" role="search" aria-label="Find users">
<div class="field wide"><label for="q">Search</label><input id="q" name="q" type="search" value="${q.q ?? ''}" aria-describedby="q-hint"><p class="hint" id="q-hint">Part of a username, email, first or last name; case does not matter.</p></div>
<div class="field"><label for="f-role">Role</label><select id="f-role" name="role">${options([['', 'Any'], ['admin', 'admin'], ['user', 'user']], q.role ?? '')}</select></div>
<div class="field"><label for="f-group">Group</label><input id="f-group" name="group" type="text" value="${q.group ?? ''}"></div>
<div class="field"><label for="f-disabled">Status</label><select id="f-disabled" name="disabled">${options([['', 'Any'], ['false', 'Enabled'], ['true', 'Disabled']], filters.disabled ?? '')}</select></div>
<div class="field"><label for="f-sort">Order</label><select id="f-sort" name="sort">${options(SORTS.map(s => [s, sortLabels[s] ?? s] as const), q.sort ?? 'created_at')}</select></div>
<div class="field actions"><button type="submit">Apply</button>${filtered ? html`<a href="${list}">Clear</a>` : ''}</div>
</form>
${view.users.length === 0
  ? html`<p class="panel">${filtered ? 'No user matches these filters.' : 'There are no users yet.'}</p>`
  : html`<div class="table-wrap" role="region" aria-label="Users" tabindex="0"><table class="cards">
<caption class="visually-hidden">Users${filtered ? ' matching the filters' : ''}, ${sortLabels[q.sort ?? 'created_at']}</caption>
<thead><tr><th scope="col">Username</th><th scope="col">Name</th><th scope="col">Email</th><th scope="col">Role</th><th scope="col">Groups</th><th scope="col">Status</th><th scope="col">Created</th><th scope="col">ID</th></tr></thead>
<tbody>${rows}</tbody></table></div>`}
<nav class="pager" aria-label="Pages">
${q.cursor !== undefined ? html`<a href="${list}${queryOf(filters)}">First page</a>` : ''}
${view.nextCursor !== undefined ? html`<a href="${list}${queryOf({ ...filters, cursor: view.nextCursor })}" rel="next">Next page</a>` : ''}
</nav>`
  return layout(ctx, 'Users', 'users', body)
}

export function newUserPage (ctx: ViewContext, values: UserFormValues, errors: FieldErrors, general?: string, invite = false): string {
  const body = html`<h1>Create a user</h1>
${errorSummary(errors, general)}
<form class="panel" method="post" action="${ctx.base}/admin/users" novalidate>
${userFields(values, errors, 'Leave empty to create the user without a password: they cannot sign in until one is set. 8 to 256 characters, not containing the username, the e-mail address\'s name part or the service\'s names.')}
<div class="field"><label class="check"><input type="checkbox" name="invite" value="true" aria-describedby="invite-hint"${invite ? html` checked` : ''}> Invite user</label>
<p class="hint" id="invite-hint">Leave the field above empty: they get a one-time link (mailed to them or, without mail, shown here to hand over) and choose their own.</p></div>
<div class="actions"><button type="submit">Create user</button><a href="${ctx.base}/admin/users">Cancel</a></div>
</form>`
  return layout(ctx, 'Create a user', 'users', body)
}

/** The optional database-user step, as the command to run (docs/cli.md); the console never touches the service's database. */
export function dbUserCommand (username: string, action: 'create' | 'drop'): SafeHtml {
  const problem = roleNameProblem(username)
  const role = problem === undefined ? username : username.toLowerCase().replace(/[^a-z0-9_$]/g, '_').replace(/^([^a-z_])/, '_$1').slice(0, 63)
  const command = action === 'create'
    ? `export SERVICE_DATABASE_URL=postgres://…\nnpx gatehouse db-user create ${role}`
    : `export SERVICE_DATABASE_URL=postgres://…\nnpx gatehouse db-user drop ${role}`
  return html`<pre class="command"><code>${command}</code></pre>
${problem !== undefined ? html`<p class="hint">“${username}” cannot be a role name (${problem}); the command above uses “${role}”. Choose another lower-case name if you prefer.</p>` : ''}
<p class="hint">${action === 'create'
  ? `It asks for the password and creates the role with LOGIN CREATEDB (the role always has LOGIN); for a superuser add ${SUPERUSER_PRIVILEGES_OPTION}. See docs/cli.md.`
  : 'It drops that role and nothing else. See docs/cli.md.'}</p>`
}

export interface UserView {
  user: User
  version: number
  signIn: SignInState
  events: Event[]
  /** Who the events name, as people know them. */
  eventNames: PartyNames
  moreEvents: boolean
  /** The user's second factors, as GET /api/users/{user_id}/mfa shows them. */
  mfa: MfaStatus
  /** The only enabled admin: the last-admin rule applies to them. */
  lastAdmin: boolean
  /** The user's live sessions, as GET /api/users/{user_id}/sessions lists them. */
  sessions: SessionSummary[]
  /** What SCIM provisioning keeps about the user (docs/scim.md); absent or both null when no SCIM client manages them. */
  provisioning?: { externalId: string | null, provisionedAt: string | null, enterprise?: EnterpriseFacts, provisioner?: string } | undefined
  values?: UserFormValues
  /** The version and values an edit form being shown again was read at (else the stored user's). */
  formVersion?: number
  original?: UserFormValues | undefined
  errors?: FieldErrors
  general?: string | undefined
  /** Why an action was refused (the last-admin rule), shown above the actions. */
  blocked?: string | undefined
  created?: boolean
  /** With SMTP, a pending user's newest invitation mail as the outbox has it; null when none was queued. */
  invitationMail?: InvitationMail | null | undefined
  /** An invitation just issued and not mailed: its link and code, shown this once to hand over. */
  invitation?: { url: string, code: string, expires_at: string } | undefined
  /** A password-reset link just issued and not mailed, shown this once. */
  resetLink?: { url: string, code: string, expires_at: string } | undefined
}

/** How a value in an event's data reads: lists joined, nothing as a dash, secrets as the API shows them ("[redacted]"). */
function readable (value: unknown): string {
  if (value === null || value === undefined) return '—'
  if (Array.isArray(value)) return value.length === 0 ? '(none)' : value.map(readable).join(', ')
  if (typeof value === 'object') return JSON.stringify(value)
  return String(value)
}

function isChange (value: unknown): value is { from: unknown, to: unknown } {
  return typeof value === 'object' && value !== null && 'from' in value && 'to' in value
}

/** An event's data as lines: "field: old → new" for each change, "name: value" for the rest. */
export function dataLines (data: Record<string, unknown>): SafeHtml {
  const lines: SafeHtml[] = []
  for (const [name, value] of Object.entries(data)) {
    if (name === 'changes' && typeof value === 'object' && value !== null && !Array.isArray(value)) {
      for (const [field, change] of Object.entries(value)) {
        lines.push(isChange(change) ? html`<li>${field}: ${readable(change.from)} → ${readable(change.to)}</li>` : html`<li>${field}: ${readable(change)}</li>`)
      }
    } else {
      lines.push(html`<li>${name}: ${readable(value)}</li>`)
    }
  }
  return lines.length === 0 ? html`<span class="muted">—</span>` : html`<ul class="lines">${lines}</ul>`
}

const NO_NAMES: PartyNames = { users: new Map(), apiKeys: new Map(), webhooks: new Map() }

/**
 * An event's actor or target as people know it (username, key name, endpoint
 * URL), linking to its page; the id stays under it, for the API and for
 * records that no longer exist.
 */
function party (ctx: ViewContext, type: string, id: string | null, names: PartyNames, deletedName?: string): SafeHtml {
  if (id === null) return html`${type}`
  if (type === 'system' && id === 'cli') return html`the <code>gatehouse</code> command`
  const admin = `${ctx.base}/admin`
  const idLine = html`<br><span class="id muted">${id}</span>`
  if (type === 'user') {
    const username = names.users.get(id)
    if (username !== undefined) return html`<a href="${admin}/users/${id}">${username}</a>${idLine}`
    return html`deleted user${deletedName !== undefined ? html` ${deletedName}` : ''}${idLine}`
  }
  if (type === 'api_key') {
    const name = names.apiKeys.get(id)
    return name !== undefined ? html`API key <a href="${admin}/api-keys?include_revoked=true#key-${id}">${name}</a>${idLine}` : html`deleted API key${idLine}`
  }
  if (type === 'webhook') {
    const url = names.webhooks.get(id)
    return url !== undefined ? html`endpoint <a href="${admin}/webhooks/${id}" class="wrap">${url}</a>${idLine}` : html`deleted endpoint${idLine}`
  }
  return html`${type}${idLine}`
}

export function eventsTable (ctx: ViewContext, events: Event[], caption: string, names: PartyNames = NO_NAMES): SafeHtml {
  if (events.length === 0) return html`<p class="panel">No events.</p>`
  return html`<div class="table-wrap" role="region" aria-label="${caption}" tabindex="0"><table class="cards events">
<caption class="visually-hidden">${caption}, newest first</caption>
<thead><tr><th scope="col">When</th><th scope="col">Event</th><th scope="col">Actor</th><th scope="col">Target</th><th scope="col">Details</th></tr></thead>
<tbody>${events.map(e => html`<tr>
<td data-label="When">${date(e.occurred_at)}</td><td data-label="Event"><code>${e.type}</code></td><td data-label="Actor">${party(ctx, e.actor.type, e.actor.id, names)}</td>
<td data-label="Target">${e.target === null ? '' : party(ctx, e.target.type, e.target.id, names, e.type === 'user.deleted' && typeof e.data.username === 'string' ? e.data.username : undefined)}</td>
<td data-label="Details" class="data">${dataLines(e.data)}${e.client_ip !== null ? html`<div class="muted">from ${e.client_ip}</div>` : ''}</td>
</tr>`)}</tbody></table></div>`
}

type InvitationMail = Pick<MailRow, 'status' | 'attempts' | 'last_error' | 'created_at' | 'finished_at' | 'next_attempt_at'>

/** Where the invitation's mail is: waiting (with the last failure), sent, or given up. */
function invitationDelivery (mail: InvitationMail | null): SafeHtml {
  if (mail === null) return html`<p id="invitation-delivery">No invitation mail was queued (the user has no address, or it was issued without mail).</p>`
  if (mail.status === 'sent') return html`<p id="invitation-delivery">The invitation mail was sent ${date(toIso(mail.finished_at))}.</p>`
  if (mail.status === 'failed') return html`<p class="warning" id="invitation-delivery">The invitation mail was given up ${date(toIso(mail.finished_at))} after ${mail.attempts} ${mail.attempts === 1 ? 'attempt' : 'attempts'}: <code>${mail.last_error ?? 'no reason recorded'}</code>. Resend it once mail works.</p>`
  if (mail.last_error === null) return html`<p id="invitation-delivery">The invitation mail is queued since ${date(toIso(mail.created_at))}, not sent yet.</p>`
  return html`<p class="warning" id="invitation-delivery">The invitation mail is not sent yet: ${mail.attempts} ${mail.attempts === 1 ? 'attempt' : 'attempts'} failed, the last with <code>${mail.last_error}</code>; the next is ${date(toIso(mail.next_attempt_at))}.</p>`
}

export function userPage (ctx: ViewContext, view: UserView): string {
  const { user } = view
  const url = `${ctx.base}/admin/users/${user.id}`
  const errors = view.errors ?? {}
  const values = view.values ?? formValuesOf(user)
  const locked = view.signIn.lockedUntil !== null
  const owner = scimOwnerOf(view)
  const lastAdminNote = view.lastAdmin
    ? html`<p class="warning" id="last-admin-note"><strong>The last enabled admin.</strong> gatehouse always keeps one enabled admin, so that someone can manage it: ${user.username} cannot be disabled, made a user or deleted until another user is an admin.</p>`
    : ''
  const body = html`<h1>${user.username} ${user.role === 'admin' ? html`<span class="badge admin">admin</span>` : ''} ${user.disabled ? html`<span class="badge off">disabled</span>` : ''} ${locked ? html`<span class="badge locked">sign-in locked</span>` : ''}</h1>
${view.blocked !== undefined ? html`<div class="error" role="alert"><strong>Not done.</strong> ${view.blocked}</div>` : ''}
${view.created === true
? html`<section class="panel" aria-labelledby="db-title"><h2 id="db-title">Next, if they need one: the database user</h2>
<p>gatehouse keeps its own accounts only. If ${user.username} also needs an account in the service's relational database, run:</p>${dbUserCommand(user.username, 'create')}</section>`
: ''}
${view.invitation !== undefined
? html`<section class="panel" aria-labelledby="invite-link-title"><h2 id="invite-link-title">Invitation link for ${user.username}</h2>
<p>No mail is sent here (no SMTP_URL): hand this link to ${user.username} yourself. It is shown this once, works once, until ${date(view.invitation.expires_at)}.</p>
<div class="secret"><code id="invitation-link">${view.invitation.url}</code><button type="button" data-copy="invitation-link" hidden>Copy link</button></div>
<p>Or they open the invitation page and type their username and the code <code id="invitation-code">${view.invitation.code}</code>.</p></section>`
: ''}
${view.resetLink !== undefined
? html`<section class="panel" aria-labelledby="reset-link-title"><h2 id="reset-link-title">Password-reset link for ${user.username}</h2>
<p>No mail is sent here (no SMTP_URL): hand this link to ${user.username} yourself. It is shown this once, works once, until ${date(view.resetLink.expires_at)}.</p>
<div class="secret"><code id="reset-link">${view.resetLink.url}</code><button type="button" data-copy="reset-link" hidden>Copy link</button></div>
<p>Or they open the reset page and type their username and the code <code id="reset-code">${view.resetLink.code}</code>.</p></section>`
: ''}
${user.invitation_pending
? html`<section class="panel" aria-labelledby="invitation-title"><h2 id="invitation-title">Invitation pending</h2>
<p>${user.username} has not accepted the invitation yet, and cannot sign in until they do. Resending makes a new link and code; the earlier ones stop working.</p>
${view.invitationMail !== undefined ? invitationDelivery(view.invitationMail) : ''}
<div class="actions"><form method="post" action="${url}/invitation"><button type="submit">Resend invitation</button></form>
<form method="post" action="${url}/invitation/revoke"><button type="submit" class="secondary">Revoke invitation</button></form></div></section>`
: ''}
<section class="panel" aria-labelledby="facts-title"><h2 id="facts-title">Account</h2>
<dl class="facts">
<dt>ID</dt><dd><code id="user-id">${user.id}</code></dd>
<dt>Status</dt><dd>${user.disabled ? 'disabled' : 'enabled'}${user.invitation_pending ? '; invited, not yet accepted' : ''}</dd>
<dt>Email</dt><dd>${user.email === null ? 'none' : html`${user.email} (${user.email_verified ? 'confirmed' : 'not confirmed'})`}</dd>
<dt>Created</dt><dd>${date(user.created_at)}</dd>
<dt>Last changed</dt><dd>${date(user.updated_at)}</dd>
<dt>Last sign-in</dt><dd>${date(user.last_login_at)}</dd>
<dt>Password</dt><dd>${user.password_changed_at === null ? 'none set: cannot sign in' : html`set ${date(user.password_changed_at)}`}</dd>
${owner !== undefined
  ? html`<dt>Provisioning</dt><dd id="provisioning">managed by ${owner} through SCIM${view.provisioning!.externalId !== null ? html`; externalId <code>${view.provisioning!.externalId}</code>` : ''}; last provisioning change ${date(view.provisioning!.provisionedAt)}. Its username, email, names and whether it is disabled are kept there and read-only here.</dd>`
  : ''}
${enterpriseFacts(view.provisioning?.enterprise, `${ctx.base}/admin/users`)}
<dt>Sign-in lock</dt><dd>${locked ? html`locked for unknown clients until ${date(view.signIn.lockedUntil)}` : 'not locked'}; ${view.signIn.failedLogins} failed sign-in${view.signIn.failedLogins === 1 ? '' : 's'} counted</dd>
</dl></section>
${lastAdminNote}
<section class="panel" aria-labelledby="edit-title"><h2 id="edit-title">Edit</h2>
${errorSummary(errors, view.general)}
${owner !== undefined ? html`<p id="idp-owned">${owner} provisions ${user.username} through SCIM and keeps their username, email, names and whether the account is disabled: change those in ${owner}. The role, groups and password can be changed here.</p>` : ''}
<form method="post" action="${url}" novalidate>
<input type="hidden" name="version" value="${view.formVersion ?? view.version}">
${originalFields(view.original ?? formValuesOf(user))}
${userFields(values, errors, 'Leave empty to keep the current password. Setting one ends their sessions and revokes their API keys.', owner)}
<button type="submit">Save changes</button>
</form></section>
<section class="panel" aria-labelledby="actions-title"><h2 id="actions-title">Actions</h2>
<div class="actions">
${owner !== undefined
  ? ''
  : user.disabled
  ? html`<form method="post" action="${url}/enable"><button type="submit" class="secondary">Enable</button></form>`
  : html`<form method="post" action="${url}/disable" data-confirm="Disable ${user.username}? Their sessions end and their API keys are revoked." data-confirm-label="Disable"><button type="submit" class="secondary">Disable</button></form>`}
<form method="post" action="${url}/unlock"><button type="submit" class="secondary">Reset sign-in lock</button></form>
${user.invitation_pending || user.disabled || !user.password_sign_in ? '' : html`<form method="post" action="${url}/password-reset"><button type="submit" class="secondary">Password-reset link</button></form>`}
<form method="post" action="${url}/end-sessions" data-confirm="End every session of ${user.username}? They will have to sign in again." data-confirm-label="End sessions"><button type="submit" class="secondary">End sessions</button></form>
<a class="button danger" href="${url}/delete">Delete…</a>
</div>
<p class="hint">Password-reset link lets them choose a new password themselves: mailed to them, or shown here to hand over. Reset sign-in lock lifts the lock repeated wrong passwords put on the account and sets the count to 0. End sessions signs them out everywhere; API keys stay.</p>
</section>
${mfaSection(url, user, view.mfa)}
${sessionsSection(url, user, view.sessions)}
${view.created === true
? ''
: html`<section class="panel" aria-labelledby="db-user-title"><h2 id="db-user-title">Database user (optional)</h2>
<p>The console never creates or drops database roles. To give ${user.username} a role in the service's database, run:</p>
${dbUserCommand(user.username, 'create')}</section>`}
<section aria-labelledby="events-title"><h2 id="events-title">Events about ${user.username}</h2>
${eventsTable(ctx, view.events, `Events about ${user.username}`, view.eventNames)}
<p class="pager"><a href="${ctx.base}/admin/events${queryOf({ target: user.id })}">${view.moreEvents ? 'All events about this user' : 'Open in the event timeline'}</a>
<a href="${ctx.base}/admin/events${queryOf({ actor: user.id })}">What ${user.username} did</a></p>
</section>`
  return layout(ctx, user.username, 'users', body)
}

/** Whether the user has anything a reset would remove. */
function hasFactors (mfa: MfaStatus): boolean {
  return mfa.totp.enrolled || mfa.totp.pending || mfa.passkeys.length > 0 || mfa.recovery_codes_remaining > 0
}

function mfaFacts (mfa: MfaStatus): SafeHtml {
  return html`<dl class="facts" id="mfa-state">
<dt>Authenticator app</dt><dd>${mfa.totp.enrolled ? 'yes' : mfa.totp.pending ? 'no (a set-up waits for its first code)' : 'no'}</dd>
<dt>Passkeys</dt><dd>${mfa.passkeys.length}${mfa.passkeys.length > 0 ? html` <span class="muted">(${mfa.passkeys.map(p => p.name).join(', ')})</span>` : ''}</dd>
<dt>Recovery codes left</dt><dd>${mfa.recovery_codes_remaining} of 10</dd>
<dt>Required</dt><dd>${mfa.required ? 'yes: MFA_REQUIRED applies to this user, who must enrol a factor at sign-in if they have none' : 'no (MFA_REQUIRED does not apply to this user)'}</dd>
</dl>`
}

/** Where the user is signed in, each session with its own End button (End sessions, under Actions, ends them all). */
function sessionsSection (url: string, user: User, sessions: SessionSummary[]): SafeHtml {
  return html`<section class="panel" aria-labelledby="sessions-title"><h2 id="sessions-title">Sessions</h2>
${sessions.length === 0
  ? html`<p id="no-sessions">${user.username} is not signed in anywhere.</p>`
  : html`<div class="table-wrap" role="region" aria-label="Sessions" tabindex="0"><table class="cards" id="sessions">
<caption class="visually-hidden">Live sessions of ${user.username}, most recently used first</caption>
<thead><tr><th scope="col">Device</th><th scope="col">Signed in with</th><th scope="col">Address</th><th scope="col">Signed in</th><th scope="col">Last active</th><th scope="col">Actions</th></tr></thead>
<tbody>${sessions.map(s => html`<tr data-session="${s.id}">
<td data-label="Device">${s.device ?? html`<span class="muted">unknown</span>`}${s.current ? html` <strong>(your session)</strong>` : ''}${s.user_agent !== null ? html`<div class="muted wrap">${s.user_agent}</div>` : ''}</td>
<td data-label="Signed in with">${signInText(s)}</td>
<td data-label="Address">${s.client_ip ?? html`<span class="muted">unknown</span>`}</td>
<td data-label="Signed in">${date(s.created_at)}</td>
<td data-label="Last active">${date(s.last_seen_at)}</td>
<td data-label="Actions"><form method="post" action="${url}/sessions/${s.id}/end" data-confirm="End this session of ${user.username}${s.device !== null ? ` on ${s.device}` : ''}?${s.current ? ' It is yours: you will be signed out.' : ''}" data-confirm-label="End session"><button type="submit" class="secondary">End</button></form></td>
</tr>`)}</tbody></table></div>`}
<p class="hint">Ending a session stops its token and cookie at once; API keys stay.</p>
</section>`
}

function mfaSection (url: string, user: User, mfa: MfaStatus): SafeHtml {
  return html`<section class="panel" aria-labelledby="mfa-title"><h2 id="mfa-title">Second factor</h2>
${mfaFacts(mfa)}
${hasFactors(mfa)
  ? html`<div class="actions"><a class="button danger" href="${url}/mfa-reset">Reset second factor…</a></div>
<p class="hint">For someone who lost their phone or security key: removes ${user.username}'s authenticator app, passkeys and recovery codes, after a confirmation. They enrol again on their account security page.</p>`
  : html`<p class="hint">Nothing enrolled, so nothing to reset. ${user.username} enrols a factor on their account security page after signing in.</p>`}
</section>`
}

/** The confirmation before a second-factor reset: who, and exactly what goes. */
export function mfaResetPage (ctx: ViewContext, user: User, mfa: MfaStatus): string {
  const url = `${ctx.base}/admin/users/${user.id}`
  const body = html`<h1>Reset the second factor of ${user.username}?</h1>
<section class="panel">
<p>This removes every second factor of <strong>${user.username}</strong>${user.email !== null ? html` (${user.email})` : ''}, id <code>${user.id}</code>: the authenticator app, all passkeys and the unused recovery codes, and cancels sign-ins waiting for a second factor. Their password, sessions and API keys stay. The event log records it (<code>user.mfa_reset</code>).</p>
${mfaFacts(mfa)}
<p>${mfa.required
  ? `MFA_REQUIRED applies to ${user.username}: at their next sign-in they must enrol a new factor before they get in.`
  : `Afterwards ${user.username} signs in with the password alone until they enrol a factor again on their account security page.`}</p>
<form method="post" action="${url}/mfa-reset" class="actions">
<button type="submit" class="danger">Reset the second factor of ${user.username}</button>
<a href="${url}">Cancel</a>
</form></section>`
  return layout(ctx, `Reset the second factor of ${user.username}`, 'users', body)
}

export function deletePage (ctx: ViewContext, user: User, version: number, blocked?: string): string {
  const url = `${ctx.base}/admin/users/${user.id}`
  const body = html`<h1>Delete ${user.username}?</h1>
${blocked !== undefined ? html`<div class="error" role="alert"><strong>Not deleted.</strong> ${blocked}</div>` : ''}
<section class="panel">
<p>This deletes the user <strong>${user.username}</strong>${user.email !== null ? html` (${user.email})` : ''}, id <code>${user.id}</code>, ends their sessions and revokes their API keys. It cannot be undone; the event log keeps a record.</p>
<form method="post" action="${url}/delete" class="actions">
<input type="hidden" name="version" value="${version}">
<button type="submit" class="danger">Delete ${user.username}</button>
<a href="${url}">Cancel</a>
</form></section>`
  return layout(ctx, `Delete ${user.username}`, 'users', body)
}

export function deletedNotice (ctx: ViewContext, username: string): SafeHtml {
  return html`<p>Deleted ${username}. If they had a database role, drop it too (optional):</p>${dbUserCommand(username, 'drop')}`
}

const FIELD_LABELS: Array<[keyof UserFormValues, string]> = [
  ['username', 'Username'], ['email', 'Email'], ['first_name', 'First name'], ['last_name', 'Last name'], ['role', 'Role'], ['groups', 'Groups'], ['disabled', 'Disabled']
]

/**
 * A concurrent edit: the version the admin opened, their version and the
 * current one side by side. Applying their changes posts again against the
 * current version, carrying only the fields they changed.
 */
export function conflictPage (ctx: ViewContext, current: User, version: number, mine: UserFormValues, original: UserFormValues, typedPassword: boolean): string {
  const url = `${ctx.base}/admin/users/${current.id}`
  const theirs = formValuesOf(current)
  const mineChanged = new Set(changedFields(mine, original))
  const theyChanged = new Set(changedFields(theirs, original))
  const show = (value: string | boolean): string => typeof value === 'boolean' ? (value ? 'yes' : 'no') : value === '' ? '—' : value
  const rows = FIELD_LABELS.map(([field, label]) => {
    const who = mineChanged.has(field) && theyChanged.has(field) ? 'both changed' : mineChanged.has(field) ? 'you changed' : theyChanged.has(field) ? 'they changed' : 'unchanged'
    return html`<tr${who === 'both changed' ? html` class="differs"` : ''}><th scope="row">${label}</th><td data-label="When you opened it">${show(original[field])}</td><td data-label="Your version">${show(mine[field])}</td><td data-label="Current version">${show(theirs[field])}</td><td data-label="Who changed it">${who}</td></tr>`
  })
  const merged: UserFormValues = { ...theirs }
  for (const field of mineChanged) (merged as unknown as Record<string, unknown>)[field] = mine[field]
  const hidden = FIELD_LABELS.filter(([field]) => field !== 'disabled').map(([field]) => html`<input type="hidden" name="${field}" value="${String(merged[field])}">`)
  const body = html`<h1>${current.username} was changed by someone else</h1>
<div class="warning" role="alert"><strong>Your changes were not saved.</strong> While you were editing, someone else changed this user (it is now at version ${version}). Compare the versions, then choose.</div>
<div class="table-wrap compare" role="region" aria-label="The versions compared" tabindex="0"><table class="cards">
<caption class="visually-hidden">The version you opened, your version and the current version</caption>
<thead><tr><th scope="col">Field</th><th scope="col">When you opened it</th><th scope="col">Your version</th><th scope="col">Current version</th><th scope="col">Who changed it</th></tr></thead>
<tbody>${rows}</tbody></table></div>
${typedPassword ? html`<p class="warning">The new password you typed was not kept; type it again after choosing.</p>` : ''}
<section class="panel actions">
<form method="post" action="${url}">
<input type="hidden" name="version" value="${version}">
${originalFields(theirs)}
${hidden}${merged.disabled ? html`<input type="hidden" name="disabled" value="true">` : ''}
<button type="submit">Apply my changes to the current version</button>
</form>
<a class="button secondary" href="${url}">Discard my changes</a>
</section>`
  return layout(ctx, `Conflict: ${current.username}`, 'users', body)
}

// ---------------------------------------------------------------------------
// API keys

export interface KeyFormValues { name: string, scopes: string[], expires: string }

export function apiKeysPage (ctx: ViewContext, keys: ApiKey[], includeRevoked: boolean, form: KeyFormValues, errors: FieldErrors, general?: string): string {
  const page = `${ctx.base}/admin/api-keys`
  const rows = keys.map(key => {
    const expired = key.expires_at !== null && Date.parse(key.expires_at) <= Date.now()
    const status = key.revoked_at !== null ? html`<span class="badge off">revoked</span>` : expired ? html`<span class="badge off">expired</span>` : 'active'
    return html`<tr id="key-${key.id}">
<td data-label="Name">${key.name}</td><td data-label="Prefix"><code>${key.prefix}…</code></td><td data-label="Scopes">${key.scopes.join(', ')}</td>
<td data-label="Owner">${key.user_id === null ? html`<span class="muted">deployment</span>` : html`<a href="${ctx.base}/admin/users/${key.user_id}">owner's account</a>`}</td>
<td data-label="Created">${date(key.created_at)}</td><td data-label="Expires">${key.expires_at === null ? html`<span class="muted">no expiry</span>` : date(key.expires_at)}</td><td data-label="Last used">${date(key.last_used_at)}</td><td data-label="Status">${status}</td>
<td data-label="Actions">${key.revoked_at === null
  ? html`<div class="actions">
<form method="post" action="${page}/${key.id}/rotate" data-confirm="Rotate “${key.name}”? Its current secret stops working at once." data-confirm-label="Rotate"><button type="submit" class="secondary" aria-label="Rotate ${key.name}">Rotate</button></form>
<form method="post" action="${page}/${key.id}/revoke" data-confirm="Revoke “${key.name}”? It stops working at once." data-confirm-label="Revoke"><button type="submit" class="danger" aria-label="Revoke ${key.name}">Revoke</button></form></div>`
  : ''}</td></tr>`
  })
  const scopeHints: Record<string, string> = { admin: 'everything', 'users:read': 'list and read users', 'users:write': 'create, change and delete users (not admins)', 'events:read': 'read the event log', 'webhooks:manage': 'manage webhooks' }
  const body = html`<h1>API keys</h1>
<section class="panel" aria-labelledby="new-key"><h2 id="new-key">Create a key</h2>
${errorSummary(errors, general)}
<form method="post" action="${page}" novalidate>
<div class="grid">
${input('name', 'Name', form.name, errors, { required: true, hint: 'What the key is for, e.g. nightly export.', autocomplete: 'off' })}
${input('expires_at', 'Expires (UTC)', form.expires, errors, { type: 'datetime-local', hint: 'Empty: the key never expires.' })}
</div>
<fieldset aria-describedby="scopes-hint"><legend>Scopes</legend>
${SCOPES.map(scope => html`<label class="check"><input type="checkbox" name="scopes" value="${scope}"${form.scopes.includes(scope) ? html` checked` : ''}> <code>${scope}</code> <span class="muted">${scopeHints[scope] ?? ''}</span></label>`)}
<p class="hint" id="scopes-hint">None ticked: <code>admin</code>, the access of the main API's keys.</p>
</fieldset>
<button type="submit">Create key</button>
</form></section>
<div class="section-head"><h2>Keys</h2><a href="${page}${includeRevoked ? '' : '?include_revoked=true'}">${includeRevoked ? 'Hide revoked keys' : 'Show revoked keys'}</a></div>
${keys.length === 0
  ? html`<p class="panel">No keys.</p>`
  : html`<div class="table-wrap" role="region" aria-label="API keys" tabindex="0"><table class="cards">
<caption class="visually-hidden">API keys, oldest first</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Prefix</th><th scope="col">Scopes</th><th scope="col">Owner</th><th scope="col">Created</th><th scope="col">Expires</th><th scope="col">Last used</th><th scope="col">Status</th><th scope="col">Actions</th></tr></thead>
<tbody>${rows}</tbody></table></div>`}`
  return layout(ctx, 'API keys', 'api-keys', body)
}

export function secretPage (ctx: ViewContext, key: ApiKeyWithSecret, rotated: boolean): string {
  const body = html`<h1>${rotated ? 'New secret for' : 'Key created:'} ${key.name}</h1>
<div class="warning" role="alert"><strong>Copy the secret now.</strong> It is shown only this once: gatehouse keeps only a digest of it. ${rotated ? 'The previous secret has stopped working.' : ''}</div>
<section class="panel" aria-labelledby="secret-label">
<p id="secret-label"><strong>Secret</strong></p>
<div class="secret"><code id="secret">${key.key}</code><button type="button" data-copy="secret" hidden>Copy</button></div>
<dl class="facts">
<dt>ID</dt><dd><code>${key.id}</code></dd>
<dt>Scopes</dt><dd>${key.scopes.join(', ')}</dd>
<dt>Expires</dt><dd>${key.expires_at === null ? 'never' : date(key.expires_at)}</dd>
</dl>
<p class="hint">Send it as <code>Authorization: Bearer</code>, <code>X-API-Key</code> or <code>?API_KEY=</code>.</p>
</section>
<p><a href="${ctx.base}/admin/api-keys">Back to the keys</a></p>`
  return layout(ctx, 'Key secret', 'api-keys', body)
}

// ---------------------------------------------------------------------------
// Events

export interface EventsView {
  events: Event[]
  names: PartyNames
  /** The filters as typed, to show again and to keep in the paging links. */
  filter: EventsFilterValues
  errors: FieldErrors
  /** Why nothing is listed although the filters are valid (a username no user has). */
  unmatched: string[]
  cursor: string | undefined
  nextCursor: string | undefined
}

export function eventsPage (ctx: ViewContext, view: EventsView): string {
  const page = `${ctx.base}/admin/events`
  const f = view.filter
  const filters = { type: f.type, actor: f.actor, target: f.target, from: f.from, to: f.to }
  const filtered = Object.values(filters).some(v => v !== '')
  const body = html`<h1>Events</h1>
${Object.keys(view.errors).length === 0 ? '' : html`<div class="error" role="alert" id="form-errors"><strong>These filters cannot be used.</strong><ul>${Object.entries(view.errors).map(([name, detail]) => html`<li><a href="#${name}">${EVENT_FILTER_LABELS[name] ?? name}</a> ${detail}</li>`)}</ul></div>`}
<form class="panel filters roomy" method="get" action="${page}" role="search" aria-label="Filter events">
<div class="field"><label for="type">Type</label><select id="type" name="type">${options([['', 'Any'], ...EVENT_TYPES.map(t => [t, t] as const)], f.type)}</select></div>
${input('actor', 'Actor', f.actor, view.errors, { filter: true, autocomplete: 'off', hint: 'Who did it: a username or an id.' })}
${input('target', 'Target', f.target, view.errors, { filter: true, autocomplete: 'off', hint: 'Done to: a username or an id.' })}
${input('from', 'From (UTC)', f.from, view.errors, { filter: true, type: 'datetime-local', hint: 'At or after this time.' })}
${input('to', 'To (UTC)', f.to, view.errors, { filter: true, type: 'datetime-local', hint: 'Before this time.' })}
<div class="field actions"><button type="submit">Apply</button>${filtered ? html`<a href="${page}">Clear</a>` : ''}</div>
</form>
${view.unmatched.length > 0
  ? html`<div class="warning" role="status" id="unmatched"><strong>No events listed.</strong> ${view.unmatched.join(' ')} A deleted user's events are found by their id.</div>`
  : eventsTable(ctx, view.events, filtered ? 'Events matching the filters' : 'Events', view.names)}
<nav class="pager" aria-label="Pages">
${view.cursor !== undefined ? html`<a href="${page}${queryOf(filters)}">Newest</a>` : ''}
${view.nextCursor !== undefined ? html`<a href="${page}${queryOf({ ...filters, cursor: view.nextCursor })}" rel="next">Older events</a>` : ''}
</nav>`
  return layout(ctx, 'Events', 'events', body)
}

const EVENT_FILTER_LABELS: Record<string, string> = { actor: 'Actor', target: 'Target', from: 'From (UTC)', to: 'To (UTC)' }

// ---------------------------------------------------------------------------
// Webhooks

const DISABLED_REASONS: Record<string, string> = {
  manual: 'disabled by an admin',
  gone: 'disabled: the receiver answered 410 Gone',
  failing: 'disabled: it kept failing for longer than the retry horizon'
}

function webhookStatus (webhook: Webhook): SafeHtml {
  if (!webhook.enabled) return html`<span class="badge off">disabled</span> <span class="muted">${DISABLED_REASONS[webhook.disabled_reason ?? 'manual'] ?? ''}</span>`
  return webhook.failing_since !== null ? html`enabled <span class="badge locked">failing</span>` : html`enabled`
}

function eventTypesOf (webhook: Webhook): SafeHtml[] {
  return webhook.event_types.map((t, i) => html`${i > 0 ? ', ' : ''}<code>${t}</code>`)
}

export function webhooksPage (ctx: ViewContext, webhooks: Webhook[], form: WebhookFormValues, errors: FieldErrors, general?: string): string {
  const page = `${ctx.base}/admin/webhooks`
  const rows = webhooks.map(w => html`<tr>
<td data-label="URL" class="data"><a href="${page}/${w.id}">${w.url}</a></td>
<td data-label="Event types">${eventTypesOf(w)}</td>
<td data-label="Status">${webhookStatus(w)}</td>
<td data-label="Failing since">${w.failing_since === null ? html`<span class="muted">—</span>` : date(w.failing_since)}</td>
<td data-label="Description" class="data">${w.description ?? ''}</td>
<td data-label="Created">${date(w.created_at)}</td>
</tr>`)
  const body = html`<h1>Webhooks</h1>
<p>Endpoints that receive events as signed HTTP posts (Standard Webhooks). See docs/webhooks.md for the format and how to verify a signature.</p>
<section class="panel" aria-labelledby="new-webhook"><h2 id="new-webhook">Add an endpoint</h2>
${errorSummary(errors, general)}
<form method="post" action="${page}" novalidate>
${input('url', 'URL', form.url, errors, { type: 'url', required: true, autocomplete: 'off', hint: 'Where deliveries are posted: http or https. Internal addresses (loopback, private networks) are refused unless WEBHOOK_ALLOW_PRIVATE is set.' })}
<div class="grid">
${input('event_types', 'Event types', form.event_types, errors, { autocomplete: 'off', hint: 'Separated by commas: exact types (user.created), a prefix (user.*), or * for every event. Empty: every event.' })}
${input('description', 'Description', form.description, errors, { autocomplete: 'off', hint: 'What the endpoint is for.' })}
</div>
<button type="submit">Add endpoint</button>
</form></section>
<h2>Endpoints</h2>
${webhooks.length === 0
  ? html`<p class="panel">No endpoints yet.</p>`
  : html`<div class="table-wrap" role="region" aria-label="Webhook endpoints" tabindex="0"><table class="cards">
<caption class="visually-hidden">Webhook endpoints, oldest first</caption>
<thead><tr><th scope="col">URL</th><th scope="col">Event types</th><th scope="col">Status</th><th scope="col">Failing since</th><th scope="col">Description</th><th scope="col">Created</th></tr></thead>
<tbody>${rows}</tbody></table></div>`}`
  return layout(ctx, 'Webhooks', 'webhooks', body)
}

export function webhookSecretPage (ctx: ViewContext, webhook: WebhookWithSecret, rotated: boolean): string {
  const page = `${ctx.base}/admin/webhooks/${webhook.id}`
  const body = html`<h1>${rotated ? 'New signing secret' : 'Endpoint added'}</h1>
<div class="warning" role="alert"><strong>Copy the signing secret now.</strong> It is shown only this once; the receiver needs it to verify signatures. ${rotated && webhook.previous_secret_expires_at !== null ? html`Deliveries are also signed with the previous secret until ${date(webhook.previous_secret_expires_at)}.` : ''}</div>
<section class="panel" aria-labelledby="secret-label">
<p id="secret-label"><strong>Signing secret</strong></p>
<div class="secret"><code id="secret">${webhook.secret}</code><button type="button" data-copy="secret" hidden>Copy</button></div>
<dl class="facts">
<dt>URL</dt><dd>${webhook.url}</dd>
${webhook.description !== null ? html`<dt>Description</dt><dd>${webhook.description}</dd>` : ''}
<dt>Event types</dt><dd>${eventTypesOf(webhook)}</dd>
<dt>ID</dt><dd><code>${webhook.id}</code></dd>
</dl>
</section>
<p><a href="${page}">Open the endpoint</a> · <a href="${ctx.base}/admin/webhooks">Back to the webhooks</a></p>`
  return layout(ctx, 'Webhook secret', 'webhooks', body)
}

export interface WebhookView {
  webhook: Webhook
  deliveries: WebhookDelivery[]
  status: string | undefined
  cursor: string | undefined
  nextCursor: string | undefined
  attempts: WebhookAttempt[]
  attemptsCursor: string | undefined
  nextAttemptsCursor: string | undefined
  /** The answer to a ping sent just now. */
  ping?: WebhookTestResult | undefined
}

function outcome (status: string): SafeHtml {
  return status === 'delivered' ? html`delivered` : status === 'failed' ? html`<span class="badge off">failed</span>` : html`<span class="badge locked">pending</span>`
}

function pingResult (ping: WebhookTestResult): SafeHtml {
  const answer = ping.status_code !== null ? `answered ${ping.status_code}` : 'got no answer'
  return ping.ok
    ? html`<div class="notice" role="status" id="ping-result"><strong>Ping delivered:</strong> the receiver ${answer} in ${ping.latency_ms} ms (webhook-id <code>${ping.webhook_id}</code>).</div>`
    : html`<div class="error" role="alert" id="ping-result"><strong>Ping failed:</strong> the receiver ${answer} after ${ping.latency_ms} ms${ping.error !== null ? html`: ${ping.error}` : ''} (webhook-id <code>${ping.webhook_id}</code>).</div>`
}

export function webhookPage (ctx: ViewContext, view: WebhookView): string {
  const { webhook } = view
  const url = `${ctx.base}/admin/webhooks/${webhook.id}`
  const statuses = [['', 'Any'], ['pending', 'Pending'], ['delivered', 'Delivered'], ['failed', 'Failed']] as const
  const deliveryRows = view.deliveries.map(d => html`<tr>
<td data-label="Event"><code>${d.event_type ?? 'deleted event'}</code><br><code>${d.event_id}</code></td>
<td data-label="Status">${outcome(d.status)}</td>
<td data-label="Attempts">${d.attempts}</td>
<td data-label="Last attempt">${date(d.last_attempt_at)}${d.last_status_code !== null ? html`<br>answered ${d.last_status_code}` : ''}${d.last_error !== null ? html`<br><span class="muted">${d.last_error}</span>` : ''}</td>
<td data-label="Next attempt">${d.next_attempt_at === null ? html`<span class="muted">—</span>` : date(d.next_attempt_at)}</td>
<td data-label="Actions">${d.status !== 'delivered'
  ? html`<form method="post" action="${url}/deliveries/${d.event_id}/retry"><button type="submit" class="secondary" aria-label="Retry ${d.event_type ?? ''} ${d.event_id}">Retry</button></form>`
  : ''}</td>
</tr>`)
  const attemptRows = view.attempts.map(a => html`<tr>
<td data-label="When">${date(a.attempted_at)}</td>
<td data-label="Event"><code>${a.event_type ?? 'deleted event'}</code><br><code>${a.event_id}</code></td>
<td data-label="Outcome">${a.succeeded ? 'succeeded' : html`<span class="badge off">failed</span>`}</td>
<td data-label="Status code">${a.status_code ?? html`<span class="muted">none</span>`}</td>
<td data-label="Latency">${a.latency_ms} ms</td>
<td data-label="Error" class="data">${a.error ?? ''}</td>
<td data-label="Next attempt">${a.next_attempt_at === null ? html`<span class="muted">—</span>` : date(a.next_attempt_at)}</td>
</tr>`)
  const body = html`<h1>${webhook.url} ${webhook.enabled ? '' : html`<span class="badge off">disabled</span>`}</h1>
${view.ping !== undefined ? pingResult(view.ping) : ''}
<section class="panel" aria-labelledby="facts-title"><h2 id="facts-title">Endpoint</h2>
<dl class="facts">
<dt>URL</dt><dd>${webhook.url}</dd>
<dt>Description</dt><dd>${webhook.description ?? html`<span class="muted">none</span>`}</dd>
<dt>Event types</dt><dd>${eventTypesOf(webhook)}</dd>
<dt>Status</dt><dd>${webhookStatus(webhook)}</dd>
<dt>Failing since</dt><dd>${webhook.failing_since === null ? 'not failing' : date(webhook.failing_since)}</dd>
<dt>Previous secret</dt><dd>${webhook.previous_secret_expires_at === null ? 'none' : html`also signs until ${date(webhook.previous_secret_expires_at)}`}</dd>
<dt>ID</dt><dd><code>${webhook.id}</code></dd>
<dt>Created</dt><dd>${date(webhook.created_at)}</dd>
</dl></section>
<section class="panel" aria-labelledby="actions-title"><h2 id="actions-title">Actions</h2>
<div class="actions">
<form method="post" action="${url}/ping"><button type="submit">Send a test ping</button></form>
${webhook.enabled
  ? html`<form method="post" action="${url}/disable" data-confirm="Disable the endpoint ${webhook.url}? Nothing is sent to it until it is enabled again; new events still queue." data-confirm-label="Disable"><button type="submit" class="secondary">Disable</button></form>`
  : html`<form method="post" action="${url}/enable"><button type="submit" class="secondary">Enable</button></form>`}
<form method="post" action="${url}/rotate" data-confirm="Rotate the signing secret of ${webhook.url}? The new secret is shown once." data-confirm-label="Rotate"><button type="submit" class="secondary">Rotate secret</button></form>
<a class="button danger" href="${url}/delete">Delete…</a>
</div>
<p class="hint">The ping is a signed <code>webhook.ping</code> sent now; it is not queued, retried or listed below. Disabling keeps queuing events; enabling sends them. After a rotation the old secret also signs deliveries for a while, so the receiver can switch.</p>
</section>
<section><h2 id="deliveries-title">Deliveries</h2>
<form class="panel filters" method="get" action="${url}" aria-label="Filter deliveries">
<div class="field"><label for="status">Status</label><select id="status" name="status">${options(statuses, view.status ?? '')}</select></div>
<div class="field actions"><button type="submit">Apply</button>${view.status !== undefined ? html`<a href="${url}">Clear</a>` : ''}</div>
</form>
${view.deliveries.length === 0
  ? html`<p class="panel">No deliveries${view.status !== undefined ? ` with status ${view.status}` : ''}.</p>`
  : html`<div class="table-wrap" role="region" aria-label="Deliveries" tabindex="0"><table class="cards">
<caption class="visually-hidden">Deliveries, newest event first</caption>
<thead><tr><th scope="col">Event</th><th scope="col">Status</th><th scope="col">Attempts</th><th scope="col">Last attempt</th><th scope="col">Next attempt</th><th scope="col">Actions</th></tr></thead>
<tbody>${deliveryRows}</tbody></table></div>`}
<nav class="pager" aria-label="Delivery pages">
${view.cursor !== undefined ? html`<a href="${url}${queryOf({ status: view.status })}">Newest deliveries</a>` : ''}
${view.nextCursor !== undefined ? html`<a href="${url}${queryOf({ status: view.status, cursor: view.nextCursor })}" rel="next">Older deliveries</a>` : ''}
</nav>
</section>
<section><h2 id="attempts-title">Recent attempts</h2>
${view.attempts.length === 0
  ? html`<p class="panel">No attempts yet.</p>`
  : html`<div class="table-wrap" role="region" aria-label="Attempts" tabindex="0"><table class="cards">
<caption class="visually-hidden">Delivery attempts, newest first</caption>
<thead><tr><th scope="col">When</th><th scope="col">Event</th><th scope="col">Outcome</th><th scope="col">Status code</th><th scope="col">Latency</th><th scope="col">Error</th><th scope="col">Next attempt</th></tr></thead>
<tbody>${attemptRows}</tbody></table></div>`}
<nav class="pager" aria-label="Attempt pages">
${view.attemptsCursor !== undefined ? html`<a href="${url}${queryOf({ status: view.status, cursor: view.cursor })}">Newest attempts</a>` : ''}
${view.nextAttemptsCursor !== undefined ? html`<a href="${url}${queryOf({ status: view.status, cursor: view.cursor, attempts_cursor: view.nextAttemptsCursor })}">Older attempts</a>` : ''}
</nav>
</section>`
  return layout(ctx, `Webhook ${webhook.url}`, 'webhooks', body)
}

export function deleteWebhookPage (ctx: ViewContext, webhook: Webhook): string {
  const url = `${ctx.base}/admin/webhooks/${webhook.id}`
  const body = html`<h1>Delete the endpoint ${webhook.url}?</h1>
<section class="panel">
<p>This deletes the webhook endpoint <strong class="wrap">${webhook.url}</strong>${webhook.description !== null ? html` (${webhook.description})` : ''}, id <code>${webhook.id}</code>, with its queued deliveries and attempt history. Deliveries already in flight may still arrive. It cannot be undone; the event log keeps a record.</p>
<form method="post" action="${url}/delete" class="actions">
<button type="submit" class="danger">Delete this endpoint</button>
<a href="${url}">Cancel</a>
</form></section>`
  return layout(ctx, 'Delete a webhook endpoint', 'webhooks', body)
}

// ---------------------------------------------------------------------------
// Refusals and errors

export function errorPage (ctx: ViewContext, title: string, message: string, extra?: SafeHtml): string {
  return layout(ctx, title, undefined, html`<h1>${title}</h1><div class="error" role="alert">${message}</div>${extra ?? ''}
<p><a href="${ctx.base}/admin">Back to the console</a></p>`)
}

/** `needsSecondFactor`: the account is an admin, but this session's sign-in had no second factor and MFA_REQUIRED asks for one. */
export function notAdminPage (ctx: ViewContext, username: string, needsSecondFactor = false): string {
  const reason = needsSecondFactor
    ? html`You are signed in as <strong>${username}</strong>, an admin, but this session was opened without a second factor, and this deployment requires one for admin rights. Sign out, then sign in again with your authenticator app, a passkey or a recovery code.`
    : html`You are signed in as <strong>${username}</strong>, who does not have the admin role. The console is for admins; ask one to make you an admin, or sign in as one.`
  return layout({ ...ctx, username: undefined }, 'Not an admin', undefined, html`<h1>Admins only</h1>
<div class="error" role="alert">${reason}</div>
<form method="post" action="${ctx.base}/logout"><button type="submit">Sign out</button></form>`)
}

export interface GroupsListView {
  groups: Group[]
  q: string | undefined
  cursor: string | undefined
  nextCursor: string | undefined
  /** The create form as sent, and what is wrong with it. */
  form: { display_name: string }
  errors: FieldErrors
}

export function groupsPage (ctx: ViewContext, view: GroupsListView): string {
  const list = `${ctx.base}/admin/groups`
  const filters = { q: view.q }
  const rows = view.groups.map(group => html`<tr>
<td data-label="Name"><a href="${list}/${group.id}">${group.display_name}</a></td>
<td data-label="Members">${group.member_count}</td>
<td data-label="External id" class="data">${group.external_id ?? ''}</td>
<td data-label="Changed">${date(group.updated_at)}</td>
<td data-label="ID" class="id">${group.id}</td>
</tr>`)
  const body = html`<h1>Groups</h1>
<p>Each member's <strong>Groups</strong> holds the group's name: renaming or deleting a group changes every member.</p>
<section class="panel" aria-labelledby="new-group"><h2 id="new-group">Create a group</h2>
${errorSummary(view.errors, undefined)}
<form method="post" action="${list}" novalidate>
${input('display_name', 'Name', view.form.display_name, view.errors, { required: true, autocomplete: 'off', hint: '1 to 64 characters; unique ignoring case.' })}
<button type="submit">Create group</button>
</form></section>
<form class="panel filters" method="get" action="${list}" role="search" aria-label="Find groups">
<div class="field wide"><label for="q">Search</label><input id="q" name="q" type="search" value="${view.q ?? ''}" aria-describedby="q-hint"><p class="hint" id="q-hint">Part of a group's name; case does not matter.</p></div>
<div class="field actions"><button type="submit">Apply</button>${view.q !== undefined ? html`<a href="${list}">Clear</a>` : ''}</div>
</form>
${view.groups.length === 0
  ? html`<p class="panel">${view.q !== undefined ? 'No group matches this search.' : 'There are no groups yet.'}</p>`
  : html`<div class="table-wrap" role="region" aria-label="Groups" tabindex="0"><table class="cards">
<caption class="visually-hidden">Groups${view.q !== undefined ? ' matching the search' : ''}, by name, with their member counts</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Members</th><th scope="col">External id</th><th scope="col">Changed</th><th scope="col">ID</th></tr></thead>
<tbody>${rows}</tbody></table></div>`}
<nav class="pager" aria-label="Pages">
${view.cursor !== undefined ? html`<a href="${list}${queryOf(filters)}">First page</a>` : ''}
${view.nextCursor !== undefined ? html`<a href="${list}${queryOf({ ...filters, cursor: view.nextCursor })}" rel="next">Next page</a>` : ''}
</nav>`
  return layout(ctx, 'Groups', 'groups', body)
}

export interface GroupView {
  group: Group
  version: number
  members: User[]
  cursor: string | undefined
  nextCursor: string | undefined
  /** The rename and add-member forms as sent, and what is wrong with them. */
  form: { display_name: string, username: string }
  errors: FieldErrors
}

export function groupPage (ctx: ViewContext, view: GroupView): string {
  const page = `${ctx.base}/admin/groups/${view.group.id}`
  const users = `${ctx.base}/admin/users`
  const { group } = view
  const rows = view.members.map(user => html`<tr>
<td data-label="Username"><a href="${users}/${user.id}">${user.username}</a></td>
<td data-label="Name">${[user.first_name, user.last_name].filter(Boolean).join(' ')}</td>
<td data-label="Role">${user.role === 'admin' ? html`<span class="badge admin">admin</span>` : 'user'}</td>
<td data-label="Status">${user.disabled ? html`<span class="badge off">disabled</span>` : 'enabled'}</td>
<td data-label="Actions"><form method="post" action="${page}/members/${user.id}/remove" data-confirm="Take ${user.username} out of “${group.display_name}”?" data-confirm-label="Remove"><button type="submit" class="secondary" aria-label="Remove ${user.username} from the group">Remove</button></form></td>
</tr>`)
  const body = html`<div class="actions"><h1>Group ${group.display_name}</h1>
<form method="post" action="${page}/delete" data-confirm="Delete the group “${group.display_name}”? Its name leaves the groups of its ${group.member_count} member${group.member_count === 1 ? '' : 's'}." data-confirm-label="Delete"><button type="submit" class="danger">Delete group</button></form></div>
<dl class="facts"><dt>Members</dt><dd>${group.member_count}</dd><dt>External id</dt><dd>${group.external_id ?? html`<span class="muted">none</span>`}</dd><dt>Created</dt><dd>${date(group.created_at)}</dd><dt>Changed</dt><dd>${date(group.updated_at)}</dd><dt>ID</dt><dd class="id">${group.id}</dd></dl>
${errorSummary(view.errors, undefined)}
<div class="grid">
<section class="panel" aria-labelledby="rename"><h2 id="rename">Rename</h2>
<form method="post" action="${page}" novalidate>
<input type="hidden" name="version" value="${view.version}">
${input('display_name', 'Name', view.form.display_name, view.errors, { required: true, autocomplete: 'off', hint: 'Every member\'s groups change with it.' })}
<button type="submit">Rename group</button>
</form></section>
<section class="panel" aria-labelledby="add-member"><h2 id="add-member">Add a member</h2>
<form method="post" action="${page}/members" novalidate>
${input('username', 'Username', view.form.username, view.errors, { required: true, autocomplete: 'off', hint: 'The user\'s username or id.' })}
<button type="submit">Add member</button>
</form></section>
</div>
<h2>Members</h2>
${view.members.length === 0
  ? html`<p class="panel">${view.cursor !== undefined ? 'No more members.' : 'This group has no members.'}</p>`
  : html`<div class="table-wrap" role="region" aria-label="Members" tabindex="0"><table class="cards">
<caption class="visually-hidden">Members of ${group.display_name}, by username</caption>
<thead><tr><th scope="col">Username</th><th scope="col">Name</th><th scope="col">Role</th><th scope="col">Status</th><th scope="col">Actions</th></tr></thead>
<tbody>${rows}</tbody></table></div>`}
<nav class="pager" aria-label="Pages">
${view.cursor !== undefined ? html`<a href="${page}">First page</a>` : ''}
${view.nextCursor !== undefined ? html`<a href="${page}${queryOf({ cursor: view.nextCursor })}" rel="next">Next page</a>` : ''}
</nav>`
  return layout(ctx, `Group ${group.display_name}`, 'groups', body)
}
