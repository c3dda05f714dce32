import { createHash } from 'node:crypto'
import { escapeHtml } from './html.ts'

/** The look of the small pages: sign-in, second factor, the first-admin set-up (console/setup.ts) and the landing page at the base path (system/landing.ts). */
export const STYLE = `body{font:16px/1.5 system-ui,sans-serif;margin:0;min-height:100vh;display:grid;place-items:center;background:#f4f5f7;color:#1b1d21}
main{background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002;width:min(22rem,90vw)}
h1{font-size:1.4rem;margin:0 0 1rem}label{display:block;margin:.8rem 0 .2rem;font-weight:600}
input{width:100%;box-sizing:border-box;padding:.55rem;border:1px solid #8a8f98;border-radius:4px;font:inherit}
input:focus,button:focus{outline:3px solid #2f6fde;outline-offset:1px}
button{margin-top:1.2rem;width:100%;padding:.6rem;border:0;border-radius:4px;background:#1f5fcf;color:#fff;font:inherit;font-weight:600;cursor:pointer}
.error{background:#fde8e8;color:#8a1c1c;border:1px solid #e5a3a3;padding:.6rem;border-radius:4px}
dl{margin:0}dt{font-weight:600}dd{margin:0 0 .6rem}a{color:#1f5fcf;font-weight:600}a:focus{outline:3px solid #2f6fde;outline-offset:1px}`

const STYLE_HASH = createHash('sha256').update(STYLE).digest('base64')
/** Nothing but these pages' own style and forms posting back here. */
export const CSP = `default-src 'none'; style-src 'sha256-${STYLE_HASH}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`

export interface SmallPage {
  /** The tab title and the page's heading (escaped here). */
  title: string
  /** The page's content after the heading: trusted HTML, escaped by the caller. */
  body: string
  /** The style sheet; the caller's CSP must allow its hash. Default: STYLE. */
  style?: string
  /** Trusted HTML added to the head after the style (the MFA pages' scripts). */
  head?: string
  /** Trusted attributes for the html element after lang (the MFA pages' data-base). */
  htmlAttributes?: string
}

/**
 * The frame every small page shares (sign-in, second factor, account links,
 * first-admin set-up, landing): one place decides the doctype, viewport,
 * language and the heading, so a fix to one page's frame reaches all.
 */
export function smallPage ({ title, body, style = STYLE, head = '', htmlAttributes = '' }: SmallPage): string {
  return `<!doctype html>
<html lang="en"${htmlAttributes}>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>${style}</style>
${head}</head>
<body>
<main>
<h1>${escapeHtml(title)}</h1>
${body}</main>
</body>
</html>
`
}
