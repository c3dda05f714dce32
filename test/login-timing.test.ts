import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

const ROUNDS = 40
const WRONG = 'not the password at all'

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

describe('sign-in failure timing', () => {
  // Throttling and locking would change the answers under test; they are tested elsewhere.
  const t = useTestApp(dialects()[0]!, { loginMaxFailuresPerAccount: 100_000, loginMaxFailuresPerAddress: 100_000, accountLockThreshold: 100_000 })

  it('takes the same time for an unknown user, a wrong password, a disabled and a locked account (medians within 15%)', async () => {
    const create = async (fields: object) => (await t.app.inject({
      method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields }
    })).json()
    const wrong = await create({})
    const disabled = await create({ disabled: true })
    const locked = await create({})
    await t.app.db.updateTable('users').set({ locked_until: new Date(Date.now() + 3_600_000).toISOString() }).where('id', '=', locked.id).execute()

    const cases: Record<string, { username: string, password: string }> = {
      unknown_user: { username: 'nobody_' + uniqueName(), password: WRONG },
      wrong_password: { username: wrong.username, password: WRONG },
      disabled: { username: disabled.username, password: GOOD_PASSWORD },
      locked: { username: locked.username, password: GOOD_PASSWORD }
    }
    const times: Record<string, number[]> = Object.fromEntries(Object.keys(cases).map(k => [k, []]))
    // Round-robin, so a noisy moment on a shared machine hits every case alike; the first rounds warm up.
    for (let round = 0; round < ROUNDS + 3; round++) {
      for (const [name, body] of Object.entries(cases)) {
        const started = process.hrtime.bigint()
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: body })
        const ms = Number(process.hrtime.bigint() - started) / 1e6
        assert.equal(res.statusCode, 401, name)
        if (round >= 3) times[name]!.push(ms)
      }
    }
    const medians = Object.fromEntries(Object.entries(times).map(([name, values]) => [name, median(values)]))
    const overall = median(Object.values(medians))
    for (const [name, value] of Object.entries(medians)) {
      assert.ok(Math.abs(value - overall) / overall < 0.15, `${name}: median ${value.toFixed(2)} ms vs ${overall.toFixed(2)} ms overall (${JSON.stringify(medians)})`)
    }
  })
})
