import { readFileSync } from 'node:fs'

const asset = (name: string): string => readFileSync(new URL(`./assets/${name}`, import.meta.url), 'utf8')

/**
 * What /auth/docs adds to Swagger UI (@fastify/swagger-ui's `theme`): colours
 * that meet WCAG contrast, and names and keyboard access for Swagger UI's
 * controls (docs/api.md, "Accessibility of /auth/docs"). Served from the
 * docs' own static path, so the page's Content-Security-Policy ('self') holds.
 */
export const DOCS_THEME = {
  title: 'gatehouse API',
  css: [{ filename: 'docs-theme.css', content: asset('docs-theme.css') }],
  js: [{ filename: 'docs-theme.js', content: asset('docs-theme.js') }]
}
