import type { Command } from 'commander'
import { ApiClient } from './http.ts'
import { CliError, note, printJson, printLine } from './output.ts'
import { confirmOnTerminal, readPassword, type PasswordOptions } from './prompt.ts'
import {
  checkRoleName,
  connectServiceDb,
  createRole,
  DEFAULT_PRIVILEGES,
  dropRole,
  parsePrivileges,
  PRIVILEGES,
  serviceDatabaseName,
  SUPERUSER_WARNING,
  type Privilege
} from './pg-role.ts'
import { PRIVILEGES_HELP } from '../lib/pg-role-name.ts'

/** Checked before anything is changed, so a mistake never leaves half a workflow behind. */
export function planRole (name: string, privilegesList: string): Set<Privilege> {
  checkRoleName(name)
  const privileges = parsePrivileges(privilegesList)
  if (privileges.has('superuser')) note(SUPERUSER_WARNING)
  return privileges
}

/** A superuser role is asked for again on a terminal, and needs `--yes` anywhere else (PRODUCT.md §17). */
export async function confirmPrivileges (name: string, privileges: Set<Privilege>, yes: boolean | undefined): Promise<void> {
  if (!privileges.has('superuser')) return
  await confirmOnTerminal(`Create the database role ${name} as a SUPERUSER of the whole cluster?`, { yes, what: '--privileges superuser' })
}

export const YES_HELP = 'create a superuser role without asking (needed with --privileges superuser when not on a terminal)'

export interface RoleChange {
  action: 'created' | 'dropped'
  role: string
  privileges?: readonly Privilege[]
  userId?: string
}

/**
 * Puts a role change PostgreSQL has just confirmed into gatehouse's events
 * (`database_role.created` / `.dropped`, actor: the key), as every other
 * admin action is (ASVS 16.3.2). gatehouse has no access to the service's
 * database, so the CLI that made the change reports it. Without a client
 * (GATEHOUSE_API_KEY unset for `db-user`) it says on stderr that the change
 * is not recorded. The event's id, or undefined when not recorded.
 */
export async function reportRoleChange (client: ApiClient | undefined, change: RoleChange): Promise<string | undefined> {
  if (client === undefined) {
    note(`the role change is not recorded in gatehouse's events; set GATEHOUSE_API_KEY (and GATEHOUSE_URL) to record it as database_role.${change.action}`)
    return undefined
  }
  const body = {
    action: change.action,
    role: change.role,
    database: serviceDatabaseName(),
    ...(change.privileges !== undefined ? { privileges: change.privileges } : {}),
    ...(change.userId !== undefined ? { user_id: change.userId } : {})
  }
  try {
    return (await client.request<{ id: string }>('POST', '/api/database-roles/changes', { body })).body.id
  } catch (error) {
    throw new CliError(`the database role ${change.role} was ${change.action}, but recording it in gatehouse's events failed: ${(error as Error).message}`)
  }
}

/** `gatehouse db-user` records its changes when it has a key for gatehouse; it works without one. */
function optionalClient (): ApiClient | undefined {
  const key = process.env.GATEHOUSE_API_KEY
  return key === undefined || key === '' ? undefined : ApiClient.fromEnv()
}

export function registerDbUser (program: Command): void {
  const dbUser = program.command('db-user')
    .description('create or drop the matching PostgreSQL role in the service\'s database (SERVICE_DATABASE_URL)')

  dbUser.command('create')
    .description('create a PostgreSQL role; the password is sent only as a SCRAM-SHA-256 verifier. Fails if the role exists.')
    .argument('<name>', 'role name: a-z, 0-9, _ and $, starting with a letter or _, at most 63 bytes')
    .option('--privileges <list>', PRIVILEGES_HELP, DEFAULT_PRIVILEGES)
    .option('--password-stdin', 'read the role\'s password from standard input')
    .option('--password-prompt', 'ask for the password on the terminal (the default on a terminal)')
    .option('--yes', YES_HELP)
    .option('--json', 'print the result as JSON')
    .action(async (name: string, options: PasswordOptions & { privileges: string, yes?: boolean, json?: boolean }) => {
      const privileges = planRole(name, options.privileges)
      await confirmPrivileges(name, privileges, options.yes)
      const gatehouse = optionalClient()
      const password = await readPassword(options, { required: true, confirm: true })
      const client = await connectServiceDb()
      try {
        await createRole(client, name, privileges, password)
      } finally {
        await client.end()
      }
      const granted = PRIVILEGES.filter(p => privileges.has(p))
      const eventId = await reportRoleChange(gatehouse, { action: 'created', role: name, privileges: granted })
      if (options.json === true) printJson({ role: name, privileges: granted, created: true, event_id: eventId ?? null })
      else printLine(`Created database role ${name} (${granted.join(', ')})`)
    })

  dbUser.command('drop')
    .description('drop the named PostgreSQL role, and only that one')
    .argument('<name>', 'role name')
    .option('--json', 'print the result as JSON')
    .action(async (name: string, options: { json?: boolean }) => {
      checkRoleName(name)
      const gatehouse = optionalClient()
      const client = await connectServiceDb()
      try {
        await dropRole(client, name)
      } finally {
        await client.end()
      }
      const eventId = await reportRoleChange(gatehouse, { action: 'dropped', role: name })
      if (options.json === true) printJson({ role: name, dropped: true, event_id: eventId ?? null })
      else printLine(`Dropped database role ${name}`)
    })
}

export { DEFAULT_PRIVILEGES }
