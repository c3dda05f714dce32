import type { FastifyTypeBox } from '../lib/http.ts'
import { escapeHtml, sendHtmlPage } from '../lib/html.ts'
import { CSP, smallPage } from '../lib/page-style.ts'

/**
 * `${basePath}` and `${basePath}/`: where someone who typed the service's
 * address lands. A browser gets a small page naming the docs, the admin
 * console and the sign-in page; any other client (curl, scripts: no
 * text/html in Accept) gets the same links as JSON.
 */
export default async function landingRoutes (app: FastifyTypeBox): Promise<void> {
  const base = app.config.basePath
  const links = {
    docs: `${base}/docs`,
    openapi: `${base}/openapi.json`,
    console: `${base}/admin`,
    login: `${base}/login`
  }
  const html = smallPage({
    title: 'gatehouse',
    body: `<p>The Auth API of the workflow and data-pipeline service.</p>
<ul>
<li><a href="${escapeHtml(links.docs)}">API documentation</a></li>
<li><a href="${escapeHtml(links.console)}">Admin console</a></li>
<li><a href="${escapeHtml(links.login)}">Sign in</a></li>
</ul>
`
  })
  app.get('/', { schema: { hide: true } }, async (request, reply) => {
    reply.header('Vary', 'Accept')
    if ((request.headers.accept ?? '').includes('text/html')) return sendHtmlPage(reply, 200, html, CSP)
    return { name: 'gatehouse', links }
  })
}
