import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, dialects, uniqueName, useTestApp } from './helpers.ts'

for (const dialect of dialects()) {
  describe(`the last enabled admin (${dialect.name})`, () => {
    const t = useTestApp(dialect)
    const createAdmin = async () => (await t.app.inject({
      method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName('admin'), role: 'admin' }
    })).json()
    const patch = async (id: string, payload: object) => await t.app.inject({ method: 'PATCH', url: `/auth/api/users/${id}`, headers: auth(t.adminKey), payload })
    const remove = async (id: string) => await t.app.inject({ method: 'DELETE', url: `/auth/api/users/${id}`, headers: auth(t.adminKey) })
    const enabledAdmins = async () => (await t.app.inject({ url: '/auth/api/users?role=admin&disabled=false', headers: auth(t.adminKey) })).json()

    it('cannot be deleted, disabled or demoted (409 last_admin), and stays unchanged', async () => {
      const admin = await createAdmin()
      for (const res of [await remove(admin.id), await patch(admin.id, { disabled: true }), await patch(admin.id, { role: 'user' })]) {
        assert.equal(res.statusCode, 409)
        assert.equal(res.json().code, 'last_admin')
      }
      const after = (await t.app.inject({ url: `/auth/api/users/${admin.id}`, headers: auth(t.adminKey) })).json()
      assert.deepEqual(after, admin)
      // Other changes to the last admin are fine.
      assert.equal((await patch(admin.id, { first_name: 'Still' })).statusCode, 200)
    })

    it('can be removed once another admin exists', async () => {
      const [first] = await enabledAdmins()
      const second = await createAdmin()
      assert.equal((await patch(first.id, { role: 'user' })).statusCode, 200)
      assert.equal((await remove(second.id)).statusCode, 409, 'now the second is the last')
      assert.equal((await patch(first.id, { role: 'admin' })).statusCode, 200)
    })

    it('survives concurrent removals: of two admins removed at once, exactly one goes', async () => {
      for (let round = 0; round < 5; round++) {
        // Reduce to exactly two enabled admins.
        const admins = await enabledAdmins()
        while (admins.length < 2) admins.push(await createAdmin())
        for (const extra of admins.slice(2)) assert.equal((await remove(extra.id)).statusCode, 204)
        const [a, b] = admins
        const results = await Promise.all([
          round % 2 === 0 ? remove(a.id) : patch(a.id, { disabled: true }),
          round % 2 === 0 ? patch(b.id, { role: 'user' }) : remove(b.id)
        ])
        const statuses = results.map(r => r.statusCode)
        assert.equal(statuses.filter(s => s === 409).length, 1, JSON.stringify(results.map(r => r.body)))
        assert.equal(statuses.filter(s => s === 200 || s === 204).length, 1)
        assert.ok(results.some(r => r.statusCode === 409 && r.json().code === 'last_admin'))
        assert.equal((await enabledAdmins()).length, 1)
      }
    })
  })
}
