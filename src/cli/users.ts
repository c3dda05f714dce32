import type { Command } from 'commander'
import { ApiClient, ApiError, type ApiUser } from './http.ts'
import { CliError, printJson, printLine, printRecord, printTable, cell, UsageError } from './output.ts'
import { readPassword, type PasswordOptions } from './prompt.ts'
import { confirmPrivileges, DEFAULT_PRIVILEGES, planRole, reportRoleChange, YES_HELP } from './db-user.ts'
import { PRIVILEGES_HELP } from '../lib/pg-role-name.ts'
import { checkRoleName, connectServiceDb, createRole, dropRole, roleExists, PRIVILEGES } from './pg-role.ts'
import { registerTransfer } from './transfer.ts'
import { addFilterOptions, filterQuery, type FilterOptions } from './filters.ts'

function collect (value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value]
}

function positiveInt (value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new UsageError(`expected a positive whole number, got "${value}"`)
  return Number(value)
}

/** What the service answers for an invitation or an issued reset link (the Invitation and PasswordResetLink schemas). */
interface ApiInvitation { delivery: 'queued' | 'not_sent', mailed: boolean, expires_at: string, url?: string, code?: string }

function userRows (users: ApiUser[]): string[][] {
  return users.map(u => [u.id, u.username, cell(u.email), [u.first_name, u.last_name].filter(Boolean).join(' '), u.role, cell(u.groups), u.disabled ? 'yes' : ''])
}
const USER_HEAD = ['id', 'username', 'email', 'name', 'role', 'groups', 'disabled']

function showUser (user: ApiUser, json: boolean | undefined): void {
  if (json === true) printJson(user)
  else printRecord(user)
}

interface UserFieldOptions extends PasswordOptions {
  email?: string
  firstName?: string
  lastName?: string
  role?: string
  group?: string[]
  json?: boolean
}

interface CreateOptions extends UserFieldOptions {
  disabled?: boolean
  dbUser?: boolean
  dbRole?: string
  privileges: string
  yes?: boolean
}

interface UpdateOptions extends UserFieldOptions {
  username?: string
  clearGroups?: boolean
  disable?: boolean
  enable?: boolean
  ifMatch?: string
}

export function registerUsers (program: Command): void {
  const users = program.command('users').description('manage users through a running service (GATEHOUSE_URL, GATEHOUSE_API_KEY)')

  addFilterOptions(users.command('list').description('list users (every matching user unless --limit is given)'))
    .option('--limit <n>', 'show at most n users', positiveInt)
    .option('--json', 'print a JSON array')
    .action(async (options: FilterOptions & { limit?: number, json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const query = filterQuery(options)
      const all: ApiUser[] = []
      if (options.limit !== undefined) {
        query.set('limit', String(Math.min(options.limit, 1000)))
        for await (const page of client.users(query, Math.min(options.limit, 1000))) {
          all.push(...page)
          if (all.length >= options.limit) break
        }
        all.splice(options.limit)
      } else {
        for await (const page of client.users(query)) all.push(...page)
      }
      if (options.json === true) printJson(all)
      else printTable(USER_HEAD, userRows(all))
    })

  users.command('get')
    .description('show one user')
    .argument('<user>', 'user id or username')
    .option('--json', 'print JSON')
    .action(async (user: string, options: { json?: boolean }) => {
      showUser(await ApiClient.fromEnv().resolveUser(user), options.json)
    })

  users.command('create')
    .description('create a user; with --db-user also the matching PostgreSQL role (SERVICE_DATABASE_URL)')
    .argument('<username>', 'letters, digits and ._@-')
    .option('--email <address>', 'email address')
    .option('--first-name <name>', 'first name')
    .option('--last-name <name>', 'last name')
    .option('--role <role>', 'admin or user (default user)')
    .option('--group <group>', 'a group; repeat for several', collect)
    .option('--disabled', 'create the user disabled')
    .option('--password-stdin', 'read the password from standard input')
    .option('--password-prompt', 'ask for the password on the terminal')
    .option('--db-user', 'also create the database role, with the same password')
    .option('--db-role <name>', 'the database role\'s name (default: the username)')
    .option('--privileges <list>', `the database role's privileges, ${PRIVILEGES_HELP}`, DEFAULT_PRIVILEGES)
    .option('--yes', YES_HELP)
    .option('--json', 'print JSON')
    .action(async (username: string, options: CreateOptions) => {
      const client = ApiClient.fromEnv()
      const roleName = options.dbRole ?? username
      if (options.dbRole !== undefined && options.dbUser !== true) throw new UsageError('--db-role needs --db-user')
      const privileges = options.dbUser === true ? planRole(roleName, options.privileges) : undefined
      if (privileges !== undefined) await confirmPrivileges(roleName, privileges, options.yes)
      const password = await readPassword(options, { required: options.dbUser === true, confirm: true })
      const body: Record<string, unknown> = { username }
      if (options.email !== undefined) body.email = options.email
      if (options.firstName !== undefined) body.first_name = options.firstName
      if (options.lastName !== undefined) body.last_name = options.lastName
      if (options.role !== undefined) body.role = options.role
      if (options.group !== undefined) body.groups = options.group
      if (options.disabled === true) body.disabled = true
      if (password !== undefined) body.password = password

      // The database is reached, and the role checked absent, before the user exists.
      const db = privileges !== undefined ? await connectServiceDb() : undefined
      try {
        if (db !== undefined && await roleExists(db, roleName)) {
          throw new CliError(`a database role named "${roleName}" already exists; gatehouse never alters an existing role. Nothing was created.`)
        }
        const user = (await client.request<ApiUser>('POST', '/api/users', { body })).body
        if (db !== undefined && privileges !== undefined) {
          try {
            await createRole(db, roleName, privileges, password)
          } catch (error) {
            const reason = (error as Error).message
            try {
              await client.request('DELETE', `/api/users/${user.id}`)
            } catch (undo) {
              throw new CliError(`created user ${user.username} (${user.id}), but the database role failed: ${reason}; ` +
                `deleting the user again failed too: ${(undo as Error).message}. Delete it with: gatehouse users delete ${user.id}`)
            }
            throw new CliError(`the database role failed: ${reason}; the user ${user.username} was deleted again, so nothing was created`)
          }
        }
        const granted = privileges !== undefined ? PRIVILEGES.filter(p => privileges.has(p)) : undefined
        const eventId = granted !== undefined ? await reportRoleChange(client, { action: 'created', role: roleName, privileges: granted, userId: user.id }) : undefined
        if (options.json === true) {
          printJson(granted !== undefined ? { ...user, db_role: { name: roleName, privileges: granted, event_id: eventId } } : user)
        } else {
          printLine(`Created user ${user.username} (${user.id})`)
          if (granted !== undefined) printLine(`Created database role ${roleName} (${granted.join(', ')})`)
        }
      } finally {
        await db?.end()
      }
    })

  users.command('invite')
    .description('invite a new user to choose their own password (mailed to them, or printed to hand over when the service sends no mail); ' +
      'with --resend a new link for a pending user (the earlier stops working), with --revoke end their link')
    .argument('<user>', 'the new user\'s username; with --resend or --revoke, a user id or username')
    .option('--email <address>', 'email address (where the invitation is mailed)')
    .option('--first-name <name>', 'first name')
    .option('--last-name <name>', 'last name')
    .option('--role <role>', 'admin or user (default user)')
    .option('--group <group>', 'a group; repeat for several', collect)
    .option('--resend', 'send a pending user a new invitation')
    .option('--revoke', 'end a pending user\'s invitation link and code')
    .option('--json', 'print JSON')
    .action(async (target: string, options: UserFieldOptions & { resend?: boolean, revoke?: boolean }) => {
      if (options.resend === true && options.revoke === true) throw new UsageError('give --resend or --revoke, not both')
      const existing = options.resend === true || options.revoke === true
      if (existing && [options.email, options.firstName, options.lastName, options.role, options.group].some(o => o !== undefined)) {
        throw new UsageError('--resend and --revoke take no user fields; change the user with gatehouse users update')
      }
      const client = ApiClient.fromEnv()
      if (options.revoke === true) {
        const user = await client.resolveUser(target)
        await client.request('DELETE', `/api/users/${user.id}/invitation`)
        if (options.json === true) printJson({ revoked: { id: user.id, username: user.username } })
        else printLine(`Revoked the invitation of ${user.username} (${user.id}); they stay pending: resend it, or delete them`)
        return
      }
      let user: ApiUser
      let invitation: ApiInvitation
      if (options.resend === true) {
        user = await client.resolveUser(target)
        invitation = (await client.request<ApiInvitation>('POST', `/api/users/${user.id}/invitation`)).body
      } else {
        const body: Record<string, unknown> = { username: target, invite: true }
        if (options.email !== undefined) body.email = options.email
        if (options.firstName !== undefined) body.first_name = options.firstName
        if (options.lastName !== undefined) body.last_name = options.lastName
        if (options.role !== undefined) body.role = options.role
        if (options.group !== undefined) body.groups = options.group
        const created = (await client.request<ApiUser & { invitation: ApiInvitation }>('POST', '/api/users', { body })).body
        invitation = created.invitation
        user = created
      }
      if (options.json === true) {
        printJson({ user: { id: user.id, username: user.username, email: user.email }, invitation })
        return
      }
      printLine(`${options.resend === true ? 'Sent a new invitation to' : 'Invited'} ${user.username} (${user.id})`)
      if (invitation.delivery === 'queued') {
        printLine(`Queued for mailing to ${user.email ?? ''} (the service's outbox sends it; /auth/readyz checks.mail says whether mail goes out); the link works once, until ${invitation.expires_at}`)
      } else {
        printLine(`No mail is sent by this service: hand this link to ${user.username}. It works once, until ${invitation.expires_at}:`)
        printLine(invitation.url ?? '')
        printLine(`Or they type their username and the code ${invitation.code ?? ''} at the invitation page.`)
      }
    })

  users.command('reset-password')
    .description('issue a one-time link for the user to choose a new password: mailed to them, or printed to hand over when the service sends no mail')
    .argument('<user>', 'user id or username')
    .option('--json', 'print JSON')
    .action(async (target: string, options: { json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const user = await client.resolveUser(target)
      const link = (await client.request<ApiInvitation>('POST', `/api/users/${user.id}/password-reset`)).body
      if (options.json === true) {
        printJson({ user: { id: user.id, username: user.username, email: user.email }, password_reset: link })
      } else if (link.delivery === 'queued') {
        printLine(`Queued a password-reset link for mailing to ${user.username} at ${user.email ?? ''}; it works once, until ${link.expires_at}`)
      } else {
        printLine(`No mail is sent by this service: hand this link to ${user.username}. It works once, until ${link.expires_at}:`)
        printLine(link.url ?? '')
        printLine(`Or they type their username and the code ${link.code ?? ''} at the reset page.`)
      }
    })

  users.command('update')
    .description('change a user (a JSON merge patch: only the given fields change)')
    .argument('<user>', 'user id or username')
    .option('--username <name>', 'new username')
    .option('--email <address>', 'new email; "" clears it')
    .option('--first-name <name>', 'new first name; "" clears it')
    .option('--last-name <name>', 'new last name; "" clears it')
    .option('--role <role>', 'admin or user')
    .option('--group <group>', 'replace the groups with these; repeat for several', collect)
    .option('--clear-groups', 'remove every group')
    .option('--disable', 'disable the user (revokes their API keys)')
    .option('--enable', 'enable the user')
    .option('--password-stdin', 'read a new password from standard input')
    .option('--password-prompt', 'ask for a new password on the terminal')
    .option('--if-match <etag>', 'only if the user is still at this version (the ETag, e.g. \'"3"\')')
    .option('--json', 'print JSON')
    .action(async (target: string, options: UpdateOptions) => {
      if (options.disable === true && options.enable === true) throw new UsageError('give --disable or --enable, not both')
      if (options.clearGroups === true && options.group !== undefined) throw new UsageError('give --group or --clear-groups, not both')
      const patch: Record<string, unknown> = {}
      if (options.username !== undefined) patch.username = options.username
      if (options.email !== undefined) patch.email = options.email === '' ? null : options.email
      if (options.firstName !== undefined) patch.first_name = options.firstName === '' ? null : options.firstName
      if (options.lastName !== undefined) patch.last_name = options.lastName === '' ? null : options.lastName
      if (options.role !== undefined) patch.role = options.role
      if (options.group !== undefined) patch.groups = options.group
      if (options.clearGroups === true) patch.groups = []
      if (options.disable === true) patch.disabled = true
      if (options.enable === true) patch.disabled = false
      const client = ApiClient.fromEnv()
      const password = await readPassword(options, { required: false, confirm: true })
      if (password !== undefined) patch.password = password
      if (Object.keys(patch).length === 0) throw new UsageError('nothing to change: give at least one field option (see --help)')
      const user = await client.resolveUser(target)
      const headers: Record<string, string> = options.ifMatch !== undefined ? { 'if-match': options.ifMatch } : {}
      const updated = (await client.request<ApiUser>('PATCH', `/api/users/${user.id}`, { body: patch, contentType: 'application/merge-patch+json', headers })).body
      if (options.json === true) printJson(updated)
      else printLine(`Updated user ${updated.username} (${updated.id})`)
    })

  users.command('delete')
    .description('delete a user; with --db-user also drop the matching PostgreSQL role (SERVICE_DATABASE_URL)')
    .argument('<user>', 'user id or username (looked up through the list operation)')
    .option('--db-user', 'also drop the database role')
    .option('--db-role <name>', 'the database role\'s name (default: the username)')
    .option('--json', 'print JSON')
    .action(async (target: string, options: { dbUser?: boolean, dbRole?: string, json?: boolean }) => {
      if (options.dbRole !== undefined && options.dbUser !== true) throw new UsageError('--db-role needs --db-user')
      const client = ApiClient.fromEnv()
      const user = await client.resolveUser(target)
      const roleName = options.dbUser === true ? (options.dbRole ?? user.username) : undefined
      if (roleName !== undefined) checkRoleName(roleName)
      const db = roleName !== undefined ? await connectServiceDb() : undefined
      try {
        if (db !== undefined && roleName !== undefined && !await roleExists(db, roleName)) {
          throw new CliError(`no database role is named "${roleName}"; the user was not deleted (pass --db-role if the role has another name)`)
        }
        try {
          await client.request('DELETE', `/api/users/${user.id}`)
        } catch (error) {
          if (error instanceof ApiError && error.status === 404) throw new CliError(`no user has the id ${user.id} (deleted meanwhile?)`)
          throw error
        }
        if (db !== undefined && roleName !== undefined) {
          try {
            await dropRole(db, roleName)
          } catch (error) {
            throw new CliError(`deleted user ${user.username} (${user.id}), but the database role was not dropped: ${(error as Error).message}`)
          }
          await reportRoleChange(client, { action: 'dropped', role: roleName, userId: user.id })
        }
      } finally {
        await db?.end()
      }
      if (options.json === true) printJson({ deleted: { id: user.id, username: user.username }, db_role: roleName ?? null })
      else {
        printLine(`Deleted user ${user.username} (${user.id})`)
        if (roleName !== undefined) printLine(`Dropped database role ${roleName}`)
      }
    })

  registerTransfer(users)
}
