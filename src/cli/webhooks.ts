import type { Command } from 'commander'
import { ApiClient } from './http.ts'
import { cell, printJson, printLine, printTable, UsageError } from './output.ts'

interface Webhook {
  id: string
  url: string
  description: string | null
  event_types: string[]
  enabled: boolean
  disabled_reason: string | null
  failing_since: string | null
  created_at: string
  secret?: string
}

interface Attempt {
  id: string
  event_id: string
  event_type: string | null
  attempted_at: string
  succeeded: boolean
  status_code: number | null
  latency_ms: number
  error: string | null
  next_attempt_at: string | null
}

function collect (value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value]
}

function positiveInt (value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 1000) throw new UsageError(`--limit must be 1 to 1000, got "${value}"`)
  return Number(value)
}

function instant (name: string, value: string): string {
  const time = Date.parse(value)
  if (Number.isNaN(time)) throw new UsageError(`${name} must be an RFC 3339 time such as 2026-11-23T09:00:00Z, got "${value}"`)
  return new Date(time).toISOString()
}

export function registerWebhooks (program: Command): void {
  const webhooks = program.command('webhooks').description('manage webhook endpoints through a running service (GATEHOUSE_URL, GATEHOUSE_API_KEY)')

  webhooks.command('list')
    .description('list webhook endpoints (never their secrets)')
    .option('--json', 'print a JSON array')
    .action(async (options: { json?: boolean }) => {
      const list = (await ApiClient.fromEnv().request<Webhook[]>('GET', '/api/webhooks')).body
      if (options.json === true) printJson(list)
      else {
        printTable(['id', 'url', 'events', 'enabled', 'disabled because', 'failing since', 'description'],
          list.map(w => [w.id, w.url, cell(w.event_types), String(w.enabled), cell(w.disabled_reason), cell(w.failing_since), cell(w.description)]))
      }
    })

  webhooks.command('create')
    .description('register an endpoint; its signing secret is printed once')
    .argument('<url>', 'where deliveries are POSTed (http or https)')
    .option('--event <type>', 'an event type to deliver: user.created, user.* or *; repeat for several; default *', collect)
    .option('--description <text>', 'what the endpoint is for')
    .option('--disabled', 'create it disabled')
    .option('--json', 'print JSON (including the secret in "secret")')
    .action(async (url: string, options: { event?: string[], description?: string, disabled?: boolean, json?: boolean }) => {
      const body: Record<string, unknown> = { url }
      if (options.event !== undefined) body.event_types = [...new Set(options.event)]
      if (options.description !== undefined) body.description = options.description
      if (options.disabled === true) body.enabled = false
      const hook = (await ApiClient.fromEnv().request<Webhook>('POST', '/api/webhooks', { body })).body
      if (options.json === true) {
        printJson(hook)
        return
      }
      printLine(`Signing secret (shown once, store it now): ${hook.secret ?? ''}`)
      printLine(`id: ${hook.id}  url: ${hook.url}  events: ${hook.event_types.join(', ')}  enabled: ${String(hook.enabled)}`)
    })

  webhooks.command('delete')
    .description('delete an endpoint with its queued deliveries and attempt history')
    .argument('<id>', 'the endpoint\'s id')
    .option('--json', 'print JSON')
    .action(async (id: string, options: { json?: boolean }) => {
      await ApiClient.fromEnv().request('DELETE', `/api/webhooks/${encodeURIComponent(id)}`)
      if (options.json === true) printJson({ id, deleted: true })
      else printLine(`Deleted webhook endpoint ${id}`)
    })

  webhooks.command('attempts')
    .description('list delivery attempts of an endpoint, newest first')
    .argument('<id>', 'the endpoint\'s id')
    .option('--event <event_id>', 'only the attempts to deliver this event')
    .option('--limit <n>', 'show at most n attempts (default 100)', positiveInt)
    .option('--json', 'print a JSON array')
    .action(async (id: string, options: { event?: string, limit?: number, json?: boolean }) => {
      const query = new URLSearchParams({ limit: String(options.limit ?? 100) })
      if (options.event !== undefined) query.set('event_id', options.event)
      const list = (await ApiClient.fromEnv().request<Attempt[]>('GET', `/api/webhooks/${encodeURIComponent(id)}/attempts?${query.toString()}`)).body
      if (options.json === true) printJson(list)
      else {
        printTable(['attempted', 'event', 'type', 'ok', 'status', 'ms', 'error', 'next attempt'],
          list.map(a => [a.attempted_at, a.event_id, cell(a.event_type), a.succeeded ? 'yes' : 'no', cell(a.status_code), String(a.latency_ms), cell(a.error), cell(a.next_attempt_at)]))
      }
    })

  webhooks.command('replay')
    .description('deliver again every matching event of a time range (with the events\' own webhook-ids)')
    .argument('<id>', 'the endpoint\'s id')
    .requiredOption('--since <time>', 'events at or after this RFC 3339 time')
    .option('--until <time>', 'and before this time (default now)')
    .option('--json', 'print JSON')
    .action(async (id: string, options: { since: string, until?: string, json?: boolean }) => {
      const body: Record<string, unknown> = { since: instant('--since', options.since) }
      if (options.until !== undefined) body.until = instant('--until', options.until)
      const result = (await ApiClient.fromEnv().request<{ queued: number }>('POST', `/api/webhooks/${encodeURIComponent(id)}/replay`, { body })).body
      if (options.json === true) printJson(result)
      else printLine(`Queued ${result.queued} deliver${result.queued === 1 ? 'y' : 'ies'} to ${id}`)
    })
}
