import type { Command } from 'commander'
import { UsageError } from './output.ts'

const SORTS = ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at']

export interface FilterOptions {
  q?: string
  username?: string
  email?: string
  role?: string
  group?: string
  disabled?: boolean
  enabled?: boolean
  sort?: string
}

/** The list operation's filters, shared by `users list` and `users export`. */
export function addFilterOptions (command: Command): Command {
  return command
    .option('--q <text>', 'substring of username, email, first or last name, ignoring case')
    .option('--username <name>', 'exact username, ignoring case')
    .option('--email <address>', 'exact email, ignoring case')
    .option('--role <role>', 'admin or user')
    .option('--group <group>', 'only users in this group')
    .option('--disabled', 'only disabled users')
    .option('--enabled', 'only enabled users')
    .option('--sort <order>', SORTS.join(', '))
}

export function filterQuery (options: FilterOptions): URLSearchParams {
  if (options.disabled === true && options.enabled === true) throw new UsageError('give --disabled or --enabled, not both')
  if (options.sort !== undefined && !SORTS.includes(options.sort)) throw new UsageError(`--sort takes one of ${SORTS.join(', ')}`)
  const query = new URLSearchParams()
  for (const key of ['q', 'username', 'email', 'role', 'group', 'sort'] as const) {
    if (options[key] !== undefined) query.set(key, options[key])
  }
  if (options.disabled === true) query.set('disabled', 'true')
  if (options.enabled === true) query.set('disabled', 'false')
  return query
}
