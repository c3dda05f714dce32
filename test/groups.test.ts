import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, it } from 'node:test'
import { sql } from 'kysely'
import type { Config } from '../src/config.ts'
import * as groupsMigration from '../src/db/migrations/0012_groups.ts'
import * as memberOrderMigration from '../src/db/migrations/0018_group_member_order.ts'
import * as nameKeyMigration from '../src/db/migrations/0025_group_name_key.ts'
import type { Kysely } from 'kysely'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'
import { Receiver } from './webhook-receiver.ts'
import { waitFor } from './polling.ts'

/** Short webhook intervals, so deliveries arrive within a test's patience; the receiver is on 127.0.0.1. */
const FAST: Partial<Config> = { webhookAllowPrivate: true, webhookPollIntervalMs: 50, webhookRetryBaseMs: 50, webhookRetryMaxDelayMs: 200, webhookTimeoutMs: 2000 }

interface Group { id: string, display_name: string, external_id: string | null, member_count: number, created_at: string, updated_at: string }
interface User { id: string, username: string, role: string, groups: string[], updated_at: string, disabled: boolean }
interface Event { id: string, type: string, target: { type: string, id: string } | null, data: Record<string, any> }

for (const dialect of dialects()) {
  describe(`groups (${dialect.name})`, () => {
    const t = useTestApp(dialect, FAST)
    const receiver = new Receiver()
    let receiverUrl: string
    before(async () => { receiverUrl = await receiver.listen() })
    after(async () => { await receiver.close() })

    const call = async (method: 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE', url: string, payload?: unknown, headers: Record<string, string> = {}, key?: string) =>
      await t.app.inject({ method, url: `/auth${url}`, headers: { ...auth(key ?? t.adminKey), ...headers }, ...(payload !== undefined ? { payload: payload as Record<string, unknown> } : {}) })

    const createUser = async (groups: string[] = [], extra: Record<string, unknown> = {}): Promise<User> => {
      const res = await call('POST', '/api/users', { username: uniqueName('member'), groups, ...extra })
      assert.equal(res.statusCode, 201, res.body)
      return res.json()
    }
    const getUser = async (id: string): Promise<User> => {
      const res = await call('GET', `/api/users/${id}`)
      assert.equal(res.statusCode, 200, res.body)
      return res.json()
    }
    const createGroup = async (payload: Record<string, unknown>): Promise<Group> => {
      const res = await call('POST', '/api/groups', payload)
      assert.equal(res.statusCode, 201, res.body)
      return res.json()
    }
    const getGroup = async (id: string): Promise<Group & { etag: string }> => {
      const res = await call('GET', `/api/groups/${id}`)
      assert.equal(res.statusCode, 200, res.body)
      return { ...res.json(), etag: String(res.headers.etag) }
    }
    const groupNamed = async (name: string): Promise<Group | undefined> => {
      const res = await call('GET', `/api/groups?display_name=${encodeURIComponent(name)}`)
      assert.equal(res.statusCode, 200, res.body)
      return res.json()[0]
    }
    const memberIds = async (id: string): Promise<string[]> => {
      const res = await call('GET', `/api/groups/${id}/members?limit=1000`)
      assert.equal(res.statusCode, 200, res.body)
      return (res.json() as User[]).map(u => u.id).sort()
    }
    /** The users the `group=` filter of the users list finds. */
    const filteredIds = async (name: string): Promise<string[]> => {
      const res = await call('GET', `/api/users?group=${encodeURIComponent(name)}`)
      assert.equal(res.statusCode, 200, res.body)
      return (res.json() as User[]).map(u => u.id).sort()
    }
    /** Every user whose array holds the name, read from each user resource. */
    const holdersOf = async (name: string, users: User[]): Promise<string[]> =>
      (await Promise.all(users.map(async u => await getUser(u.id)))).filter(u => u.groups.includes(name)).map(u => u.id).sort()
    const events = async (query: string): Promise<Event[]> => {
      const res = await call('GET', `/api/events?${query}&limit=1000`)
      assert.equal(res.statusCode, 200, res.body)
      return res.json()
    }
    const keyWith = async (scopes: string[]): Promise<string> => {
      const res = await call('POST', '/api/api-keys', { name: uniqueName('key'), scopes })
      assert.equal(res.statusCode, 201, res.body)
      return res.json().key
    }

    it('creates a group with 201, Location and ETag, and reads it back with its member count', async () => {
      const [a, b] = [await createUser(), await createUser()]
      const name = uniqueName('team')
      const res = await call('POST', '/api/groups', { display_name: name, external_id: 'okta-00g1', member_ids: [a.id, b.id] })
      assert.equal(res.statusCode, 201, res.body)
      const group = res.json() as Group
      assert.equal(res.headers.location, `/auth/api/groups/${group.id}`)
      assert.match(String(res.headers.etag), /^"\d+"$/)
      assert.deepEqual([group.display_name, group.external_id, group.member_count], [name, 'okta-00g1', 2])
      const read = await getGroup(group.id)
      assert.equal(read.member_count, 2)
      assert.equal(read.etag, res.headers.etag)
      assert.deepEqual((await getUser(a.id)).groups, [name])
      assert.deepEqual(await memberIds(group.id), [a.id, b.id].sort())
    })

    it('refuses a second group of the same name with 409 group_exists, and a rename onto a taken name too', async () => {
      const name = uniqueName('dup')
      const first = await createGroup({ display_name: name })
      const res = await call('POST', '/api/groups', { display_name: name })
      assert.equal(res.statusCode, 409, res.body)
      assert.equal(res.json().code, 'group_exists')
      assert.match(String(res.headers['content-type']), /^application\/problem\+json/)
      const other = await createGroup({ display_name: uniqueName('other') })
      const rename = await call('PATCH', `/api/groups/${other.id}`, { display_name: first.display_name })
      assert.equal(rename.statusCode, 409, rename.body)
      assert.equal(rename.json().code, 'group_exists')
    })

    it('answers 404 group_not_found for a group that does not exist, on every operation', async () => {
      const id = randomUUID()
      const user = await createUser()
      for (const [method, url, payload] of [
        ['GET', `/api/groups/${id}`], ['PATCH', `/api/groups/${id}`, { display_name: 'x' }], ['DELETE', `/api/groups/${id}`],
        ['GET', `/api/groups/${id}/members`], ['POST', `/api/groups/${id}/members`, { user_ids: [user.id] }],
        ['PUT', `/api/groups/${id}/members`, { user_ids: [] }], ['DELETE', `/api/groups/${id}/members/${user.id}`]
      ] as const) {
        const res = await call(method, url, payload)
        assert.equal(res.statusCode, 404, `${method} ${url}: ${res.body}`)
        assert.equal(res.json().code, 'group_not_found')
      }
      assert.deepEqual((await getUser(user.id)).groups, [])
    })

    it('lists groups in name order with member counts, a page at a time through Link, and filters by name', async () => {
      const stem = uniqueName('page')
      const made: Group[] = []
      for (let i = 0; i < 5; i++) made.push(await createGroup({ display_name: `${stem}-${i}` }))
      const user = await createUser([`${stem}-1`, `${stem}-3`])
      const other = await createUser([`${stem}-3`])
      const seen: Group[] = []
      let url: string | undefined = `/api/groups?q=${stem.toUpperCase()}&limit=2`
      while (url !== undefined) {
        const res = await call('GET', url)
        assert.equal(res.statusCode, 200, res.body)
        seen.push(...res.json() as Group[])
        const link = res.headers.link as string | undefined
        url = link !== undefined ? /^<\/auth([^>]*)>; rel="next"$/.exec(link)![1] : undefined
      }
      assert.deepEqual(seen.map(g => g.display_name), made.map(g => g.display_name))
      assert.deepEqual(seen.map(g => g.member_count), [0, 1, 0, 2, 0])
      assert.deepEqual((await groupNamed(`${stem}-3`))?.member_count, 2)
      assert.equal(await groupNamed(`${stem}-9`), undefined)
      assert.deepEqual(await memberIds(made[3]!.id), [user.id, other.id].sort())
    })

    it('pages group= in every sort order as the users list orders the members, after renames, updates and joins', async () => {
      const group = uniqueName('order')
      const members = [await createUser([group]), await createUser([group]), await createUser(), await createUser([group]), await createUser([group])]
      await createUser(['x-not-' + group])
      // A member renamed to sort first by username, one updated later, one who joins last (through the group).
      assert.equal((await call('PATCH', `/api/users/${members[3]!.id}`, { username: `a${uniqueName('first')}` })).statusCode, 200)
      assert.equal((await call('PATCH', `/api/users/${members[0]!.id}`, { first_name: 'Later' })).statusCode, 200)
      const read = await getGroup((await groupNamed(group))!.id)
      assert.equal((await call('POST', `/api/groups/${read.id}/members`, { user_ids: [members[2]!.id] }, { 'if-match': read.etag })).statusCode, 200)
      const now = await Promise.all(members.map(async u => await getUser(u.id))) as Array<User & { created_at: string }>
      const keyOf: Record<string, (u: User & { created_at: string }) => string> = {
        created_at: u => u.created_at, updated_at: u => u.updated_at, username: u => u.username.toLowerCase()
      }
      for (const sort of ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at']) {
        const key = keyOf[sort.replace('-', '')]!
        const expected = [...now].sort((a, b) => key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0).map(u => u.id)
        if (sort.startsWith('-')) expected.reverse()
        const seen: string[] = []
        let url: string | undefined = `/api/users?group=${encodeURIComponent(group)}&sort=${sort}&limit=2`
        while (url !== undefined) {
          const res = await call('GET', url)
          assert.equal(res.statusCode, 200, res.body)
          seen.push(...(res.json() as User[]).map(u => u.id))
          const link = res.headers.link as string | undefined
          url = link !== undefined ? /^<\/auth([^>]*)>; rel="next"$/.exec(link)![1] : undefined
        }
        assert.deepEqual(seen, expected, sort)
      }
    })

    it('keeps the 3.6.1 groups array as sent: a new name through /auth/users makes the group, and the array reads back unchanged', async () => {
      const name = uniqueName('new-team')
      const res = await t.app.inject({ method: 'POST', url: '/auth/users', headers: auth(t.adminKey), payload: { username: uniqueName('legacy'), groups: ['analysts', name] } })
      assert.equal(res.statusCode, 201, res.body)
      const user = res.json() as User
      assert.deepEqual(user.groups, ['analysts', name])
      const legacyRead = await t.app.inject({ url: `/auth/users/${user.id}`, headers: auth(t.adminKey) })
      assert.deepEqual(legacyRead.json().groups, ['analysts', name], 'the order is kept')
      const group = await groupNamed(name)
      assert.ok(group !== undefined, 'the group exists')
      assert.deepEqual(await memberIds(group.id), [user.id])
      const created = await events(`type=group.created&target_id=${group.id}`)
      assert.equal(created.length, 1)
      assert.equal(created[0]!.data.source, 'user_groups')
      // A form body, as 3.6.1 clients also send it.
      const form = await t.app.inject({ method: 'POST', url: '/auth/users', headers: { ...auth(t.adminKey), 'content-type': 'application/x-www-form-urlencoded' }, payload: `username=${uniqueName('form')}&groups=${name}` })
      assert.equal(form.statusCode, 201, form.body)
      assert.deepEqual(form.json().groups, [name])
      assert.equal((await groupNamed(name))?.member_count, 2)
      // Changing the array through 3.6.1's PATCH changes the memberships.
      const patched = await t.app.inject({ method: 'PATCH', url: `/auth/users/${user.id}`, headers: auth(t.adminKey), payload: { groups: [name] } })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.deepEqual(patched.json().groups, [name])
      const analysts = await groupNamed('analysts')
      assert.ok(!(await memberIds(analysts!.id)).includes(user.id))
    })

    it('agrees on membership whether it was changed through the user array or through the group', async () => {
      const name = uniqueName('agree')
      const group = await createGroup({ display_name: name })
      const users = [await createUser([name]), await createUser(), await createUser(), await createUser(['x-other', name])]
      const check = async (expected: string[]): Promise<void> => {
        const want = expected.sort()
        assert.deepEqual(await memberIds(group.id), want, 'the group\'s members')
        assert.deepEqual(await filteredIds(name), want, 'the users list\'s group= filter')
        assert.deepEqual(await holdersOf(name, users), want, 'the users whose groups hold the name')
        assert.equal((await getGroup(group.id)).member_count, want.length)
      }
      await check([users[0]!.id, users[3]!.id])
      const add = await call('POST', `/api/groups/${group.id}/members`, { user_ids: [users[1]!.id, users[0]!.id] })
      assert.equal(add.statusCode, 200, add.body)
      await check([users[0]!.id, users[1]!.id, users[3]!.id])
      const patch = await call('PATCH', `/api/users/${users[2]!.id}`, { groups: [name] })
      assert.equal(patch.statusCode, 200, patch.body)
      const drop = await call('PATCH', `/api/users/${users[3]!.id}`, { groups: ['x-other'] })
      assert.equal(drop.statusCode, 200, drop.body)
      await check([users[0]!.id, users[1]!.id, users[2]!.id])
      const remove = await call('DELETE', `/api/groups/${group.id}/members/${users[0]!.id}`)
      assert.equal(remove.statusCode, 204, remove.body)
      await check([users[1]!.id, users[2]!.id])
      const again = await call('DELETE', `/api/groups/${group.id}/members/${users[0]!.id}`)
      assert.equal(again.statusCode, 204, 'removing a non-member is not an error')
      const replace = await call('PUT', `/api/groups/${group.id}/members`, { user_ids: [users[3]!.id, users[2]!.id] })
      assert.equal(replace.statusCode, 200, replace.body)
      assert.equal(replace.json().member_count, 2)
      await check([users[2]!.id, users[3]!.id])
      assert.deepEqual((await getUser(users[3]!.id)).groups, ['x-other', name], 'a name joins the end of the array')
    })

    it('renames a group in every member\'s groups, each with a user.updated event and a new version', async () => {
      const name = uniqueName('rename')
      const members = [await createUser(['first', name, 'last']), await createUser([name])]
      const outsider = await createUser(['first'])
      const group = (await groupNamed(name))!
      const before = await Promise.all(members.map(async m => await t.app.inject({ url: `/auth/api/users/${m.id}`, headers: auth(t.adminKey) })))
      const read = await getGroup(group.id)
      const to = uniqueName('renamed')
      const res = await call('PATCH', `/api/groups/${group.id}`, { display_name: to }, { 'if-match': read.etag, 'content-type': 'application/merge-patch+json' })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.json().display_name, to)
      assert.notEqual(res.headers.etag, read.etag)
      assert.deepEqual((await getUser(members[0]!.id)).groups, ['first', to, 'last'], 'renamed in place')
      assert.deepEqual((await getUser(members[1]!.id)).groups, [to])
      assert.deepEqual((await getUser(outsider.id)).groups, ['first'])
      for (const [i, member] of members.entries()) {
        const etag = (await t.app.inject({ url: `/auth/api/users/${member.id}`, headers: auth(t.adminKey) })).headers.etag
        assert.notEqual(etag, before[i]!.headers.etag, 'a new version of the member')
        const updated = await events(`type=user.updated&target_id=${member.id}`)
        assert.deepEqual(updated[0]!.data.changes.groups.to, (await getUser(member.id)).groups)
      }
      const [groupEvent] = await events(`type=group.updated&target_id=${group.id}`)
      assert.deepEqual(groupEvent!.data.changes, { display_name: { from: name, to } })
      assert.equal(await groupNamed(name), undefined, 'no group keeps or regains the old name')
      assert.deepEqual(await filteredIds(to), members.map(m => m.id).sort())
      const stale = await call('PATCH', `/api/groups/${group.id}`, { display_name: uniqueName('late') }, { 'if-match': read.etag })
      assert.equal(stale.statusCode, 412, stale.body)
      assert.equal(stale.json().code, 'precondition_failed')
    })

    it('deletes a group from every member\'s groups, with group.deleted listing them', async () => {
      const name = uniqueName('gone')
      const members = [await createUser([name, 'stays']), await createUser([name])]
      const group = (await groupNamed(name))!
      const res = await call('DELETE', `/api/groups/${group.id}`)
      assert.equal(res.statusCode, 204, res.body)
      assert.deepEqual((await getUser(members[0]!.id)).groups, ['stays'])
      assert.deepEqual((await getUser(members[1]!.id)).groups, [])
      assert.equal((await call('GET', `/api/groups/${group.id}`)).statusCode, 404)
      assert.deepEqual(await filteredIds(name), [])
      const [deleted] = await events(`type=group.deleted&target_id=${group.id}`)
      assert.deepEqual([deleted!.data.display_name, [...deleted!.data.member_ids].sort()], [name, members.map(m => m.id).sort()])
      for (const member of members) {
        const [updated] = await events(`type=user.updated&target_id=${member.id}`)
        assert.ok(!(updated!.data.changes.groups.to as string[]).includes(name))
      }
    })

    it('records group.created, group.updated, group.members_added, group.members_removed and group.deleted, and delivers each as a webhook', async () => {
      receiver.answer = () => 204
      const hook = await call('POST', '/api/webhooks', { url: receiverUrl, event_types: ['group.*'], description: 'groups' })
      assert.equal(hook.statusCode, 201, hook.body)
      try {
        const [a, b] = [await createUser(), await createUser()]
        const group = await createGroup({ display_name: uniqueName('hooked') })
        assert.equal((await call('PATCH', `/api/groups/${group.id}`, { external_id: 'entra-1' })).statusCode, 200)
        assert.equal((await call('POST', `/api/groups/${group.id}/members`, { user_ids: [a.id, b.id] })).statusCode, 200)
        assert.equal((await call('DELETE', `/api/groups/${group.id}/members/${b.id}`)).statusCode, 204)
        assert.equal((await call('DELETE', `/api/groups/${group.id}`)).statusCode, 204)
        const recorded = (await events(`target_id=${group.id}`)).reverse()
        assert.deepEqual(recorded.map(e => e.type), ['group.created', 'group.updated', 'group.members_added', 'group.members_removed', 'group.deleted'])
        assert.deepEqual(recorded[1]!.data.changes, { external_id: { from: null, to: 'entra-1' } })
        assert.deepEqual(recorded[2]!.data.user_ids, [a.id, b.id])
        assert.deepEqual(recorded[3]!.data.user_ids, [b.id])
        assert.deepEqual(recorded[4]!.data.member_ids, [a.id])
        for (const event of recorded) {
          await waitFor(`the delivery of ${event.type}`, () => receiver.accepted().has(event.id))
          assert.deepEqual(JSON.parse(receiver.received.find(r => r.id === event.id)!.body), event, 'the webhook delivers the event as GET /api/events shows it')
        }
      } finally {
        await call('DELETE', `/api/webhooks/${hook.json().id}`)
      }
    })

    it('records the membership a user\'s array changes as group events too, and a deleted user leaves their groups', async () => {
      const name = uniqueName('arr')
      const user = await createUser([name])
      const group = (await groupNamed(name))!
      const added = await events(`type=group.members_added&target_id=${group.id}`)
      assert.deepEqual(added.map(e => e.data.user_ids), [[user.id]])
      assert.equal((await call('PATCH', `/api/users/${user.id}`, { groups: [] })).statusCode, 200)
      assert.deepEqual((await events(`type=group.members_removed&target_id=${group.id}`)).map(e => e.data.user_ids), [[user.id]])
      assert.equal((await call('PATCH', `/api/users/${user.id}`, { groups: [name] })).statusCode, 200)
      const before = await getGroup(group.id)
      assert.equal((await call('DELETE', `/api/users/${user.id}`)).statusCode, 204)
      const after = await getGroup(group.id)
      assert.equal(after.member_count, 0)
      assert.notEqual(after.etag, before.etag, 'a new version of the group')
      const [removed] = await events(`type=group.members_removed&target_id=${group.id}`)
      assert.deepEqual([removed!.data.user_ids, removed!.data.reason], [[user.id], 'user_deleted'])
    })

    it('gives an import\'s users their memberships, with one group.members_added per group listing them all', async () => {
      const name = uniqueName('imported')
      const existing = await createGroup({ display_name: uniqueName('existing') })
      const res = await call('POST', '/api/users/import', {
        users: [
          { username: uniqueName('imp'), groups: [name, existing.display_name] },
          { username: uniqueName('imp'), groups: [name] },
          { username: uniqueName('imp') }
        ]
      })
      assert.equal(res.statusCode, 200, res.body)
      const ids = (res.json().results as Array<{ id: string }>).map(r => r.id)
      const made = (await groupNamed(name))!
      assert.deepEqual(await memberIds(made.id), [ids[0]!, ids[1]!].sort())
      assert.deepEqual(await memberIds(existing.id), [ids[0]!])
      assert.deepEqual((await events(`type=group.members_added&target_id=${made.id}`)).map(e => [...e.data.user_ids].sort()), [[ids[0]!, ids[1]!].sort()])
      assert.equal((await events(`type=group.created&target_id=${made.id}`)).length, 1)
    })

    it('makes POST /api/groups retry-safe with Idempotency-Key: a retry gets the first answer and makes no second group', async () => {
      const key = randomUUID()
      const payload = { display_name: uniqueName('retry') }
      const first = await call('POST', '/api/groups', payload, { 'idempotency-key': key })
      assert.equal(first.statusCode, 201, first.body)
      const retry = await call('POST', '/api/groups', payload, { 'idempotency-key': key })
      assert.equal(retry.statusCode, 201, retry.body)
      assert.equal(retry.body, first.body)
      assert.equal(retry.headers['idempotent-replayed'], 'true')
      assert.equal(retry.headers.location, first.headers.location)
      const other = await call('POST', '/api/groups', { display_name: uniqueName('retry') }, { 'idempotency-key': key })
      assert.equal(other.statusCode, 422, other.body)
      assert.equal(other.json().code, 'idempotency_key_reused')
      assert.equal((await events(`type=group.created&target_id=${first.json().id}`)).length, 1)
    })

    it('lets users:read list and read groups but not change them; users:write changes them but not an admin\'s groups', async () => {
      const reader = await keyWith(['users:read'])
      const writer = await keyWith(['users:read', 'users:write'])
      const group = await createGroup({ display_name: uniqueName('scoped') })
      assert.equal((await call('GET', '/api/groups', undefined, {}, reader)).statusCode, 200)
      assert.equal((await call('GET', `/api/groups/${group.id}/members`, undefined, {}, reader)).statusCode, 200)
      const refused = await call('POST', '/api/groups', { display_name: uniqueName('nope') }, {}, reader)
      assert.equal(refused.statusCode, 403, refused.body)
      assert.equal((await call('DELETE', `/api/groups/${group.id}`, undefined, {}, reader)).statusCode, 403)
      assert.equal((await call('GET', '/api/groups', undefined, {}, 'gatehouse_not-a-key')).statusCode, 401)
      const user = await createUser()
      const admin = await createUser([], { role: 'admin' })
      assert.equal((await call('POST', `/api/groups/${group.id}/members`, { user_ids: [user.id] }, {}, writer)).statusCode, 200)
      const forAdmin = await call('POST', `/api/groups/${group.id}/members`, { user_ids: [admin.id] }, {}, writer)
      assert.equal(forAdmin.statusCode, 403, forAdmin.body)
      assert.deepEqual((await getUser(admin.id)).groups, [])
      assert.deepEqual(await memberIds(group.id), [user.id], 'the refused request changed nobody')
      assert.equal((await call('POST', `/api/groups/${group.id}/members`, { user_ids: [admin.id] })).statusCode, 200, 'an admin may')
      const rename = await call('PATCH', `/api/groups/${group.id}`, { display_name: uniqueName('taken-over') }, {}, writer)
      assert.equal(rename.statusCode, 403, 'renaming changes the admin member\'s groups')
      assert.equal((await getGroup(group.id)).display_name, group.display_name)
    })

    it('leaves the last-admin rule as it was: group changes never touch a role, and the last admin still cannot be disabled', async () => {
      const own = await createUser([], { role: 'admin' })
      const admins = await call('GET', '/api/users?role=admin&disabled=false')
      const enabledAdmins = admins.json() as User[]
      const group = await createGroup({ display_name: uniqueName('admins'), member_ids: enabledAdmins.map(a => a.id) })
      assert.equal((await call('PATCH', `/api/groups/${group.id}`, { display_name: uniqueName('admins-renamed') })).statusCode, 200)
      assert.equal((await call('DELETE', `/api/groups/${group.id}`)).statusCode, 204)
      for (const admin of enabledAdmins) {
        const now = await getUser(admin.id)
        assert.deepEqual([now.role, now.disabled], ['admin', false])
      }
      // Disable all but one, then the last is refused as ever.
      const extra = enabledAdmins.filter(a => a.id !== own.id)
      for (const admin of extra) assert.equal((await call('PATCH', `/api/users/${admin.id}`, { disabled: true })).statusCode, 200)
      try {
        const last = await call('PATCH', `/api/users/${own.id}`, { disabled: true })
        assert.equal(last.statusCode, 409, last.body)
        assert.equal(last.json().code, 'last_admin')
      } finally {
        for (const admin of extra) await call('PATCH', `/api/users/${admin.id}`, { disabled: false })
      }
    })

    it('refuses a member who would be in more than 100 groups with 409 too_many_groups, changing nothing', async () => {
      const stem = uniqueName('many')
      const full = await createUser(Array.from({ length: 100 }, (_, i) => `${stem}-${i}`))
      const other = await createUser()
      const group = await createGroup({ display_name: uniqueName('one-more') })
      const res = await call('POST', `/api/groups/${group.id}/members`, { user_ids: [other.id, full.id] })
      assert.equal(res.statusCode, 409, res.body)
      assert.equal(res.json().code, 'too_many_groups')
      assert.deepEqual(await memberIds(group.id), [], 'the whole request was rolled back')
      assert.deepEqual((await getUser(other.id)).groups, [])
    })

    it('refuses unknown fields, a missing name and an unknown member with problems', async () => {
      const unknown = await call('POST', '/api/groups', { display_name: uniqueName('x'), members: [] })
      assert.equal(unknown.statusCode, 422, unknown.body)
      assert.equal(unknown.json().code, 'validation_failed')
      const missing = await call('POST', '/api/groups', {})
      assert.equal(missing.statusCode, 422, missing.body)
      const name = uniqueName('ghost')
      const ghost = await call('POST', '/api/groups', { display_name: name, member_ids: [randomUUID()] })
      assert.equal(ghost.statusCode, 404, ghost.body)
      assert.equal(ghost.json().code, 'user_not_found')
      assert.equal(await groupNamed(name), undefined, 'the group was not created')
    })

    /** Transactions this app ran again because PostgreSQL found them in a deadlock (its Prometheus counter). */
    const deadlockRetries = async (): Promise<number> => {
      const res = await t.app.inject({ url: '/auth/metrics' })
      assert.equal(res.statusCode, 200, res.body)
      const match = /^gatehouse_db_transaction_retries_total\{reason="deadlock"\} (\d+)$/m.exec(res.body)
      return match === null ? 0 : Number(match[1])
    }

    it('keeps groups and arrays in agreement under concurrent changes of members, arrays and names, answering only 2xx or a 409 to retry, and without a deadlock', { timeout: 120_000 }, async () => {
      const stem = uniqueName('race')
      const names = ['a', 'b', 'c'].map(n => `${stem}-${n}`)
      const groups: Group[] = []
      for (const name of names) groups.push(await createGroup({ display_name: name }))
      const users: User[] = []
      for (let i = 0; i < 6; i++) users.push(await createUser(names.filter((_, j) => (i + j) % 2 === 0)))
      const ops: Array<() => Promise<{ statusCode: number, body: string }>> = []
      for (let round = 0; round < 8; round++) {
        for (const [i, user] of users.entries()) {
          const group = groups[(i + round) % groups.length]!
          // Arrays name the groups by their first names, so renamed-away names come back as new groups.
          ops.push(async () => await call('PATCH', `/api/users/${user.id}`, { groups: names.filter((_, j) => (i + j + round) % 3 !== 0) }))
          ops.push(async () => await call('POST', `/api/groups/${group.id}/members`, { user_ids: [user.id, users[(i + 1) % users.length]!.id] }))
          ops.push(async () => await call('DELETE', `/api/groups/${group.id}/members/${users[(i + 3) % users.length]!.id}`))
        }
        ops.push(async () => await call('PATCH', `/api/groups/${groups[round % groups.length]!.id}`, { display_name: `${names[round % names.length]!}-${round}` }))
      }
      const deadlocksBefore = await deadlockRetries()
      const answers: string[] = []
      let next = 0
      await Promise.all(Array.from({ length: 6 }, async () => {
        while (next < ops.length) {
          const res = await ops[next++]!()
          answers.push(res.statusCode < 300 ? '2xx' : `${res.statusCode} ${JSON.parse(res.body).code as string}`)
        }
      }))
      assert.deepEqual([...new Set(answers)].filter(a => a !== '2xx' && a !== '409 conflict'), [], 'nothing but success or a conflict to retry')
      // Users before groups, each in id order: a deadlock (retried, but found only after PostgreSQL's deadlock_timeout) is a lock order broken.
      assert.equal(await deadlockRetries() - deadlocksBefore, 0, 'no transaction was rolled back to break a deadlock')
      const listed = await call('GET', `/api/groups?q=${stem}&limit=1000`)
      for (const group of listed.json() as Group[]) {
        const members = await memberIds(group.id)
        assert.deepEqual(members, await holdersOf(group.display_name, users), `the members of ${group.display_name} are the users whose arrays hold it`)
        assert.equal(group.member_count, members.length)
      }
      const everyName = new Set((listed.json() as Group[]).map(g => g.display_name))
      for (const user of users) {
        for (const name of (await getUser(user.id)).groups) assert.ok(everyName.has(name), `${name} in a user's groups is a group`)
      }
    })

    it('keeps group names unique ignoring case, in any script: a name another group has in another case is 409 group_exists', async () => {
      const stem = uniqueName('case')
      const data = await createGroup({ display_name: `${stem}-data` })
      for (const taken of [`${stem}-DATA`, `${stem}-Data`]) {
        const res = await call('POST', '/api/groups', { display_name: taken })
        assert.equal(res.statusCode, 409, res.body)
        assert.equal(res.json().code, 'group_exists')
        assert.match(res.json().detail, new RegExp(`as "${stem}-data"`))
      }
      const cyrillic = await createGroup({ display_name: `${stem}-данные` })
      assert.equal((await call('POST', '/api/groups', { display_name: `${stem}-ДАННЫЕ` })).statusCode, 409)
      // A rename onto another group's name in another case is refused; one that changes only its own case is a rename.
      const renamedOnto = await call('PATCH', `/api/groups/${cyrillic.id}`, { display_name: `${stem}-DaTa` }, { 'content-type': 'application/merge-patch+json' })
      assert.equal(renamedOnto.statusCode, 409, renamedOnto.body)
      assert.equal(renamedOnto.json().code, 'group_exists')
      const member = await createUser([`${stem}-data`])
      const ownCase = await call('PATCH', `/api/groups/${data.id}`, { display_name: `${stem}-Data` }, { 'content-type': 'application/merge-patch+json' })
      assert.equal(ownCase.statusCode, 200, ownCase.body)
      assert.deepEqual((await getUser(member.id)).groups, [`${stem}-Data`])
      assert.equal((await groupNamed(`${stem}-DATA`))?.id, data.id, 'the display_name filter ignores case')
      // SCIM: displayName is unique ignoring case there too, and its filter finds the group in any case.
      const scimKey = (await call('POST', '/api/api-keys', { name: 'idp', scopes: ['scim'] })).json().key as string
      const scimHeaders = { ...auth(scimKey), 'content-type': 'application/scim+json' }
      const scimCreate = await t.app.inject({ method: 'POST', url: '/auth/scim/v2/Groups', headers: scimHeaders, payload: { schemas: ['urn:ietf:params:scim:schemas:core:2.0:Group'], displayName: `${stem}-dATA` } })
      assert.equal(scimCreate.statusCode, 409, scimCreate.body)
      assert.equal(scimCreate.json().scimType, 'uniqueness')
      const found = await t.app.inject({ url: `/auth/scim/v2/Groups?filter=${encodeURIComponent(`displayName eq "${stem}-DATA"`)}`, headers: auth(scimKey) })
      assert.deepEqual(found.json().Resources.map((g: { id: string }) => g.id), [data.id])
    })

    it('joins the existing group, in its spelling, when a user\'s groups name it in another case, through every door that takes the array', async () => {
      const stem = uniqueName('spell')
      const data = await createGroup({ display_name: `${stem}-data` })
      const created = await createUser([`${stem}-DATA`, `${stem}-New`, `${stem}-NEW`])
      assert.deepEqual(created.groups, [`${stem}-data`, `${stem}-New`], 'the stored spelling wins; names new to the array that differ only in case are one')
      const patched = await call('PATCH', `/api/users/${(await createUser()).id}`, { groups: [`${stem}-Data`, `${stem}-new`] }, { 'content-type': 'application/merge-patch+json' })
      assert.equal(patched.statusCode, 200, patched.body)
      assert.deepEqual(patched.json().groups, [`${stem}-data`, `${stem}-New`])
      const users = [{ username: uniqueName('imp'), groups: [`${stem}-DaTa`, `${stem}-Fresh`] }, { username: uniqueName('imp'), groups: [`${stem}-FRESH`] }]
      const imported = await call('POST', '/api/users/import', { users })
      assert.equal(imported.statusCode, 200, imported.body)
      const fresh = await groupNamed(`${stem}-fresh`)
      assert.equal(fresh?.display_name, `${stem}-Fresh`)
      assert.equal(fresh.member_count, 2, 'one group for names new to the import that differ only in case')
      assert.equal((await getGroup(data.id)).member_count, 3)
      const listed = await call('GET', `/api/groups?q=${encodeURIComponent(stem)}&limit=100`)
      assert.deepEqual((listed.json() as Group[]).map(g => g.display_name).sort(), [`${stem}-Fresh`, `${stem}-New`, `${stem}-data`].sort())
      // The two views agree: each member's array holds the group's own spelling.
      for (const id of await memberIds(data.id)) assert.ok((await getUser(id)).groups.includes(`${stem}-data`))
      assert.deepEqual((await filteredIds(`${stem}-data`)).sort(), await memberIds(data.id))
    })

    it('migration 0025 stops, naming them and changing nothing, on groups that differ only in case, and applies once they are renamed', async () => {
      const db = t.app.db as unknown as Kysely<any>
      await nameKeyMigration.down(db)
      const stem = uniqueName('dup')
      const now = new Date().toISOString()
      const rows = [`${stem}-Ops`, `${stem}-ops`, `${stem}-ДАННЫЕ`, `${stem}-данные`].map(name => ({ id: randomUUID(), display_name: name, external_id: null, version: 1, created_at: now, updated_at: now }))
      await db.insertInto('groups').values(rows).execute()
      await assert.rejects(nameKeyMigration.up(db), (error: Error) => {
        for (const row of rows) assert.ok(error.message.includes(`"${row.display_name}" (id ${row.id}, 0 members)`), error.message)
        assert.match(error.message, /Nothing was changed/)
        return true
      })
      // Nothing changed: the exact-name index still holds, and there is no name_key yet.
      await assert.rejects(db.insertInto('groups').values({ ...rows[0]!, id: randomUUID() }).execute())
      await assert.rejects(db.selectFrom('groups').select('name_key').execute())
      await db.updateTable('groups').set({ display_name: `${stem}-ops-2` }).where('id', '=', rows[1]!.id).execute()
      await db.deleteFrom('groups').where('id', '=', rows[3]!.id).execute()
      await nameKeyMigration.up(db)
      const keys = await db.selectFrom('groups').select(['display_name', 'name_key']).where('id', 'in', rows.map(r => r.id)).orderBy('display_name').execute()
      assert.deepEqual(keys, [
        { display_name: `${stem}-Ops`, name_key: `${stem}-ops` },
        { display_name: `${stem}-ops-2`, name_key: `${stem}-ops-2` },
        { display_name: `${stem}-ДАННЫЕ`, name_key: `${stem}-данные` }
      ])
      assert.equal((await call('POST', '/api/groups', { display_name: `${stem}-данные` })).statusCode, 409)
    })

    it('backfills groups and memberships (with their users\' sort keys) from the users\' arrays when migrations 0012 and 0018 run', async () => {
      const name = uniqueName('backfill')
      const users = [await createUser([name, 'bf-shared']), await createUser(['bf-shared']), await createUser([])]
      const db = t.app.db
      await nameKeyMigration.down(db)
      await memberOrderMigration.down(db)
      await groupsMigration.down(db)
      try {
        await groupsMigration.up(db)
        await memberOrderMigration.up(db)
        await nameKeyMigration.up(db)
      } catch (error) {
        throw new Error('migrations 0012, 0018 and 0025 did not apply again', { cause: error })
      }
      const groups = await db.selectFrom('groups').selectAll().execute()
      const names = groups.map(g => g.display_name)
      assert.equal(new Set(names).size, names.length, 'one group per name')
      assert.ok(names.includes(name) && names.includes('bf-shared'))
      const rows = await sql<{ n: number | string }>`select count(*) as n from group_members`.execute(db)
      const expected = await db.selectFrom('users').select('groups').execute()
      const total = expected.reduce((sum, row) => sum + (typeof row.groups === 'string' ? JSON.parse(row.groups) : row.groups).length, 0)
      assert.equal(Number(rows.rows[0]!.n), total, 'one membership per name in every array')
      assert.deepEqual(await filteredIds('bf-shared'), [users[0]!.id, users[1]!.id].sort())
      assert.deepEqual(await filteredIds(name), [users[0]!.id])
    })
  })
}
