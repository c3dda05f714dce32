import assert from 'node:assert/strict'
import { randomInt } from 'node:crypto'
import { describe, it } from 'node:test'
import type { LightMyRequestResponse } from 'fastify'
import type { Config } from '../src/config.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp, type TestApp } from './helpers.ts'
import { waitFor } from './polling.ts'
import { TEST_REDIS_URL } from './redis.ts'

const WRONG = 'not the password at all'

/** The three ways gatehouse runs: SQLite, PostgreSQL, and PostgreSQL with the counters in Redis. */
const setups: Array<{ name: string, dialect: ReturnType<typeof dialects>[number], redis: boolean }> = [
  { name: 'sqlite', dialect: dialects()[0]!, redis: false }
]
const postgres = dialects().find(d => d.name === 'postgres')
if (postgres !== undefined) {
  setups.push({ name: 'postgres', dialect: postgres, redis: false })
  if (TEST_REDIS_URL !== undefined) setups.push({ name: 'postgres+redis', dialect: postgres, redis: true })
}

/**
 * Client addresses nobody else uses, so counters that Redis keeps across test
 * runs (and other suites' failures) never meet these.
 */
function freshAddresses (n: number): string[] {
  const net = `198.${18 + randomInt(2)}.${randomInt(256)}`
  const start = randomInt(200)
  return Array.from({ length: n }, (_, i) => `${net}.${start + i}`)
}

async function createUser (t: TestApp, fields: Record<string, unknown> = {}): Promise<{ id: string, username: string }> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD, ...fields } })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function login (t: TestApp, username: string, password: string, from: string, cookie?: string): Promise<LightMyRequestResponse> {
  return await t.app.inject({
    method: 'POST',
    url: '/auth/api/login',
    payload: { username, password },
    remoteAddress: from,
    headers: cookie !== undefined ? { cookie } : {}
  })
}

async function eventsOf (t: TestApp, userId: string): Promise<Array<{ type: string, data: Record<string, unknown> }>> {
  const res = await t.app.inject({ url: `/auth/api/events?target_id=${userId}&limit=1000`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

function tally (statuses: number[]): Record<number, number> {
  const counts: Record<number, number> = {}
  for (const s of statuses) counts[s] = (counts[s] ?? 0) + 1
  return counts
}

function deviceCookieOf (res: LightMyRequestResponse): string {
  const cookie = res.cookies.find(c => c.name === 'gatehouse_device')
  assert.ok(cookie, `no device cookie in ${JSON.stringify(res.cookies)}`)
  return `${cookie.name}=${cookie.value}`
}

for (const setup of setups) {
  const limits: Partial<Config> = {
    loginMaxFailuresPerAccount: 10,
    loginMaxFailuresPerAddress: 100,
    accountLockThreshold: 50,
    // Every guess that gets through its budget is verified; none is turned away by the hash queue's own limit.
    hashQueueLimit: 1000,
    ...(setup.redis ? { redisUrl: TEST_REDIS_URL } : {})
  }

  describe(`sign-in budgets under concurrency (${setup.name})`, () => {
    const t = useTestApp(setup.dialect, limits)

    it('checks at most 10 of 60 concurrent wrong guesses from one address and answers the rest 429', async () => {
      const user = await createUser(t)
      const [from] = freshAddresses(1)
      const answers = await Promise.all(Array.from({ length: 60 }, async () => await login(t, user.username, WRONG, from!)))
      assert.deepEqual(tally(answers.map(a => a.statusCode)), { 401: 10, 429: 50 })
      const failed = (await eventsOf(t, user.id)).filter(e => e.type === 'user.login_failed')
      assert.equal(failed.length, 10, 'one recorded check per verified guess')
      // The right password from that address waits for the window too.
      assert.equal((await login(t, user.username, GOOD_PASSWORD, from!)).statusCode, 429)
    })

    it('locks the account after exactly the threshold when 8 addresses guess 60 times each at once, as sequential guesses would', async () => {
      const user = await createUser(t)
      const addresses = freshAddresses(8)
      const answers = await Promise.all(addresses.flatMap(from => Array.from({ length: 60 }, async () => await login(t, user.username, WRONG, from))))
      assert.deepEqual(tally(answers.map(a => a.statusCode)), { 401: 80, 429: 400 })
      const events = await eventsOf(t, user.id)
      const locked = events.filter(e => e.type === 'user.locked')
      assert.equal(locked.length, 1, 'locked once')
      assert.equal(locked[0]!.data.failed_logins, 50)
      const reasons = tally(events.filter(e => e.type === 'user.login_failed').map(e => e.data.reason === 'wrong_password' ? 1 : e.data.reason === 'locked' ? 2 : 3))
      assert.deepEqual(reasons, { 1: 50, 2: 30 }, 'every wrong password up to the threshold counted, no update lost; the rest met the lock')
      // A stranger with the right password is shut out like a wrong one.
      const [stranger] = freshAddresses(1)
      const res = await login(t, user.username, GOOD_PASSWORD, stranger!)
      assert.equal(res.statusCode, 401)
      assert.equal(res.json().code, 'invalid_credentials')
    })

    it('counts a username and an email of one account in one budget', async () => {
      const username = uniqueName()
      const user = await createUser(t, { username, email: `${username}@example.com` })
      const [from] = freshAddresses(1)
      for (let i = 0; i < 5; i++) assert.equal((await login(t, user.username, WRONG, from!)).statusCode, 401)
      for (let i = 0; i < 5; i++) assert.equal((await login(t, `${username.toUpperCase()}@example.com`, WRONG, from!)).statusCode, 401)
      assert.equal((await login(t, `${username}@example.com`, GOOD_PASSWORD, from!)).statusCode, 429)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, from!)).statusCode, 429)
    })

    it('gives an attempt\'s unit back when it succeeds, so the address budget counts only failures', async () => {
      const [from] = freshAddresses(1)
      const user = await createUser(t)
      // 100 per address: 99 failures on other names, then successes must not use up the last unit.
      for (let i = 0; i < 99; i++) assert.equal((await login(t, `nobody_${i}_${uniqueName()}`, WRONG, from!)).statusCode, 401)
      for (let i = 0; i < 3; i++) assert.equal((await login(t, user.username, GOOD_PASSWORD, from!)).statusCode, 200)
      assert.equal((await login(t, user.username, WRONG, from!)).statusCode, 401)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, from!)).statusCode, 429)
    })
  })

  describe(`an account lock does not shut out the owner's known clients (${setup.name})`, () => {
    const t = useTestApp(setup.dialect, { ...limits, accountLockThreshold: 20 })

    /** Strangers on three addresses guess until the account locks. */
    async function lockOut (user: { id: string, username: string }): Promise<void> {
      const guesses = freshAddresses(3).flatMap(from => Array.from({ length: 10 }, async () => await login(t, user.username, WRONG, from)))
      await Promise.all(guesses)
      assert.equal((await eventsOf(t, user.id)).filter(e => e.type === 'user.locked').length, 1)
    }

    it('lets the owner in from a browser that signed in before, and not a stranger with the same password', async () => {
      const user = await createUser(t)
      const [home, elsewhere, stranger] = freshAddresses(3)
      const first = await login(t, user.username, GOOD_PASSWORD, home!)
      assert.equal(first.statusCode, 200)
      const device = deviceCookieOf(first)
      await lockOut(user)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, stranger!)).statusCode, 401)
      const owner = await login(t, user.username, GOOD_PASSWORD, elsewhere!, device)
      assert.equal(owner.statusCode, 200, owner.body)
      const succeeded = (await eventsOf(t, user.id)).find(e => e.type === 'user.login_succeeded' && e.data.while_locked === true)
      assert.ok(succeeded, 'the sign-in through the lock is recorded as such')
      // The owner getting in does not lift the lock for strangers.
      assert.equal((await login(t, user.username, GOOD_PASSWORD, stranger!)).statusCode, 401)
    })

    it('lets the owner in from an address they signed in from before', async () => {
      const user = await createUser(t)
      const [home, stranger] = freshAddresses(2)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, home!)).statusCode, 200)
      await lockOut(user)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, stranger!)).statusCode, 401)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, home!)).statusCode, 200)
    })

    it('refuses a forged, altered or someone else\'s device cookie', async () => {
      const user = await createUser(t)
      const other = await createUser(t)
      const [place, stranger] = freshAddresses(2)
      const othersDevice = deviceCookieOf(await login(t, other.username, GOOD_PASSWORD, place!))
      const [, id, issued, mac] = othersDevice.split('=')[1]!.split('.')
      await lockOut(user)
      const forged = [
        othersDevice,
        `gatehouse_device=v1.${user.id}.${issued}.${mac}`,
        `gatehouse_device=v1.${user.id}.${Math.floor(Date.now() / 1000)}.${'A'.repeat(43)}`,
        `gatehouse_device=v1.${id}.${Number(issued) + 1}.${mac}`
      ]
      for (const cookie of forged) assert.equal((await login(t, user.username, GOOD_PASSWORD, stranger!, cookie)).statusCode, 401, cookie)
    })

    it('still throttles a known client\'s wrong passwords, without counting them toward the lock', async () => {
      const user = await createUser(t)
      const [home] = freshAddresses(1)
      const device = deviceCookieOf(await login(t, user.username, GOOD_PASSWORD, home!))
      await lockOut(user)
      for (let i = 0; i < 10; i++) assert.equal((await login(t, user.username, WRONG, home!, device)).statusCode, 401)
      assert.equal((await login(t, user.username, GOOD_PASSWORD, home!, device)).statusCode, 429)
      const failures = (await eventsOf(t, user.id)).filter(e => e.type === 'user.login_failed' && e.data.known_client === true)
      assert.equal(failures.length, 10)
    })
  })
}

describe('with LOGIN_KNOWN_CLIENT_DAYS=0', () => {
  const t = useTestApp(dialects()[0]!, { accountLockThreshold: 5, loginKnownClientDays: 0 })

  it('sets no device cookie and shuts everyone out of a locked account', async () => {
    const user = await createUser(t)
    const [home, stranger] = freshAddresses(2)
    const first = await login(t, user.username, GOOD_PASSWORD, home!)
    assert.equal(first.statusCode, 200)
    assert.equal(first.cookies.find(c => c.name === 'gatehouse_device'), undefined)
    for (let i = 0; i < 5; i++) assert.equal((await login(t, user.username, WRONG, stranger!)).statusCode, 401)
    assert.equal((await login(t, user.username, GOOD_PASSWORD, home!)).statusCode, 401)
  })
})

for (const setup of setups) {
  describe(`the audit trail of a throttled sign-in (${setup.name})`, () => {
    it('records one user.login_throttled per account and throttle window, however many attempts it refuses and on whichever instance, and another in the next window', async () => {
      const settings: Partial<Config> = {
        loginMaxFailuresPerAccount: 3,
        loginMaxFailuresPerAddress: 100,
        accountLockThreshold: 50,
        // Short, so that the next window comes within the test; polled for, never slept.
        loginFailureWindowMs: 10_000,
        ...(setup.redis ? { redisUrl: TEST_REDIS_URL } : {})
      }
      const t = await createTestApp(setup.dialect, settings)
      // With Redis, a second instance on the same database shares the budgets: its refusals are the same window's.
      const other = setup.redis ? await createTestApp(setup.dialect, { ...settings, databaseSchema: t.config.databaseSchema }) : t
      try {
        const user = await createUser(t)
        const [from] = freshAddresses(1)
        const throttledEvents = async (): Promise<Array<{ type: string, data: Record<string, unknown> }>> =>
          (await eventsOf(t, user.id)).filter(e => e.type === 'user.login_throttled')
        for (let i = 0; i < 3; i++) assert.equal((await login(t, user.username, WRONG, from!)).statusCode, 401)
        const refused = await Promise.all(Array.from({ length: 8 }, async (_, i) => (await login(i % 2 === 0 ? t : other, user.username, i < 4 ? WRONG : GOOD_PASSWORD, from!)).statusCode))
        assert.deepEqual(tally(refused), { 429: 8 })
        const first = await throttledEvents()
        assert.equal(first.length, 1, JSON.stringify(first))
        assert.deepEqual(Object.keys(first[0]!.data).sort(), ['identifier', 'throttled_by', 'window_ends_at'])
        assert.equal(first[0]!.data.throttled_by, 'account')
        assert.equal(first[0]!.data.identifier, user.username)

        // The window ends: the next wrong password is a failure again, and starts the next window.
        await waitFor('the throttle window to end', async () => (await login(t, user.username, WRONG, from!)).statusCode === 401, 60_000)
        for (let i = 0; i < 2; i++) assert.equal((await login(other, user.username, WRONG, from!)).statusCode, 401)
        const again = await Promise.all(Array.from({ length: 4 }, async (_, i) => (await login(i % 2 === 0 ? t : other, user.username, WRONG, from!)).statusCode))
        assert.deepEqual(tally(again), { 429: 4 })
        const both = await throttledEvents()
        assert.equal(both.length, 2, JSON.stringify(both))
        assert.notEqual(both[0]!.data.window_ends_at, both[1]!.data.window_ends_at)
      } finally {
        if (other !== t) await other.app.close()
        await t.app.close()
      }
    })
  })
}
