import { strict as assert } from 'node:assert'
import { before, describe, it } from 'node:test'
import { auth, dialects, GOOD_PASSWORD, uniqueName, useTestApp } from './helpers.ts'

/** What `npm run fuzz` found, each pinned by the request that found it (issue 16). */
for (const dialect of dialects()) {
  describe(`requests the fuzzer found answered with 5xx (${dialect.name})`, () => {
    const t = useTestApp(dialect, { bodyLimitBytes: 1024 })
    let cookie: string
    let userId: string
    before(async () => {
      const username = uniqueName('admin')
      const created = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, password: GOOD_PASSWORD, role: 'admin' } })
      assert.equal(created.statusCode, 201, created.body)
      userId = created.json().id
      const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
      assert.equal(login.statusCode, 200, login.body)
      cookie = `gatehouse_session=${login.json().token as string}`
    })

    const headers = (): Record<string, string> => ({ cookie, origin: 'http://localhost:80' })

    it('a console form posted without a content type gets 415 and a page, not 500', async () => {
      const res = await t.app.inject({ method: 'POST', url: `/auth/admin/users/${userId}/unlock`, headers: headers(), payload: 'x' })
      assert.equal(res.statusCode, 415, res.body)
      assert.match(String(res.headers['content-type']), /^text\/html/)
    })

    it('a console form over the body limit gets 413 and a page, not 500', async () => {
      const res = await t.app.inject({ method: 'POST', url: '/auth/admin/users', headers: { ...headers(), 'content-type': 'application/x-www-form-urlencoded' }, payload: `username=${'x'.repeat(2000)}` })
      assert.equal(res.statusCode, 413, res.body)
      assert.match(String(res.headers['content-type']), /^text\/html/)
    })

    it('an OIDC callback whose Host header cannot be part of a URL gets 400 and a page, not 500', async () => {
      const res = await t.app.inject({ url: '/auth/sso/someprovider/callback?code=x&state=y', headers: { host: 'a b' } })
      assert.equal(res.statusCode, 400, res.body)
      assert.match(String(res.headers['content-type']), /^text\/html/)
    })
  })
}
