import type { Command } from 'commander'
import { ApiClient, type ApiGroup, type ApiUser } from './http.ts'
import { cell, printJson, printLine, printRecord, printTable, UsageError } from './output.ts'

function collect (value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value]
}

const GROUP_HEAD = ['id', 'name', 'members', 'external id']
function groupRows (groups: ApiGroup[]): string[][] {
  return groups.map(g => [g.id, g.display_name, String(g.member_count), cell(g.external_id)])
}

const MEMBER_HEAD = ['id', 'username', 'email', 'name', 'role', 'disabled']
function memberRows (users: ApiUser[]): string[][] {
  return users.map(u => [u.id, u.username, cell(u.email), [u.first_name, u.last_name].filter(Boolean).join(' '), u.role, u.disabled ? 'yes' : ''])
}

async function userIds (client: ApiClient, users: string[]): Promise<string[]> {
  const ids: string[] = []
  for (const user of users) ids.push((await client.resolveUser(user)).id)
  return [...new Set(ids)]
}

export function registerGroups (program: Command): void {
  const groups = program.command('groups').description('manage groups and their members through a running service (GATEHOUSE_URL, GATEHOUSE_API_KEY)')

  groups.command('list')
    .description('list groups with their member counts, in name order')
    .option('--search <text>', 'only groups whose name contains this, ignoring case')
    .option('--json', 'print a JSON array')
    .action(async (options: { search?: string, json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const query = new URLSearchParams({ limit: '1000' })
      if (options.search !== undefined) query.set('q', options.search)
      const all: ApiGroup[] = []
      for await (const page of client.pages<ApiGroup>(`/api/groups?${query.toString()}`)) all.push(...page)
      if (options.json === true) printJson(all)
      else printTable(GROUP_HEAD, groupRows(all))
    })

  groups.command('create')
    .description('create a group')
    .argument('<name>', 'the group\'s name, as users\' groups hold it')
    .option('--external-id <id>', 'a provisioning client\'s id for the group')
    .option('--member <user>', 'a first member (user id or username); repeat for several', collect)
    .option('--json', 'print JSON')
    .action(async (name: string, options: { externalId?: string, member?: string[], json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const body: Record<string, unknown> = { display_name: name }
      if (options.externalId !== undefined) body.external_id = options.externalId
      if (options.member !== undefined) body.member_ids = await userIds(client, options.member)
      const group = (await client.request<ApiGroup>('POST', '/api/groups', { body })).body
      if (options.json === true) printJson(group)
      else printLine(`Created group ${group.display_name} (${group.id}) with ${group.member_count} member${group.member_count === 1 ? '' : 's'}`)
    })

  groups.command('rename')
    .description('rename a group; every member\'s groups change with it')
    .argument('<group>', 'group id or name')
    .argument('<new-name>', 'the new name')
    .option('--if-match <etag>', 'only if the group is still at this version (the ETag, e.g. \'"3"\')')
    .option('--json', 'print JSON')
    .action(async (target: string, newName: string, options: { ifMatch?: string, json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const group = await client.resolveGroup(target)
      const headers: Record<string, string> = options.ifMatch !== undefined ? { 'if-match': options.ifMatch } : {}
      const renamed = (await client.request<ApiGroup>('PATCH', `/api/groups/${group.id}`, { body: { display_name: newName }, contentType: 'application/merge-patch+json', headers })).body
      if (options.json === true) printJson(renamed)
      else printLine(`Renamed group ${group.display_name} to ${renamed.display_name} (${renamed.id}); ${renamed.member_count} member${renamed.member_count === 1 ? '' : 's'} changed`)
    })

  groups.command('delete')
    .description('delete a group; its name leaves every member\'s groups')
    .argument('<group>', 'group id or name')
    .option('--json', 'print JSON')
    .action(async (target: string, options: { json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const group = await client.resolveGroup(target)
      await client.request('DELETE', `/api/groups/${group.id}`)
      if (options.json === true) printJson({ deleted: { id: group.id, display_name: group.display_name } })
      else printLine(`Deleted group ${group.display_name} (${group.id})`)
    })

  groups.command('members')
    .description('list a group\'s members, in username order')
    .argument('<group>', 'group id or name')
    .option('--json', 'print a JSON array of users')
    .action(async (target: string, options: { json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const group = await client.resolveGroup(target)
      const all: ApiUser[] = []
      for await (const page of client.pages<ApiUser>(`/api/groups/${group.id}/members?limit=1000`)) all.push(...page)
      if (options.json === true) printJson(all)
      else printTable(MEMBER_HEAD, memberRows(all))
    })

  groups.command('add')
    .description('add users to a group (in one request: all or none)')
    .argument('<group>', 'group id or name')
    .argument('<users...>', 'user ids or usernames')
    .option('--json', 'print the group as JSON')
    .action(async (target: string, users: string[], options: { json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const group = await client.resolveGroup(target)
      const ids = await userIds(client, users)
      if (ids.length > 1000) throw new UsageError('at most 1000 users at a time')
      const changed = (await client.request<ApiGroup>('POST', `/api/groups/${group.id}/members`, { body: { user_ids: ids } })).body
      if (options.json === true) printJson(changed)
      else printLine(`Group ${changed.display_name} (${changed.id}) has ${changed.member_count} member${changed.member_count === 1 ? '' : 's'}`)
    })

  groups.command('remove')
    .description('take users out of a group (one request per user)')
    .argument('<group>', 'group id or name')
    .argument('<users...>', 'user ids or usernames')
    .option('--json', 'print the group as JSON')
    .action(async (target: string, users: string[], options: { json?: boolean }) => {
      const client = ApiClient.fromEnv()
      const group = await client.resolveGroup(target)
      for (const id of await userIds(client, users)) await client.request('DELETE', `/api/groups/${group.id}/members/${id}`)
      const changed = (await client.request<ApiGroup>('GET', `/api/groups/${group.id}`)).body
      if (options.json === true) printJson(changed)
      else printLine(`Group ${changed.display_name} (${changed.id}) has ${changed.member_count} member${changed.member_count === 1 ? '' : 's'}`)
    })

  groups.command('get')
    .description('show one group')
    .argument('<group>', 'group id or name')
    .option('--json', 'print JSON')
    .action(async (target: string, options: { json?: boolean }) => {
      const group = await ApiClient.fromEnv().resolveGroup(target)
      if (options.json === true) printJson(group)
      else printRecord(group)
    })
}
