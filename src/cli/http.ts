import { CliError, UsageError } from './output.ts'

export const DEFAULT_URL = 'http://127.0.0.1:8080/auth'
/** The service's default BASE_PATH (src/config.ts). */
const DEFAULT_BASE_PATH = '/auth'
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

/** The subset of the API's User the CLI relies on. */
export interface ApiUser {
  id: string
  username: string
  email: string | null
  first_name: string | null
  last_name: string | null
  role: string
  groups: string[]
  disabled: boolean
  [field: string]: unknown
}

/** The subset of the API's Group the CLI relies on. */
export interface ApiGroup {
  id: string
  display_name: string
  external_id: string | null
  member_count: number
  [field: string]: unknown
}

interface Problem {
  code?: string
  detail?: string
  title?: string
  errors?: Array<{ pointer?: string, detail?: string }>
}

/**
 * Why a 404 for an operation that exists is most likely GATEHOUSE_URL's fault:
 * without the base path every request misses the API, and the server can only
 * say that nothing is there.
 */
function basePathHint (baseUrl: string): string {
  const path = new URL(baseUrl).pathname
  if (path === '/' || path === '') {
    return `GATEHOUSE_URL is ${baseUrl} — did you mean ${baseUrl}${DEFAULT_BASE_PATH}? It must include the service's base path (BASE_PATH, ${DEFAULT_BASE_PATH} by default).`
  }
  return `GATEHOUSE_URL is ${baseUrl}: it must include the service's base path (BASE_PATH, ${DEFAULT_BASE_PATH} by default); is ${path} that path?`
}

/** An error answer of the API, carrying its problem+json `detail`. */
export class ApiError extends CliError {
  readonly status: number
  readonly code: string | undefined
  /** `baseUrl`: the GATEHOUSE_URL the request went to, for the hint on a 404 that no operation answered. */
  constructor (status: number, problem: Problem | undefined, statusText: string, baseUrl?: string) {
    const detail = problem?.detail ?? problem?.title ?? `${status} ${statusText}`
    const fields = (problem?.errors ?? [])
      .filter(e => e.pointer !== undefined && e.pointer !== '' && e.detail !== undefined)
      .map(e => `\n  ${e.pointer}: ${e.detail}`).join('')
    // route_not_found, or a 404 without a problem code at all: another server (a proxy's page) answered.
    const missedTheApi = status === 404 && (problem?.code === 'route_not_found' || problem?.code === undefined) && baseUrl !== undefined
    super(missedTheApi ? `${detail} ${basePathHint(baseUrl)}` : `${detail}${fields}`)
    this.status = status
    this.code = problem?.code
  }
}

export interface ApiResponse<T> {
  status: number
  headers: Headers
  body: T
}

/** A client of a running gatehouse, configured from GATEHOUSE_URL and GATEHOUSE_API_KEY. */
export class ApiClient {
  readonly baseUrl: string
  readonly #apiKey: string

  constructor (baseUrl: string, apiKey: string) {
    this.baseUrl = baseUrl.replace(/\/+$/, '')
    this.#apiKey = apiKey
  }

  static fromEnv (env: NodeJS.ProcessEnv = process.env): ApiClient {
    const url = env.GATEHOUSE_URL !== undefined && env.GATEHOUSE_URL !== '' ? env.GATEHOUSE_URL : DEFAULT_URL
    let parsed: URL
    try {
      parsed = new URL(url)
    } catch {
      throw new UsageError(`GATEHOUSE_URL is not a URL: ${url}`)
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new UsageError('GATEHOUSE_URL must start with http:// or https://')
    const key = env.GATEHOUSE_API_KEY
    if (key === undefined || key === '') {
      throw new UsageError('set GATEHOUSE_API_KEY to an admin API key (a new one comes from "gatehouse admin create")')
    }
    return new ApiClient(url, key)
  }

  /** `path` is below the base URL (`/api/users`), or a whole URL (a followed Link). */
  async request<T = unknown> (method: string, path: string, options: { body?: unknown, contentType?: string, headers?: Record<string, string> } = {}): Promise<ApiResponse<T>> {
    const url = /^https?:\/\//.test(path) ? path : this.baseUrl + path
    const headers: Record<string, string> = { 'x-api-key': this.#apiKey, accept: 'application/json, application/problem+json', ...options.headers }
    let body: string | undefined
    if (options.body !== undefined) {
      headers['content-type'] = options.contentType ?? 'application/json'
      body = JSON.stringify(options.body)
    }
    let response: Response
    try {
      response = await fetch(url, { method, headers, body })
    } catch (error) {
      const cause = (error as { cause?: { code?: string, message?: string } }).cause
      throw new CliError(`cannot reach ${this.baseUrl}: ${cause?.code ?? cause?.message ?? (error as Error).message}`)
    }
    const text = await response.text()
    const type = response.headers.get('content-type') ?? ''
    let parsed: unknown
    if (text !== '' && /json/.test(type)) {
      try {
        parsed = JSON.parse(text)
      } catch {
        throw new CliError(`${method} ${url} answered ${response.status} with malformed JSON`)
      }
    }
    if (!response.ok) throw new ApiError(response.status, parsed as Problem | undefined, response.statusText, this.baseUrl)
    return { status: response.status, headers: response.headers, body: parsed as T }
  }

  /**
   * Every user matching `query`, a page at a time (following `Link: rel="next"`),
   * so neither side holds the whole list.
   */
  async * users (query: URLSearchParams = new URLSearchParams(), pageSize = 1000): AsyncGenerator<ApiUser[]> {
    const params = new URLSearchParams(query)
    params.set('limit', String(pageSize))
    let path: string | undefined = `/api/users?${params.toString()}`
    while (path !== undefined) {
      const page: ApiResponse<ApiUser[]> = await this.request<ApiUser[]>('GET', path)
      yield page.body
      const next = nextLink(page.headers.get('link'))
      // The link is relative to the server, not to the base path.
      path = next === undefined ? undefined : new URL(next, this.baseUrl).toString()
    }
  }

  /** Every item of a paged list (`limit` in `path`), a page at a time, following `Link: rel="next"`. */
  async * pages<T> (path: string): AsyncGenerator<T[]> {
    let next: string | undefined = path
    while (next !== undefined) {
      const page: ApiResponse<T[]> = await this.request<T[]>('GET', next)
      yield page.body
      const link = nextLink(page.headers.get('link'))
      next = link === undefined ? undefined : new URL(link, this.baseUrl).toString()
    }
  }

  /** A group by id, or by its exact name. */
  async resolveGroup (idOrName: string): Promise<ApiGroup> {
    if (UUID.test(idOrName)) {
      try {
        return (await this.request<ApiGroup>('GET', `/api/groups/${encodeURIComponent(idOrName)}`)).body
      } catch (error) {
        if (!(error instanceof ApiError) || error.status !== 404) throw error
      }
    }
    const found = (await this.request<ApiGroup[]>('GET', `/api/groups?${new URLSearchParams({ display_name: idOrName }).toString()}`)).body
    if (found.length === 0) throw new CliError(`no group has the id or name "${idOrName}"`)
    return found[0]!
  }

  /** A user by id, or by username through the list operation (as the seed's delete workflow does). */
  async resolveUser (idOrUsername: string): Promise<ApiUser> {
    if (UUID.test(idOrUsername)) {
      try {
        return (await this.request<ApiUser>('GET', `/api/users/${encodeURIComponent(idOrUsername)}`)).body
      } catch (error) {
        if (!(error instanceof ApiError) || error.status !== 404) throw error
      }
    }
    const found = (await this.request<ApiUser[]>('GET', `/api/users?${new URLSearchParams({ username: idOrUsername }).toString()}`)).body
    if (found.length === 0) throw new CliError(`no user has the id or username "${idOrUsername}"`)
    return found[0]!
  }
}

function nextLink (header: string | null): string | undefined {
  if (header === null) return undefined
  for (const part of header.split(',')) {
    const match = /^\s*<([^>]*)>\s*;\s*rel="?next"?/.exec(part)
    if (match !== null) return match[1]
  }
  return undefined
}
