import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { describe, it } from 'node:test'
import { loadConfig } from '../src/config.ts'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

/** The nice value of each thread of this process (Linux), by thread id. */
function threadNices (): Map<number, number> {
  const nices = new Map<number, number>()
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      // Fields after the command's closing parenthesis: state is the 3rd field of the line, nice the 19th.
      const fields = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8').split(') ').at(-1)!.split(' ')
      nices.set(Number(tid), Number(fields[16]))
    } catch {
      // the thread ended while we looked
    }
  }
  return nices
}

const linux = process.platform === 'linux'

describe('HASH_NICE', () => {
  it('accepts 0 to 19 and refuses anything else', () => {
    assert.equal(loadConfig({ HASH_NICE: '0' }).hashNice, 0)
    assert.equal(loadConfig({ HASH_NICE: '19' }).hashNice, 19)
    assert.equal(loadConfig({}).hashNice, process.platform === 'linux' ? 19 : 0, 'below the event loop by default where a thread\'s priority can be set')
    assert.throws(() => loadConfig({ HASH_NICE: '20' }), /HASH_NICE/)
    assert.throws(() => loadConfig({ HASH_NICE: '-1' }), /HASH_NICE/)
  })

  for (const dialect of dialects()) {
    describe(`hashing on lowered worker threads (${dialect.name})`, () => {
      const t = useTestApp(dialect, { hashNice: 7, hashConcurrency: 2 })

      it('hashes and checks passwords there: a new user signs in with the right password and not with a wrong one', async () => {
        const username = uniqueName()
        const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD } })
        assert.equal(created.statusCode, 201, created.body)
        const right = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
        assert.equal(right.statusCode, 200, right.body)
        const wrong = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: 'not ' + GOOD_PASSWORD } })
        assert.equal(wrong.statusCode, 401, wrong.body)
        assert.equal(wrong.json().code, 'invalid_credentials')
      })

      it('runs the hashing threads at that nice value and leaves the event loop at its own', { skip: !linux && 'thread priorities are set on Linux only' }, async () => {
        assert.equal(await t.app.passwords.lowered(), true)
        const nices = threadNices()
        const lowered = [...nices.values()].filter(n => n === 7).length
        // One per slot (HASH_CONCURRENCY); another app of this test file may hold more.
        assert.ok(lowered >= 2, `threads at nice 7: ${lowered} of ${nices.size}`)
        assert.equal(nices.get(process.pid), 0, 'the main thread (the event loop) keeps nice 0')
      })
    })
  }

  it('starts the hashing threads with the first hash, not with the server', { skip: !linux && 'Linux only' }, async () => {
    // A nice value no other app of this file uses, so its threads are this app's.
    const atThirteen = (): number => [...threadNices().values()].filter(n => n === 13).length
    const t = await createTestApp(dialects()[0]!, { hashNice: 13, hashConcurrency: 2 })
    try {
      assert.equal(atThirteen(), 0, 'no hashing thread after start-up (the dummy hash is made on the pool)')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: uniqueName(), password: GOOD_PASSWORD } })
      assert.equal(created.statusCode, 201, created.body)
      assert.equal(await t.app.passwords.lowered(), true)
      assert.equal(atThirteen(), 2, 'one hashing thread per slot once a password was hashed')
    } finally {
      await t.app.close()
    }
  })

  it('keeps hashing on the thread pool at the process\'s priority with HASH_NICE=0', { skip: !linux && 'Linux only' }, async () => {
    const lowered = (): number => [...threadNices().values()].filter(n => n !== 0).length
    const before = lowered()
    const t = await createTestApp(dialects()[0]!, { hashNice: 0 })
    try {
      assert.equal(await t.app.passwords.lowered(), undefined)
      const username = uniqueName()
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD } })
      assert.equal(created.statusCode, 201, created.body)
      assert.equal(lowered(), before, 'no new lowered thread')
    } finally {
      await t.app.close()
    }
  })
})
