import type { Config } from '../config.ts'

/**
 * Where people reach the base path: PUBLIC_URL, or else the address the
 * service listens on (a wildcard listen address becomes localhost). Never
 * the request's Host header, which whoever sends the request chooses: a link
 * built from it could send a one-time token to another site.
 */
export function publicBase (config: Pick<Config, 'publicUrl' | 'host' | 'port' | 'basePath'>): string {
  if (config.publicUrl !== undefined) return config.publicUrl
  const host = config.host === '0.0.0.0' || config.host === '::' || config.host === '' ? 'localhost' : config.host
  return `http://${host.includes(':') ? `[${host}]` : host}:${config.port}${config.basePath}`
}

/**
 * An absolute link to `path` under the base path (`/reset-password` →
 * `https://pipelines.example.com/auth/reset-password`), with `query` encoded.
 * `path` is ours, never a person's input: it must start with one `/`.
 */
export function publicLink (config: Pick<Config, 'publicUrl' | 'host' | 'port' | 'basePath'>, path: string, query: Record<string, string> = {}): string {
  if (!/^\/(?!\/)/.test(path)) throw new Error(`publicLink takes a path under the base path, got "${path}"`)
  const search = new URLSearchParams(query).toString()
  return `${publicBase(config)}${path}${search === '' ? '' : `?${search}`}`
}
