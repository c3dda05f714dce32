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

/**
 * HTML built from tagged templates: every interpolated value is escaped
 * unless it is itself the product of `html` (or an array of such). So a
 * template cannot forget to escape, and markup can only come from our own
 * template literals, never from data.
 */
export class SafeHtml {
  constructor (readonly text: string) {}
  toString (): string { return this.text }
}

type Value = SafeHtml | string | number | boolean | null | undefined | Value[]

function render (value: Value): string {
  if (value === null || value === undefined || value === false) return ''
  if (value instanceof SafeHtml) return value.text
  if (Array.isArray(value)) return value.map(render).join('')
  return escapeHtml(String(value))
}

export function html (strings: TemplateStringsArray, ...values: Value[]): SafeHtml {
  let out = strings[0]!
  for (let i = 0; i < values.length; i++) out += render(values[i]!) + strings[i + 1]!
  return new SafeHtml(out)
}

/** A query string from the non-empty values, for links that keep the current filters. */
export function queryOf (params: Record<string, string | number | boolean | undefined>): string {
  const search = new URLSearchParams()
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== '') search.set(name, String(value))
  }
  const text = search.toString()
  return text === '' ? '' : `?${text}`
}
