import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext, sessionCookieOf } from '../auth/auth.plugin.ts'
import type { Principal } from '../auth/principal.ts'
import { AppError } from '../errors.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { smallPage } from '../lib/page-style.ts'
import { sameOriginRedirect } from '../lib/redirect.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import { type SessionsDeps, type SignIn } from '../sessions/sessions.types.ts'
import { authenticateSession, changeOwnPassword, endOtherOwnSessions, endOwnSession, listOwnSessions } from '../sessions/sessions.service.ts'
import { signInText, type SessionSummary } from '../sessions/sessions.schemas.ts'
import type { PasskeyCredential, TotpSetup } from './mfa.schemas.ts'
import { completeSignIn, passkeySignIn } from '../sign-in/second-step.flow.ts'
import { cancelTotpSetup, confirmTotp, describeChallenge, finishPasskeyRegistration, mfaStatus, pendingTotpSetup, regenerateRecoveryCodes, removeTotp, startTotp, startTotpForChallenge, type MfaPending } from './mfa.service.ts'
import type { MfaProof } from './factor-proofs.ts'
import { assertRecentAuthentication, reauthenticate, reauthMethods, type ReauthProof } from './reauthentication.service.ts'
import { relyingParty } from './mfa.http.ts'
import { sendEmailVerification } from '../email-verification/email-verification.service.ts'
import { getUser } from '../users/users.service.ts'

const STYLE = `body{font:16px/1.5 system-ui,sans-serif;margin:0;min-height:100vh;display:grid;place-items:center;background:#f4f5f7;color:#1b1d21}
main{background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002;width:min(26rem,90vw)}
h1{font-size:1.4rem;margin:0 0 1rem}h2{font-size:1.1rem;margin:1.4rem 0 .4rem}label{display:block;margin:.8rem 0 .2rem;font-weight:600}
input{width:100%;box-sizing:border-box;padding:.55rem;border:1px solid #8a8f98;border-radius:4px;font:inherit}
input:focus,button:focus,a:focus{outline:3px solid #2f6fde;outline-offset:1px}
button{margin-top:1rem;width:100%;padding:.6rem;border:0;border-radius:4px;background:#1f5fcf;color:#fff;font:inherit;font-weight:600;cursor:pointer}
button.secondary{background:#fff;color:#1f5fcf;border:2px solid #1f5fcf}a{color:#1f5fcf;font-weight:600}
.error{background:#fde8e8;color:#8a1c1c;border:1px solid #e5a3a3;padding:.6rem;border-radius:4px}
.qr svg{display:block;width:12rem;height:12rem;margin:0 auto}code{font-size:1.05rem;word-break:break-all}
ol.codes{columns:2;font-family:monospace;font-size:1.05rem}
.notice{background:#e8f3e8;color:#1c4d1c;border:1px solid #9cc99c;padding:.6rem;border-radius:4px}
section.reauth{border:2px solid #1f5fcf;border-radius:6px;padding:0 1rem 1rem;margin:1rem 0}
.actions{display:flex;gap:.5rem}.actions button{flex:1}
ul.sessions{list-style:none;padding:0;margin:0}ul.sessions li{border-top:1px solid #d5d8dd;padding:.6rem 0}.meta{color:#4a4f57;font-size:.9rem}
ul.sessions button{margin-top:.4rem;width:auto;padding:.3rem 1rem}`
const STYLE_HASH = createHash('sha256').update(STYLE).digest('base64')
/** Scripts only from here (the passkey helper and its library), fetches only to here, forms only to here. */
const CSP = `default-src 'none'; style-src 'sha256-${STYLE_HASH}'; script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`

const PAGE_SCRIPT = readFileSync(new URL('./assets/mfa.js', import.meta.url), 'utf8')
// The package exports only its modules; the browser bundle sits beside them.
const WEBAUTHN_BUNDLE = readFileSync(new URL('../dist/bundle/index.umd.min.js', `file://${createRequire(import.meta.url).resolve('@simplewebauthn/browser')}`), 'utf8')

function layout (basePath: string, title: string, body: string, error?: string): string {
  const alert = error !== undefined ? `<p class="error" role="alert" id="error">${escapeHtml(error)}</p>\n` : ''
  return smallPage({
    title,
    style: STYLE,
    htmlAttributes: ` data-base="${escapeHtml(basePath)}"`,
    head: `<script src="${basePath}/assets/webauthn.js" defer></script>
<script src="${basePath}/assets/mfa.js" defer></script>
`,
    body: `${alert}${body}
<p id="passkey-status" role="status"></p>
`
  })
}

/** A stored time as the pages show it: "2026-11-24 16:05 UTC". */
function pageTime (iso: string): string {
  return `<time datetime="${escapeHtml(iso)}">${escapeHtml(iso.slice(0, 16).replace('T', ' '))} UTC</time>`
}

function send (reply: FastifyReply, status: number, html: string): FastifyReply {
  return sendHtmlPage(reply, status, html, CSP)
}

function field (body: unknown, name: string, max = 2048): string {
  const value = (body as Record<string, unknown> | null)?.[name]
  return typeof value === 'string' && value.length <= max ? value : ''
}

function hidden (name: string, value: string | undefined): string {
  return value === undefined ? '' : `<input type="hidden" name="${name}" value="${escapeHtml(value)}">\n`
}

/** The base32 key in groups of four, as authenticator apps accept it typed (they ignore the spaces). */
export function groupedKey (secret: string): string {
  return secret.replace(/=+$/, '').match(/.{1,4}/g)?.join(' ') ?? ''
}

function totpBlock (setup: TotpSetup): string {
  return `<p>Scan this code with your authenticator app, or type the key below into it.</p>
<div class="qr" id="totp-qr">${setup.qr_svg}</div>
<p>Key: <code id="totp-secret">${escapeHtml(groupedKey(setup.secret))}</code></p>
`
}

function stepPage (basePath: string, pending: Pick<MfaPending, 'challengeToken' | 'methods' | 'enrol'>, next: string | undefined, setup: TotpSetup | undefined, error?: string): string {
  const codeLabel = pending.enrol
    ? 'Code from the app'
    : pending.methods.includes('totp') ? 'Code from your authenticator app, or a recovery code' : 'Recovery code'
  const wantsCode = pending.enrol ? setup !== undefined : pending.methods.some(m => m === 'totp' || m === 'recovery_code')
  const intro = pending.enrol
    ? '<p>This account needs a second factor. Set one up now: an authenticator app, or a passkey.</p>\n'
    : ''
  const passkeyButton = pending.methods.includes('passkey')
    ? `<button type="button" class="secondary" data-passkey="challenge" hidden>${pending.enrol ? 'Register a passkey' : 'Use a passkey'}</button>\n`
    : ''
  return layout(basePath, pending.enrol ? 'Set up a second factor' : 'Second step', `${intro}<form method="post" action="${basePath}/login/mfa">
${hidden('challenge_token', pending.challengeToken)}${hidden('next', next)}<input type="hidden" name="passkey" value="">
${setup !== undefined ? totpBlock(setup) : ''}${wantsCode
    ? `<label for="code">${codeLabel}</label>
<input id="code" name="code" autocomplete="one-time-code" autofocus>
<button type="submit">Continue</button>
`
    : ''}${passkeyButton}</form>`, error)
}

function codesPage (basePath: string, codes: string[], continueTo: string): string {
  return layout(basePath, 'Recovery codes', `<p>Keep these ten codes somewhere safe. Each one signs you in once if you lose your authenticator app or passkey. They are shown only now.</p>
<ol class="codes" id="recovery-codes">
${codes.map(c => `<li><code>${escapeHtml(c)}</code></li>`).join('\n')}
</ol>
<div class="actions"><button type="button" class="secondary" id="copy-codes" hidden>Copy</button><button type="button" class="secondary" id="download-codes" hidden>Download</button></div>
<p id="codes-status" role="status"></p>
<p><a href="${escapeHtml(continueTo)}" id="continue">Continue</a></p>`)
}

/** The methods a pending sign-in offers, as the page shows them; a TOTP set-up is made for an enrolment that can use one. */
export async function sendMfaStep (app: FastifyTypeBox, deps: SessionsDeps, reply: FastifyReply, pending: MfaPending, next: string | undefined, status = 200, error?: string): Promise<FastifyReply> {
  const setup = pending.enrol && pending.methods.includes('totp') ? await startTotpForChallenge(deps, pending.challengeToken) : undefined
  return send(reply, status, stepPage(app.config.basePath, pending, next, setup, error))
}

function parseCredential (json: string): PasskeyCredential {
  try {
    return JSON.parse(json) as PasskeyCredential
  } catch {
    throw new AppError('mfa_failed', 401, 'The passkey answer was not JSON.')
  }
}

/** The browser's session, for the account pages; they have no other credential. */
async function pagePrincipal (deps: SessionsDeps, request: FastifyRequest): Promise<Principal | undefined> {
  const token = sessionCookieOf(request)
  const principal = token !== undefined && token !== '' ? await authenticateSession(deps, token) : undefined
  if (principal?.user == null) return undefined
  request.principal = principal
  return principal
}

/**
 * The browser's side of second factors: the second sign-in step, sign-in with
 * a passkey, and the account page where a signed-in user enrols and removes
 * factors. Everything goes through the same services as the API.
 */
/** The second-factor pages: a plugin of its own, registered by sessions/sign-in.plugin.ts after the factors' API. */
export default async function mfaPages (app: FastifyTypeBox, deps: SessionsDeps): Promise<void> {
  const basePath = app.config.basePath
  const form = { schema: { hide: true }, config: { accepts: ['application/x-www-form-urlencoded'] } }
  // Sign-in and password forms: a secret in the query string is refused (lib/http.ts secretsInBody).
  const secretForm = { ...form, config: { ...form.config, secretsInBody: true } }
  // As the sign-in page decides: the web UI's start page if configured, else the signed-in page.
  const afterSignIn = (next: string | undefined): string => next ?? app.config.loginDefaultNext ?? `${basePath}/login`
  const accountPath = `${basePath}/account`

  const signedIn = async (request: FastifyRequest, reply: FastifyReply, result: SignIn, next: string | undefined, codes?: string[]): Promise<FastifyReply> => {
    setSignInCookies(request, reply, result, app.config)
    if (codes !== undefined) return send(reply, 200, codesPage(basePath, codes, afterSignIn(next)))
    return await reply.code(303).header('Location', afterSignIn(next)).send()
  }

  app.get('/assets/mfa.js', { schema: { hide: true } }, async (_request, reply) => reply.type('text/javascript; charset=utf-8').send(PAGE_SCRIPT))
  app.get('/assets/webauthn.js', { schema: { hide: true } }, async (_request, reply) => reply.type('text/javascript; charset=utf-8').send(WEBAUTHN_BUNDLE))

  app.post('/login/mfa', secretForm, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const next = sameOriginRedirect(field(request.body, 'next'))
    const token = field(request.body, 'challenge_token', 64)
    const code = field(request.body, 'code', 64).replace(/\s/g, '')
    const passkey = field(request.body, 'passkey', 32_768)
    const proof: MfaProof = passkey !== '' ? { passkey: parseCredential(passkey) } : /^\d{6}$/.test(code) ? { totpCode: code } : { recoveryCode: code }
    try {
      if (passkey === '' && code === '') throw new AppError('mfa_failed', 401, 'no code')
      const result = await completeSignIn(deps, sessionContext(request), token, proof, relyingParty(request, app.config))
      return await signedIn(request, reply, result.signIn, next, result.recoveryCodes)
    } catch (error) {
      if (!(error instanceof AppError)) throw error
      const pending = await describeChallenge(deps, token)
      if (error.code === 'rate_limited') {
        for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
        const message = 'Too many wrong codes. Wait a few minutes, then try again.'
        return pending === undefined
          ? send(reply, 429, layout(basePath, 'Second step', `<p><a href="${basePath}/login">Sign in again</a></p>`, message))
          : send(reply, 429, stepPage(basePath, pending, next, undefined, message))
      }
      if (error.code !== 'mfa_failed') throw error
      if (pending === undefined) {
        return send(reply, 401, layout(basePath, 'Second step', `<p><a href="${basePath}/login">Sign in again</a></p>`, 'This sign-in has expired. Sign in again.'))
      }
      return await sendMfaStep(app, deps, reply, pending, next, 401,
        pending.enrol ? 'That did not work. Scan the new code below and try again.' : 'That code was not accepted. Try again.')
    }
  })

  app.get('/login/passkey', { schema: { hide: true } }, async (request, reply) => {
    const next = sameOriginRedirect((request.query as Record<string, unknown>).next)
    return send(reply, 200, passkeyPage(next))
  })

  const passkeyPage = (next: string | undefined, error?: string): string => layout(basePath, 'Sign in with a passkey', `<form method="post" action="${basePath}/login/passkey">
${hidden('next', next)}<input type="hidden" name="passkey" value="">
<button type="button" data-passkey="passwordless" hidden>Use a passkey</button>
</form>
<p><a href="${basePath}/login">Sign in with a password instead</a></p>`, error)

  app.post('/login/passkey', secretForm, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const next = sameOriginRedirect(field(request.body, 'next'))
    try {
      const credential = parseCredential(field(request.body, 'passkey', 32_768))
      const result = await passkeySignIn(deps, sessionContext(request), credential, relyingParty(request, app.config))
      return await signedIn(request, reply, result, next)
    } catch (error) {
      if (!(error instanceof AppError) || !['invalid_credentials', 'mfa_failed', 'rate_limited'].includes(error.code)) throw error
      for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
      return send(reply, error.status, passkeyPage(next,
        error.code === 'rate_limited' ? 'Too many failed sign-ins. Wait a few minutes, then try again.' : 'The passkey was not accepted.'))
    }
  })

  const reauthMinutes = Math.round(app.config.reauthWindowMs / 60_000)

  /** The small form that proves the person again, with what this user has: password, a code, a passkey; or else a fresh sign-in. */
  const reauthSection = async (principal: Principal): Promise<string> => {
    const methods = await reauthMethods(deps, principal.userId!)
    const codes = methods.includes('totp')
      ? 'Code from your authenticator app, or a recovery code'
      : methods.includes('recovery_code') ? 'A recovery code' : undefined
    const fields = (methods.includes('password')
      ? '<label for="reauth-password">Your password</label>\n<input id="reauth-password" name="password" type="password" autocomplete="current-password" autofocus>\n'
      : '') + (codes !== undefined ? `<label for="reauth-code">${codes}</label>\n<input id="reauth-code" name="code" autocomplete="one-time-code">\n` : '')
    const form = methods.length === 0
      ? '<p>Sign out and sign in again; a fresh sign-in counts.</p>'
      : `<form method="post" action="${accountPath}/reauthenticate">
<input type="hidden" name="passkey" value="">
${fields}${fields !== '' ? '<button type="submit">Confirm</button>\n' : ''}${methods.includes('passkey') ? '<button type="button" class="secondary" data-passkey="reauth" hidden>Confirm with a passkey</button>\n' : ''}</form>`
    return `<section class="reauth" id="reauth">
<h2>Confirm it is you</h2>
<p>Changes to your second factors need a sign-in within the last ${reauthMinutes} minutes. Confirm, then make the change again.</p>
${form}
</section>
`
  }

  const accountPage = async (principal: Principal, options: { error?: string, reauth?: boolean, notice?: string } = {}): Promise<string> => {
    const status = await mfaStatus(deps, principal.userId!)
    const hasFactor = status.totp.enrolled || status.passkeys.length > 0
    const totp = status.totp.enrolled
      ? `<p id="totp-state">On.</p><form method="post" action="${accountPath}/totp/remove"><button type="submit" class="secondary">Remove the authenticator app</button></form>`
      : app.config.mfaEncryptionKey === undefined
        ? '<p id="totp-state">Not available here (the operator has not set MFA_ENCRYPTION_KEY).</p>'
        : status.totp.pending
          ? `<p id="totp-state">Set-up waiting for its first code.</p><div class="actions"><form method="post" action="${accountPath}/totp/continue"><button type="submit">Continue the set-up</button></form>` +
            `<form method="post" action="${accountPath}/totp/cancel"><button type="submit" class="secondary">Cancel the set-up</button></form></div>`
          : `<p id="totp-state">Off.</p><form method="post" action="${accountPath}/totp"><button type="submit">Set up an authenticator app</button></form>`
    const passkeys = status.passkeys.length === 0
      ? '<p>None yet.</p>'
      : `<ul id="passkeys">${status.passkeys.map(p => `<li>${escapeHtml(p.name)}</li>`).join('')}</ul>`
    const codes = hasFactor
      ? `<p id="recovery-state">${status.recovery_codes_remaining} of 10 left.</p><form method="post" action="${accountPath}/recovery-codes"><button type="submit" class="secondary">Make new recovery codes</button></form>`
      : '<p>You get ten with your first second factor.</p>'
    // Admins come here from the console to enrol a factor; the way back.
    const consoleLink = principal.user!.role === 'admin' ? `<p><a href="${basePath}/admin" id="console-link">Back to the admin console</a></p>\n` : ''
    const notice = options.notice !== undefined ? `<p class="notice" role="status" id="notice">${escapeHtml(options.notice)}</p>\n` : ''
    return layout(basePath, 'Account security', `${notice}${consoleLink}<p>Signed in as <strong id="username">${escapeHtml(principal.user!.username)}</strong>${status.required ? '; this account must have a second factor' : ''}.</p>
${options.reauth === true ? await reauthSection(principal) : ''}<h2 id="password-title">Password</h2>
${await passwordSection(principal)}
<h2>Authenticator app</h2>
${totp}
<h2>Passkeys</h2>
${passkeys}
<form method="post" action="${accountPath}/passkeys">
<input type="hidden" name="passkey" value="">
<label for="passkey-name">Name for a new passkey</label>
<input id="passkey-name" name="name" maxlength="64" value="Passkey">
<button type="button" data-passkey="register" hidden>Add a passkey</button>
</form>
<h2>Recovery codes</h2>
${codes}
<h2 id="email-title">E-mail address</h2>
${await emailSection(principal)}
<h2 id="sessions-title">Where you're signed in</h2>
${sessionsList(await listOwnSessions(deps, principal))}
<form method="post" action="${basePath}/logout"><button type="submit" class="secondary">Sign out</button></form>`, options.error)
  }

  /**
   * The password form: the current password is the recent proof it asks for,
   * as PUT /api/me/password does, whatever the session's age. An account that
   * does not sign in with a password here is told so instead.
   */
  const passwordSection = async (principal: Principal): Promise<string> => {
    const user = (await getUser({ db: deps.db }, principal.userId!)).user
    if (!app.config.passwordSignIn || !user.password_sign_in) return '<p id="password-state">This account does not sign in with a password here.</p>'
    const changed = user.password_changed_at !== null ? `<p class="meta" id="password-state">Last changed ${pageTime(user.password_changed_at)}.</p>\n` : ''
    return `${changed}<form method="post" action="${accountPath}/password">
<label for="current-password">Current password</label>
<input id="current-password" name="current_password" type="password" autocomplete="current-password" required>
<label for="new-password">New password</label>
<input id="new-password" name="new_password" type="password" autocomplete="new-password" required>
<label for="confirm-password">The new password again</label>
<input id="confirm-password" name="confirm" type="password" autocomplete="new-password" required>
<button type="submit">Change password</button>
</form>
<p class="meta">Changing it ends your other sessions and revokes your API keys.</p>`
  }

  /** The address and whether it is confirmed; a new one is mailed a link and takes effect once confirmed (docs/email.md). */
  const emailSection = async (principal: Principal): Promise<string> => {
    const user = (await getUser({ db: deps.db }, principal.userId!)).user
    const state = user.email === null
      ? '<p id="email-state">None.</p>'
      : `<p id="email-state"><strong>${escapeHtml(user.email)}</strong>: ${user.email_verified ? 'confirmed' : 'not confirmed'}.</p>`
    const confirmCurrent = user.email !== null && !user.email_verified
      ? `<form method="post" action="${accountPath}/email"><button type="submit" class="secondary">Confirm this address</button></form>\n`
      : ''
    return `${state}
${confirmCurrent}<form method="post" action="${accountPath}/email">
<label for="new-email">New address</label>
<input id="new-email" name="email" type="email" autocomplete="email" maxlength="254" required>
<button type="submit">Change address</button>
</form>
<p class="meta">A new address takes effect once you follow the link mailed to it; the current one is then told.</p>`
  }

  /** The user's live sessions, this browser's first, each other one with an End button. */
  const sessionsList = (sessions: SessionSummary[]): string => {
    const ordered = [...sessions.filter(s => s.current), ...sessions.filter(s => !s.current)]
    const items = ordered.map(s => `<li data-session="${s.id}"><strong>${escapeHtml(s.device ?? 'Unknown device')}</strong>${s.current ? ' <span id="this-browser">(this browser)</span>' : ''}
<div class="meta">${escapeHtml(signInText(s))}${s.client_ip !== null ? ` · from ${escapeHtml(s.client_ip)}` : ''}</div>
<div class="meta">Signed in ${pageTime(s.created_at)} · last active ${pageTime(s.last_seen_at)}</div>
${s.current ? '' : `<form method="post" action="${accountPath}/sessions/${s.id}/end"><button type="submit" class="secondary" aria-label="End the session on ${escapeHtml(s.device ?? 'an unknown device')}">End</button></form>`}</li>`)
    const others = sessions.some(s => !s.current)
      ? `<form method="post" action="${accountPath}/sessions/end-others"><button type="submit" class="secondary" id="end-others">End all other sessions</button></form>`
      : '<p class="meta">No other sessions.</p>'
    return `<ul class="sessions" id="sessions" aria-labelledby="sessions-title">${items.join('\n')}</ul>\n${others}`
  }

  /** The account pages' guard: a signed-in browser, and for posts, one of our own pages. */
  const account = async (request: FastifyRequest, reply: FastifyReply, post: boolean): Promise<Principal | undefined> => {
    if (post) assertSameOrigin(request, app.config.trustedOrigins)
    const principal = await pagePrincipal(deps, request)
    if (principal === undefined) await reply.code(303).header('Location', `${basePath}/login?next=${encodeURIComponent(accountPath)}`).send()
    return principal
  }

  /** A change to factors: only with a sign-in or re-authentication within REAUTH_WINDOW_SECONDS (the account page then asks for one). */
  const recent = async (principal: Principal): Promise<void> => {
    await assertRecentAuthentication(deps, { id: principal.id, userId: principal.userId! })
  }

  /** Known refusals are shown on the account page; anything else is a real error. */
  const orAccountPage = async (reply: FastifyReply, principal: Principal, work: () => Promise<FastifyReply>): Promise<FastifyReply> => {
    try {
      return await work()
    } catch (error) {
      if (!(error instanceof AppError) || error.status >= 500 || error.status === 401) throw error
      for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
      const reauth = error.code === 'reauthentication_required'
      return send(reply, error.status, await accountPage(principal, { error: reauth ? 'Confirm it is you first, then try again.' : error.detail, reauth }))
    }
  }

  const totpSetupPage = (setup: TotpSetup, error?: string): string => layout(basePath, 'Set up an authenticator app', `${totpBlock(setup)}<form method="post" action="${accountPath}/totp/confirm">
<label for="code">Code from the app</label>
<input id="code" name="code" autocomplete="one-time-code" inputmode="numeric" autofocus>
<button type="submit">Turn on</button>
</form>
<form method="post" action="${accountPath}/totp/cancel"><button type="submit" class="secondary">Cancel</button></form>`, error)

  app.get('/account', { schema: { hide: true } }, async (request, reply) => {
    const principal = await account(request, reply, false)
    if (principal === undefined) return reply
    const query = request.query as Record<string, unknown>
    // The passkey button's script comes here when the API asked for a re-authentication.
    if (query.reauthenticate !== undefined) return send(reply, 200, await accountPage(principal, { reauth: true }))
    const ended = typeof query.sessions_ended === 'string' && /^\d{1,6}$/.test(query.sessions_ended) ? Number(query.sessions_ended) : undefined
    const notice = query.reauthenticated !== undefined
      ? `Confirmed. For the next ${reauthMinutes} minutes you can change your second factors.`
      : query.password_changed !== undefined
        ? 'Your password is changed. Your other sessions have ended, and your API keys are revoked.'
        : ended !== undefined ? (ended === 1 ? 'One session ended.' : `${ended} sessions ended.`) : undefined
    return send(reply, 200, await accountPage(principal, notice !== undefined ? { notice } : {}))
  })

  // Ending a session protects the account, so it asks for no re-authentication (as signing out does not).
  app.post('/account/sessions/end-others', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    const ended = await endOtherOwnSessions(app.db, requestContext(request), principal)
    return await reply.code(303).header('Location', `${accountPath}?sessions_ended=${ended}`).send()
  })

  app.post('/account/sessions/:session_id/end', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      const { current } = await endOwnSession(app.db, requestContext(request), principal, (request.params as { session_id: string }).session_id)
      if (current) return await reply.code(303).header('Location', `${basePath}/login`).send()
      return await reply.code(303).header('Location', `${accountPath}?sessions_ended=1`).send()
    })
  })

  app.post('/account/email', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    const email = field(request.body, 'email', 254).trim()
    return await orAccountPage(reply, principal, async () => {
      if (email !== '' && !/^[^\s@]+@[^\s@]+$/.test(email)) throw new AppError('validation_failed', 422, 'That is not an e-mail address.')
      const sent = await sendEmailVerification({ db: deps.db, passwords: deps.passwords, failures: deps.failures, config: app.config }, principal, requestContext(request), email === '' ? undefined : email)
      return send(reply, 202, await accountPage(principal, { notice: `A confirmation link was mailed to ${sent.email}; it works until ${sent.expires_at.slice(0, 16).replace('T', ' ')} UTC.` }))
    })
  })

  app.post('/account/password', secretForm, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    const current = field(request.body, 'current_password', 1024)
    const next = field(request.body, 'new_password', 1024)
    return await orAccountPage(reply, principal, async () => {
      if (current === '' || next === '') throw new AppError('validation_failed', 422, 'Type your current password and the new one.')
      if (next !== field(request.body, 'confirm', 1024)) throw new AppError('validation_failed', 422, 'The two new passwords differ; type the same password twice.')
      try {
        await changeOwnPassword(deps, principal, requestContext(request), current, next)
      } catch (error) {
        // A wrong current password is the form's own refusal, not a session that stopped working (the other 401s).
        if (!(error instanceof AppError) || error.code !== 'invalid_credentials') throw error
        return send(reply, 401, await accountPage(principal, { error: error.detail }))
      }
      return await reply.code(303).header('Location', `${accountPath}?password_changed=1`).send()
    })
  })

  app.post('/account/reauthenticate', secretForm, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    const password = field(request.body, 'password', 1024)
    const code = field(request.body, 'code', 64).replace(/\s/g, '')
    const passkey = field(request.body, 'passkey', 32_768)
    try {
      const proof: ReauthProof = password !== ''
        ? { password }
        : code !== '' ? (/^\d{6}$/.test(code) ? { totpCode: code } : { recoveryCode: code }) : passkey !== '' ? { passkey: parseCredential(passkey) } : {}
      await reauthenticate(deps, requestContext(request), { id: principal.id, userId: principal.userId! }, proof, relyingParty(request, app.config))
      return await reply.code(303).header('Location', `${accountPath}?reauthenticated=1`).send()
    } catch (error) {
      if (!(error instanceof AppError) || !['invalid_credentials', 'mfa_failed', 'rate_limited', 'validation_failed'].includes(error.code)) throw error
      for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
      const message = error.code === 'rate_limited'
        ? 'Too many failed attempts. Wait a few minutes, then try again.'
        : error.code === 'validation_failed' ? 'Enter your password or a code.' : 'That was not accepted. Try again.'
      return send(reply, error.status, await accountPage(principal, { error: message, reauth: true }))
    }
  })

  app.post('/account/totp', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      await recent(principal)
      return send(reply, 200, totpSetupPage(await startTotp(deps, principal.user!)))
    })
  })

  app.post('/account/totp/continue', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      const setup = await pendingTotpSetup(deps, principal.user!)
      if (setup === undefined) return await reply.code(303).header('Location', accountPath).send()
      return send(reply, 200, totpSetupPage(setup))
    })
  })

  app.post('/account/totp/cancel', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    // Nothing waiting (cancelled in another tab) is the state asked for.
    await cancelTotpSetup(deps, principal.userId!).catch((error: unknown) => { if (!(error instanceof AppError && error.code === 'totp_not_pending')) throw error })
    return await reply.code(303).header('Location', accountPath).send()
  })

  app.post('/account/totp/confirm', secretForm, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      await recent(principal)
      try {
        const result = await confirmTotp(deps, requestContext(request), principal.userId!, field(request.body, 'code', 64))
        if (result.recoveryCodes !== undefined) return send(reply, 200, codesPage(basePath, result.recoveryCodes, accountPath))
        return await reply.code(303).header('Location', accountPath).send()
      } catch (error) {
        // A mistyped code keeps the set-up: the same key again, so the entry already scanned still works.
        const setup = error instanceof AppError && (error.code === 'invalid_code' || error.code === 'rate_limited') ? await pendingTotpSetup(deps, principal.user!) : undefined
        if (setup === undefined) throw error
        for (const [name, value] of Object.entries((error as AppError).headers)) reply.header(name, value)
        const message = (error as AppError).code === 'rate_limited'
          ? 'Too many wrong codes. Wait a few minutes, then enter the code the app shows.'
          : 'That is not the code the app shows now. Enter the current code (the set-up is kept).'
        return send(reply, (error as AppError).status, totpSetupPage(setup, message))
      }
    })
  })

  app.post('/account/totp/remove', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      await recent(principal)
      await removeTotp(deps, requestContext(request), principal.userId!)
      return await reply.code(303).header('Location', accountPath).send()
    })
  })

  app.post('/account/passkeys', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      await recent(principal)
      const json = field(request.body, 'passkey', 32_768)
      if (json === '') throw new AppError('passkey_rejected', 422, 'The browser gave no passkey.')
      let credential: PasskeyCredential
      try {
        credential = JSON.parse(json) as PasskeyCredential
      } catch {
        throw new AppError('passkey_rejected', 422, 'The passkey answer was not JSON.')
      }
      const name = field(request.body, 'name', 64).replace(/\p{Cc}/gu, '').trim() || 'Passkey'
      const result = await finishPasskeyRegistration(deps, requestContext(request), principal.userId!, name, credential, relyingParty(request, app.config))
      if (result.recoveryCodes !== undefined) return send(reply, 200, codesPage(basePath, result.recoveryCodes, accountPath))
      return await reply.code(303).header('Location', accountPath).send()
    })
  })

  app.post('/account/recovery-codes', form, async (request, reply) => {
    const principal = await account(request, reply, true)
    if (principal === undefined) return reply
    return await orAccountPage(reply, principal, async () => {
      await recent(principal)
      const codes = await regenerateRecoveryCodes(deps, requestContext(request), principal.userId!)
      return send(reply, 200, codesPage(basePath, codes, accountPath))
    })
  })
}
