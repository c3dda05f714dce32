import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import { assertSameOrigin, requestContext } from '../auth/auth.plugin.ts'
import { AppError } from '../errors.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { CSP, smallPage } from '../lib/page-style.ts'
import { sendMfaStep } from '../mfa/mfa-pages.ts'
import { sessionContext, setSignInCookies } from '../sessions/cookies.ts'
import { acceptInvitation } from '../sign-in/invitation.flow.ts'
import { completePasswordReset, requestPasswordReset, type PasswordResetsDeps } from '../password-resets/password-resets.service.ts'
import { PASSWORD_RESET_ACCEPTED_TEXT } from '../password-resets/password-resets.schemas.ts'
import { confirmEmail, type EmailVerificationDeps } from '../email-verification/email-verification.service.ts'
import { findExpiredToken, findLiveToken, type AccountTokenPurpose, type TokenProof } from '../tokens/tokens.repository.ts'
import { humanTime } from '../lib/human-time.ts'
import { findUserById } from '../users/users.repository.ts'
import type { AccountDeps } from './account.routes.ts'

/*
 * The pages a mailed link opens (docs/email.md): accept an invitation, choose
 * a new password, confirm an address; and the "Forgot password?" form. A GET
 * (or HEAD: a mail scanner's prefetch) only shows a page; nothing is used
 * until its button is pressed (a POST from this page, checked as every page's
 * form post is). Each page also takes the mailed code instead of the link.
 * The link's address carries the token, so these pages send no Referer at all.
 */

function page (title: string, body: string, options: { error?: string, notice?: string } = {}): string {
  const error = options.error !== undefined ? `<p class="error" role="alert" id="error">${escapeHtml(options.error)}</p>\n` : ''
  const notice = options.notice !== undefined ? `<p role="status" id="notice">${escapeHtml(options.notice)}</p>\n` : ''
  return smallPage({ title, body: `${error}${notice}${body}` })
}

function send (reply: FastifyReply, status: number, html: string): FastifyReply {
  return sendHtmlPage(reply, status, html, CSP, 'no-referrer')
}

function field (body: unknown, name: string, max = 1024): string {
  const value = (body as Record<string, unknown> | null)?.[name]
  return typeof value === 'string' && value.length <= max ? value : ''
}

function queryToken (request: FastifyRequest): string | undefined {
  const token = (request.query as Record<string, unknown>).token
  return typeof token === 'string' && token !== '' && token.length <= 128 ? token : undefined
}

const passwordFields = (label: string): string => `<label for="password">${label}</label>
<input id="password" name="password" type="password" autocomplete="new-password" required>
<label for="confirm">The same again</label>
<input id="confirm" name="confirm" type="password" autocomplete="new-password" required>
`

/** The proof a posted form gives: the hidden token, or the login and code typed. */
function proofOf (body: unknown): TokenProof | undefined {
  const token = field(body, 'token', 128)
  if (token !== '') return { token }
  const login = field(body, 'login', 254).trim()
  const code = field(body, 'code', 32)
  return login !== '' && code !== '' ? { login, code } : undefined
}

/** What a refusal shows on the page; anything else is a real error. */
function shownError (error: unknown): AppError {
  if (error instanceof AppError && error.status < 500 && error.status !== 401) return error
  throw error
}

export default async function accountPages (app: FastifyTypeBox, deps: AccountDeps): Promise<void> {
  const basePath = app.config.basePath
  const form = { schema: { hide: true }, config: { accepts: ['application/x-www-form-urlencoded'] } }
  // Sign-in and password forms: a secret in the query string is refused (lib/http.ts secretsInBody).
  const secretForm = { ...form, config: { ...form.config, secretsInBody: true } }
  const resets: PasswordResetsDeps = { ...deps, config: app.config }
  const verification: EmailVerificationDeps = { db: deps.db, passwords: deps.passwords, failures: deps.failures, config: app.config }
  const afterSignIn = app.config.loginDefaultNext ?? `${basePath}/login`

  /** The live token a link names, and its account, without using it. */
  const linked = async (token: string | undefined, purpose: AccountTokenPurpose): Promise<{ username: string, email: string | null } | undefined> => {
    if (token === undefined) return undefined
    const row = await findLiveToken(deps.db, token, purpose)
    const user = row !== undefined ? await findUserById(deps.db, row.user_id) : undefined
    return user !== undefined ? { username: user.username, email: row!.email ?? user.email } : undefined
  }

  /*
   * What a link that ran out says: when, and how to get a new one. Only its
   * holder has the link, so saying it expired tells them nothing new; a used,
   * replaced or revoked link keeps the one message that does not tell which.
   */
  const NEW_LINK: Record<AccountTokenPurpose, string> = {
    invitation: 'Ask your administrator to send you a new invitation.',
    password_reset: 'Ask for a new one: choose "Forgot password?" on the sign-in page.',
    email_verification: 'Ask for a new one from your account page.'
  }
  const refusedLink = async (token: string | undefined, purpose: AccountTokenPurpose, otherwise: string): Promise<string> => {
    const expired = token !== undefined ? await findExpiredToken(deps.db, token, purpose) : undefined
    if (expired === undefined) return otherwise
    const what = purpose === 'invitation' ? 'This invitation' : 'This link'
    return `${what} expired on ${humanTime(expired.expires_at)}. ${NEW_LINK[purpose]}`
  }
  /** A refusal shown on a link's page: an expired token says so, anything else as it is. */
  const refusalText = async (token: string | undefined, purpose: AccountTokenPurpose, shown: AppError): Promise<string> =>
    shown.code === 'token_invalid' ? await refusedLink(token, purpose, shown.detail) : shown.detail

  const refusal = (reply: FastifyReply, error: AppError): void => {
    for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
  }

  // ------------------------------------------------------------ invitation

  const invitationForm = (token: string | undefined, username: string | undefined): string => `<form method="post" action="${basePath}/invitation">
${token !== undefined
  ? `<p>Welcome, <strong id="username">${escapeHtml(username ?? '')}</strong>. Choose your password to finish setting up your account.</p>\n<input type="hidden" name="token" value="${escapeHtml(token)}">\n`
  : '<p>Type your username and the code from your invitation mail.</p>\n<label for="login">Username</label>\n<input id="login" name="login" autocomplete="username" required>\n<label for="code">Code</label>\n<input id="code" name="code" autocomplete="one-time-code" required>\n'}${passwordFields('Password')}<button type="submit">Accept and sign in</button>
</form>
`

  app.get('/invitation', { schema: { hide: true } }, async (request, reply) => {
    const token = queryToken(request)
    const holder = await linked(token, 'invitation')
    if (token !== undefined && holder === undefined) {
      const error = await refusedLink(token, 'invitation', 'This invitation link does not work: it was used, replaced by a newer one, revoked, or has expired. Type the code from the newest mail, or ask your administrator to send the invitation again.')
      return send(reply, 400, page('Accept your invitation', invitationForm(undefined, undefined), { error }))
    }
    return send(reply, 200, page('Accept your invitation', invitationForm(holder !== undefined ? token : undefined, holder?.username)))
  })

  app.post('/invitation', secretForm, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const proof = proofOf(request.body)
    const token = proof !== undefined && 'token' in proof ? proof.token : undefined
    const again = async (status: number, error: string): Promise<FastifyReply> => {
      const holder = await linked(token, 'invitation')
      return send(reply, status, page('Accept your invitation', invitationForm(holder !== undefined ? token : undefined, holder?.username), { error }))
    }
    const password = field(request.body, 'password')
    if (proof === undefined) return await again(422, 'Type your username and the code from the mail.')
    if (password === '' || password !== field(request.body, 'confirm')) return await again(422, 'The two passwords differ; type the same password twice.')
    try {
      const result = await acceptInvitation(deps, sessionContext(request), proof, password)
      if (result.kind === 'mfa') return await sendMfaStep(app, deps, reply, result, undefined)
      setSignInCookies(request, reply, result, app.config)
      return await reply.code(303).header('Location', afterSignIn).send()
    } catch (error) {
      const shown = shownError(error)
      refusal(reply, shown)
      return await again(shown.status, await refusalText(token, 'invitation', shown))
    }
  })

  // ------------------------------------------------------------ password reset

  const forgotForm = `<form method="post" action="${basePath}/forgot-password">
<p>Type your username or e-mail address. If the account has a password, a link to choose a new one is mailed to its address.</p>
<label for="login">Username or e-mail</label>
<input id="login" name="login" autocomplete="username" required autofocus>
<button type="submit">Mail me a link</button>
</form>
<p><a href="${basePath}/reset-password">I have a code</a></p>
<p><a href="${basePath}/login">Back to sign-in</a></p>
`

  app.get('/forgot-password', { schema: { hide: true } }, async (_request, reply) => send(reply, 200, page('Forgot your password?', forgotForm)))

  app.post('/forgot-password', secretForm, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const login = field(request.body, 'login', 254).trim()
    if (login === '') return send(reply, 422, page('Forgot your password?', forgotForm, { error: 'Type your username or e-mail address.' }))
    try {
      await requestPasswordReset(resets, requestContext(request), login)
    } catch (error) {
      const shown = shownError(error)
      refusal(reply, shown)
      return send(reply, shown.status, page('Forgot your password?', forgotForm, { error: shown.detail }))
    }
    return send(reply, 202, page('Check your mail', `<p id="sent">${escapeHtml(PASSWORD_RESET_ACCEPTED_TEXT)}</p>
<p><a href="${basePath}/reset-password">Type the code from the mail</a></p>
<p><a href="${basePath}/login">Back to sign-in</a></p>
`))
  })

  const resetForm = (token: string | undefined, username: string | undefined): string => `<form method="post" action="${basePath}/reset-password">
${token !== undefined
  ? `<p>Choose a new password for <strong id="username">${escapeHtml(username ?? '')}</strong>. You will be signed out everywhere.</p>\n<input type="hidden" name="token" value="${escapeHtml(token)}">\n`
  : '<p>Type your username or address and the code from the mail.</p>\n<label for="login">Username or e-mail</label>\n<input id="login" name="login" autocomplete="username" required>\n<label for="code">Code</label>\n<input id="code" name="code" autocomplete="one-time-code" required>\n'}${passwordFields('New password')}<button type="submit">Set the new password</button>
</form>
`

  app.get('/reset-password', { schema: { hide: true } }, async (request, reply) => {
    const token = queryToken(request)
    const holder = await linked(token, 'password_reset')
    if (token !== undefined && holder === undefined) {
      const error = await refusedLink(token, 'password_reset', 'This link does not work: it was used, replaced by a newer one, or has expired. Ask for a new one.')
      return send(reply, 400, page('Choose a new password', resetForm(undefined, undefined) + `<p><a href="${basePath}/forgot-password">Ask for a new link</a></p>\n`, { error }))
    }
    return send(reply, 200, page('Choose a new password', resetForm(holder !== undefined ? token : undefined, holder?.username)))
  })

  app.post('/reset-password', secretForm, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const proof = proofOf(request.body)
    const token = proof !== undefined && 'token' in proof ? proof.token : undefined
    const again = async (status: number, error: string): Promise<FastifyReply> => {
      const holder = await linked(token, 'password_reset')
      return send(reply, status, page('Choose a new password', resetForm(holder !== undefined ? token : undefined, holder?.username), { error }))
    }
    const password = field(request.body, 'password')
    if (proof === undefined) return await again(422, 'Type your username or address and the code from the mail.')
    if (password === '' || password !== field(request.body, 'confirm')) return await again(422, 'The two passwords differ; type the same password twice.')
    try {
      await completePasswordReset(resets, requestContext(request), proof, password)
    } catch (error) {
      const shown = shownError(error)
      refusal(reply, shown)
      return await again(shown.status, await refusalText(token, 'password_reset', shown))
    }
    return send(reply, 200, page('Password changed', `<p id="done">Your new password is set, and every earlier session has ended.</p>\n<p><a href="${basePath}/login">Sign in</a></p>\n`))
  })

  // ------------------------------------------------------------ e-mail confirmation

  const verifyForm = (token: string | undefined, holder: { username: string, email: string | null } | undefined): string => `<form method="post" action="${basePath}/verify-email">
${token !== undefined
  ? `<p>Confirm <strong id="email">${escapeHtml(holder?.email ?? '')}</strong> as the address of the account <strong id="username">${escapeHtml(holder?.username ?? '')}</strong>.</p>\n<input type="hidden" name="token" value="${escapeHtml(token)}">\n`
  : '<p>Type the address and the code from the mail.</p>\n<label for="login">E-mail address</label>\n<input id="login" name="login" type="email" autocomplete="email" required>\n<label for="code">Code</label>\n<input id="code" name="code" autocomplete="one-time-code" required>\n'}<button type="submit">Confirm the address</button>
</form>
`

  app.get('/verify-email', { schema: { hide: true } }, async (request, reply) => {
    const token = queryToken(request)
    const holder = await linked(token, 'email_verification')
    if (token !== undefined && holder === undefined) {
      const error = await refusedLink(token, 'email_verification', 'This link does not work: it was used, replaced by a newer one, or has expired. Ask for a new one from your account page.')
      return send(reply, 400, page('Confirm your address', verifyForm(undefined, undefined), { error }))
    }
    return send(reply, 200, page('Confirm your address', verifyForm(holder !== undefined ? token : undefined, holder)))
  })

  app.post('/verify-email', form, async (request, reply) => {
    assertSameOrigin(request, app.config.trustedOrigins)
    const proof = proofOf(request.body)
    const token = proof !== undefined && 'token' in proof ? proof.token : undefined
    const again = async (status: number, error: string): Promise<FastifyReply> => {
      const holder = await linked(token, 'email_verification')
      return send(reply, status, page('Confirm your address', verifyForm(holder !== undefined ? token : undefined, holder), { error }))
    }
    if (proof === undefined) return await again(422, 'Type the address and the code from the mail.')
    try {
      const { user } = await confirmEmail(verification, requestContext(request), proof)
      return send(reply, 200, page('Address confirmed', `<p id="done"><strong>${escapeHtml(user.email ?? '')}</strong> is now the confirmed address of <strong>${escapeHtml(user.username)}</strong>.</p>\n<p><a href="${basePath}/account">Your account</a></p>\n`))
    } catch (error) {
      const shown = shownError(error)
      refusal(reply, shown)
      return await again(shown.status, await refusalText(token, 'email_verification', shown))
    }
  })
}
