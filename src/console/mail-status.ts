import type { FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyTypeBox } from '../lib/http.ts'
import type { Db } from '../db/database.ts'
import { humanTime } from '../lib/human-time.ts'
import { findMailBacklog } from '../mail/mail.repository.ts'
import { MailTestError, type MailWorker } from '../mail/mail.worker.ts'
import { text, type Fields } from './console.forms.ts'
import { html, type SafeHtml } from '../lib/html.ts'
import { layout, type ViewContext } from './console.views.ts'

/*
 * What the console says of outgoing mail (docs/email.md#when-mail-fails): a
 * banner on every page while mail is failing or has waited too long, and a
 * page that shows the outbox's state and sends a test message past it.
 */

/** Mail waiting longer than this is worth a banner even without an error: nothing is sending it. */
export const MAIL_DELAY_ALERT_MS = 5 * 60_000

export interface MailState {
  /** This instance's last word from its SMTP server: `ok`, the reason it failed, or undefined before any. */
  health: string | undefined
  pending: number
  oldestPendingAt: Date | string | null
  /** The error of a message waiting for its retry (any instance's). */
  lastError: string | null
}

export async function mailStateOf (db: Db, worker: MailWorker): Promise<MailState> {
  return { health: worker.health, ...await findMailBacklog(db) }
}

/** The banner, or undefined when mail is going out. */
export function mailAlert (base: string, state: MailState, now = Date.now()): SafeHtml | undefined {
  const reason = state.health !== undefined && state.health !== 'ok' ? state.health : state.lastError
  const late = state.oldestPendingAt !== null && now - new Date(state.oldestPendingAt).getTime() > MAIL_DELAY_ALERT_MS
  if (reason === null && !late) return undefined
  const waiting = state.pending === 0
    ? ''
    : html` ${state.pending === 1 ? 'One message waits' : `${state.pending} messages wait`} in the outbox${state.oldestPendingAt !== null ? html`, the oldest since ${humanTime(state.oldestPendingAt)}` : ''}.`
  return html`<div class="error" role="alert" id="mail-alert"><strong>Mail is not going out.</strong>${reason !== null ? html` The SMTP server's last answer: <code>${reason}</code>.` : ' Nothing has sent it yet.'}${waiting}
Invitations and reset links reach nobody until this is fixed. <a href="${base}/admin/mail">Check mail and send a test message</a>.</div>`
}

export interface MailPageView {
  state: MailState
  to: string
  /** The outcome of a test message just sent: the server's answer, or why it failed. */
  test?: { ok: boolean, answer: string } | undefined
}

export function mailPage (ctx: ViewContext, view: MailPageView): string {
  const { state } = view
  const server = state.health === undefined ? 'not tried yet' : state.health === 'ok' ? 'reachable (its last conversation with this instance went through)' : html`failing: <code>${state.health}</code>`
  const result = view.test === undefined
    ? ''
    : view.test.ok
      ? html`<div class="notice" role="status" id="test-result"><strong>The server took the test message.</strong> Its answer: <code>${view.test.answer}</code>. Check that it arrived.</div>`
      : html`<div class="error" role="alert" id="test-result"><strong>The test message was not sent.</strong> The reason: <code>${view.test.answer}</code>.</div>`
  return layout(ctx, 'Mail', 'mail', html`<h1>Mail</h1>
${result}<section class="panel" aria-labelledby="state-title"><h2 id="state-title">Outgoing mail</h2>
<dl class="facts">
<dt>SMTP server</dt><dd id="smtp-state">${server}</dd>
<dt>Waiting</dt><dd id="pending">${state.pending === 0 ? 'nothing' : html`${state.pending}${state.oldestPendingAt !== null ? html`, the oldest since ${humanTime(state.oldestPendingAt)}` : ''}`}</dd>
<dt>Last failure</dt><dd id="last-error">${state.lastError === null ? 'none waiting for a retry' : html`<code>${state.lastError}</code>`}</dd>
</dl></section>
<section class="panel" aria-labelledby="test-title"><h2 id="test-title">Send a test mail</h2>
<p>Sent at once, past the outbox, with the deployment's SMTP settings; the page shows the server's answer.</p>
<form method="post" action="${ctx.base}/admin/mail/test">
<div class="field"><label for="to">To</label>
<input id="to" name="to" type="email" value="${view.to}" required autocomplete="email"></div>
<div class="actions"><button type="submit">Send a test mail</button></div>
</form></section>`)
}

export interface MailPagesOptions {
  worker: MailWorker
  viewOf: (request: FastifyRequest) => ViewContext
  sendPage: (reply: FastifyReply, status: number, page: string) => FastifyReply
  /** The signed-in admin's own address, to fill the test form with. */
  ownAddress: (request: FastifyRequest) => Promise<string>
}

/** The console's Mail page; registered inside the console plugin, so its sign-in and origin checks apply. */
export async function mailPages (app: FastifyTypeBox, options: MailPagesOptions): Promise<void> {
  const { worker, viewOf, sendPage } = options
  const hidden = { hide: true }
  app.get('/admin/mail', { schema: hidden }, async (request, reply) =>
    sendPage(reply, 200, mailPage(viewOf(request), { state: await mailStateOf(app.db, worker), to: await options.ownAddress(request) })))

  app.post('/admin/mail/test', { schema: hidden, config: { accepts: ['application/x-www-form-urlencoded'] } }, async (request, reply) => {
    const to = text(request.body as Fields, 'to').trim()
    if (!/^[^\s@]+@[^\s@]+$/.test(to) || to.length > 254) {
      return sendPage(reply, 422, mailPage(viewOf(request), { state: await mailStateOf(app.db, worker), to, test: { ok: false, answer: 'that is not an e-mail address' } }))
    }
    let test: { ok: boolean, answer: string }
    try {
      test = { ok: true, answer: await worker.sendTest(to) }
    } catch (error) {
      if (!(error instanceof MailTestError)) throw error
      test = { ok: false, answer: error.message }
    }
    request.log.info({ ok: test.ok, answer: test.answer }, 'test mail from the console')
    return sendPage(reply, test.ok ? 200 : 502, mailPage(viewOf(request), { state: await mailStateOf(app.db, worker), to, test }))
  })
}
