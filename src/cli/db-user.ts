import type { Command } from 'commander'
import { note, printJson, printLine } from './output.ts'
import { readPassword, type PasswordOptions } from './prompt.ts'
import {
  checkRoleName,
  connectServiceDb,
  createRole,
  DEFAULT_PRIVILEGES,
  dropRole,
  parsePrivileges,
  OPTIONAL_PRIVILEGES,
  PRIVILEGES,
  SUPERUSER_WARNING,
  type Privilege
} from './pg-role.ts'

export const PRIVILEGES_HELP = `comma-separated, from ${OPTIONAL_PRIVILEGES.join(', ')}; the role always has LOGIN`

/** Checked before anything is changed, so a mistake never leaves half a workflow behind. */
export function planRole (name: string, privilegesList: string): Set<Privilege> {
  checkRoleName(name)
  const privileges = parsePrivileges(privilegesList)
  if (privileges.has('superuser')) note(SUPERUSER_WARNING)
  return privileges
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
    .option('--json', 'print the result as JSON')
    .action(async (name: string, options: PasswordOptions & { privileges: string, json?: boolean }) => {
      const privileges = planRole(name, options.privileges)
      const password = await readPassword(options, { required: true, confirm: true })
      const client = await connectServiceDb()
      try {
        await createRole(client, name, privileges, password)
      } finally {
        await client.end()
      }
      const granted = PRIVILEGES.filter(p => privileges.has(p))
      if (options.json === true) printJson({ role: name, privileges: granted, created: true })
      else printLine(`Created database role ${name} (${granted.join(', ')})`)
    })

  dbUser.command('drop')
    .description('drop the named PostgreSQL role, and only that one')
    .argument('<name>', 'role name')
    .option('--json', 'print the result as JSON')
    .action(async (name: string, options: { json?: boolean }) => {
      checkRoleName(name)
      const client = await connectServiceDb()
      try {
        await dropRole(client, name)
      } finally {
        await client.end()
      }
      if (options.json === true) printJson({ role: name, dropped: true })
      else printLine(`Dropped database role ${name}`)
    })
}

export { DEFAULT_PRIVILEGES }
