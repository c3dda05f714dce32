import type { Command } from 'commander'
import { ApiClient } from './http.ts'
import { registerKeyRing } from './key-ring.ts'
import { cell, printJson, printLine, printTable, UsageError } from './output.ts'

const SCOPES = ['admin', 'users:read', 'users:write', 'events:read', 'webhooks:manage', 'scim']

interface ApiKey {
  id: string
  name: string
  prefix: string
  scopes: string[]
  user_id: string | null
  created_at: string
  expires_at: string | null
  last_used_at: string | null
  revoked_at: string | null
  key?: string
}

function collect (value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value]
}

function showSecret (key: ApiKey, json: boolean | undefined): void {
  if (json === true) {
    printJson(key)
    return
  }
  printLine(`API key (shown once, store it now): ${key.key ?? ''}`)
  printLine(`id: ${key.id}  name: ${key.name}  scopes: ${key.scopes.join(', ')}${key.expires_at !== null ? `  expires: ${key.expires_at}` : ''}`)
}

export function registerKeys (program: Command): void {
  const keys = program.command('keys')
    .description('manage API keys through a running service (GATEHOUSE_URL, GATEHOUSE_API_KEY); status and re-encrypt: the MFA_ENCRYPTION_KEY ring, in the database directly (DATABASE_URL)')
    .addHelpText('after', `
create, list, rotate and revoke are API keys, and go through the running service (GATEHOUSE_URL, GATEHOUSE_API_KEY).
status and re-encrypt are the encryption keys of MFA_ENCRYPTION_KEY: they need no running service and
work on the database of DATABASE_URL directly, as migrate and backup do (docs/operations.md#key-rotation).`)

  keys.command('create')
    .description('create an API key; its secret is printed once')
    .argument('<name>', 'what the key is for, e.g. "nightly export"')
    .option('--scope <scope>', `a scope (${SCOPES.join(', ')}); repeat for several; default admin`, collect)
    .option('--expires-at <time>', 'RFC 3339 time after which the key is refused, e.g. 2027-06-30T00:00:00Z')
    .option('--json', 'print JSON (including the secret in "key")')
    .action(async (name: string, options: { scope?: string[], expiresAt?: string, json?: boolean }) => {
      const scopes = options.scope ?? []
      for (const scope of scopes) {
        if (!SCOPES.includes(scope)) throw new UsageError(`unknown scope "${scope}"; choose from ${SCOPES.join(', ')}`)
      }
      const body: Record<string, unknown> = { name }
      if (scopes.length > 0) body.scopes = [...new Set(scopes)]
      if (options.expiresAt !== undefined) body.expires_at = options.expiresAt
      showSecret((await ApiClient.fromEnv().request<ApiKey>('POST', '/api/api-keys', { body })).body, options.json)
    })

  keys.command('list')
    .description('list API keys (never their secrets)')
    .option('--include-revoked', 'also list revoked keys')
    .option('--json', 'print a JSON array')
    .action(async (options: { includeRevoked?: boolean, json?: boolean }) => {
      const query = options.includeRevoked === true ? '?include_revoked=true' : ''
      const list = (await ApiClient.fromEnv().request<ApiKey[]>('GET', `/api/api-keys${query}`)).body
      if (options.json === true) printJson(list)
      else {
        printTable(['id', 'name', 'prefix', 'scopes', 'created', 'expires', 'last used', 'revoked'],
          list.map(k => [k.id, k.name, k.prefix, cell(k.scopes), k.created_at, cell(k.expires_at), cell(k.last_used_at), cell(k.revoked_at)]))
      }
    })

  keys.command('revoke')
    .description('revoke an API key; it is refused from the next request on')
    .argument('<id>', 'the key\'s id')
    .option('--json', 'print JSON')
    .action(async (id: string, options: { json?: boolean }) => {
      await ApiClient.fromEnv().request('DELETE', `/api/api-keys/${encodeURIComponent(id)}`)
      if (options.json === true) printJson({ id, revoked: true })
      else printLine(`Revoked API key ${id}`)
    })

  keys.command('rotate')
    .description('give an API key a new secret (printed once); the old one stops working at once')
    .argument('<id>', 'the key\'s id')
    .option('--json', 'print JSON (including the new secret in "key")')
    .action(async (id: string, options: { json?: boolean }) => {
      showSecret((await ApiClient.fromEnv().request<ApiKey>('POST', `/api/api-keys/${encodeURIComponent(id)}/rotate`)).body, options.json)
    })

  registerKeyRing(keys)
}
