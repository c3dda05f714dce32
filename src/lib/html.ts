import type { FastifyReply } from 'fastify'

/** Text made safe for HTML element content and quoted attribute values. */
export function escapeHtml (text: string): string {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`)
}

/**
 * Sends one of gatehouse's own pages (sign-in, second factor, console) with
 * the page's CSP, never framed.
 */
export function sendHtmlPage (reply: FastifyReply, status: number, html: string, csp: string, referrerPolicy: 'same-origin' | 'no-referrer' = 'same-origin'): FastifyReply {
  return reply.code(status)
    .header('Content-Security-Policy', csp)
    .header('X-Frame-Options', 'DENY')
    // Not no-referrer: under that policy browsers send "Origin: null" with a form's POST, even to
    // this origin, and assertSameOrigin refuses it. same-origin keeps the Referer off other sites
    // and the real Origin on our own form posts. Pages whose address carries a
    // one-time token send no-referrer (account/account-pages.ts): their posts
    // then carry Origin: null, and Sec-Fetch-Site vouches for them instead.
    .header('Referrer-Policy', referrerPolicy)
    .type('text/html; charset=utf-8')
    .send(html)
}
