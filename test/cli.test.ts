import assert from 'node:assert/strict'
import { once } from 'node:events'
import { spawn } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { PassThrough, Writable } from 'node:stream'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes, scryptSync } from 'node:crypto'
import { hashSync as bcryptHashSync } from '@node-rs/bcrypt'
import { after, before, describe, it } from 'node:test'
import { buildApp } from '../src/app.ts'
import { defaultConfig } from '../src/config.ts'
import { auth, createTestApp, dialects, dropSchema, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { BIN, listen, runCli, runCliOnTerminal, SCRIPT } from './cli-helpers.ts'
import { openHiddenPrompt } from '../src/cli/prompt.ts'
import { freePort } from './ports.ts'

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-cli-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

describe('gatehouse: usage and exit codes', () => {
  it('prints help with exit code 0 on --help, on every level', async () => {
    for (const args of [['--help'], ['users', 'create', '--help'], ['db-user', 'drop', '--help']]) {
      const r = await runCli(args)
      assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`)
      assert.match(r.stdout, /^Usage: gatehouse/)
    }
  })

  it('exits 2 on wrong usage: no command, unknown command or option, missing argument, missing setting', async () => {
    const cases: Array<[string[], RegExp]> = [
      [[], /Usage: gatehouse/],
      [['users', 'bogus'], /unknown command 'bogus'/],
      [['users', 'list', '--bogus'], /unknown option '--bogus'/],
      [['users', 'get'], /missing required argument 'user'/],
      // A password is never taken from argv.
      [['users', 'create', 'ada', '--password', 'secret'], /unknown option '--password'/],
      [['users', 'list'], /set GATEHOUSE_API_KEY/],
      [['keys', 'create', 'x', '--scope', 'root'], /unknown scope "root"/],
      [['db-user', 'create', 'someone'], /set SERVICE_DATABASE_URL|not a valid|password/]
    ]
    for (const [args, message] of cases) {
      const r = await runCli(args, { env: args[1] === 'list' ? {} : { GATEHOUSE_API_KEY: 'k' } })
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`)
      assert.match(r.stderr, message, args.join(' '))
      assert.equal(r.stdout, '')
    }
  })

  it('prints the release with --version and -V, exit code 0', async () => {
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
    for (const flag of ['--version', '-V']) {
      const r = await runCli([flag])
      assert.equal(r.code, 0, r.stderr)
      assert.equal(r.stdout, `${version}\n`)
    }
  })

  it('exits 1 with a one-line message when the service cannot be reached', async () => {
    const url = `http://127.0.0.1:${await freePort()}/auth`
    const r = await runCli(['users', 'list'], { env: { GATEHOUSE_URL: url, GATEHOUSE_API_KEY: 'k' } })
    assert.equal(r.code, 1)
    assert.equal(r.stderr, `gatehouse: cannot reach ${url}: ECONNREFUSED\n`)
  })
})

describe('gatehouse users import: a file it cannot read', () => {
  it('exits 1 with one line naming the file, before contacting the service', async () => {
    const folder = join(tmp, 'a-folder.csv')
    mkdirSync(folder)
    // Nothing listens there: the file is judged first.
    const env = { GATEHOUSE_URL: 'http://127.0.0.1:9/auth', GATEHOUSE_API_KEY: 'k' }
    const cases: Array<[string[], string]> = [
      [[join(tmp, 'missing.csv')], 'no such file'],
      [[join(tmp, 'missing.jsonl')], 'no such file'],
      [[join(tmp, 'missing'), '--format', 'csv'], 'no such file'],
      [[folder], 'it is a directory']
    ]
    for (const [args, reason] of cases) {
      const r = await runCli(['users', 'import', ...args], { env })
      assert.equal(r.code, 1, r.stderr)
      assert.equal(r.stderr, `gatehouse: cannot read ${args[0]!}: ${reason}\n`)
      assert.equal(r.stdout, '')
    }
  })
})

describe('gatehouse: password prompt on a terminal', () => {
  const script = ['/usr/bin/script', '/bin/script'].find(existsSync)
  // script(1) gives the CLI a pseudo-terminal. Both answers are typed the moment the first prompt shows, as a
  // fast typist or a paste would: echo must already be off then, and stay off until the second answer is read.
  const typeAhead = async (answers: string): Promise<{ code: number | null, output: string }> => {
    const child = spawn(script!, ['-qec', `${JSON.stringify(process.execPath)} ${JSON.stringify(BIN)} db-user create gh_prompt --password-prompt`, '/dev/null'], {
      env: { ...process.env, SERVICE_DATABASE_URL: '' },
      stdio: ['pipe', 'pipe', 'pipe']
    })
    let output = ''
    let typed = false
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      output += d
      if (!typed && output.includes('Password: ')) {
        typed = true
        child.stdin.write(answers)
      }
    })
    // A lost answer would leave the CLI waiting for ever: fail instead.
    const killer = setTimeout(() => child.kill('SIGKILL'), 15_000)
    const [code] = await once(child, 'exit') as [number | null]
    clearTimeout(killer)
    return { code, output }
  }

  it('asks twice without echoing, even answers typed ahead, and refuses a mismatch', { skip: script === undefined && 'needs script(1) for a pseudo-terminal' }, async () => {
    const mismatch = await typeAhead('Typed-Secret-1\rTyped-Secret-2\r')
    assert.equal(mismatch.code, 1, mismatch.output)
    assert.match(mismatch.output, /Password: \r?\nRepeat the password: \r?\ngatehouse: the passwords do not match/)
    assert.ok(!mismatch.output.includes('Typed-Secret'), 'the password was echoed')

    // The same answer twice gets past the prompt to the next check (no SERVICE_DATABASE_URL: exit 2).
    const match = await typeAhead('Typed-Secret-1\rTyped-Secret-1\r')
    assert.equal(match.code, 2, match.output)
    assert.match(match.output, /gatehouse: set SERVICE_DATABASE_URL/)
    assert.ok(!match.output.includes('Typed-Secret'), 'the password was echoed')
  })
})

describe('gatehouse: hidden prompt', () => {
  it('switches the terminal to raw mode (no echo) before it writes a question, and back afterwards', async () => {
    const input = Object.assign(new PassThrough(), {
      isRaw: false,
      setRawMode (mode: boolean) { this.isRaw = mode; return this }
    })
    const writes: Array<[string, boolean]> = []
    const output = new Writable({ write (chunk: Buffer, _encoding, done) { writes.push([chunk.toString(), input.isRaw]); done() } })
    const prompt = openHiddenPrompt(input, output)
    const first = prompt.ask('Password: ')
    input.write('se\u007fecret\rtyped ahead\r')
    assert.equal(await first, 'secret', 'Backspace edits the line')
    assert.equal(await prompt.ask('Repeat the password: '), 'typed ahead')
    prompt.close()
    assert.equal(input.isRaw, false)
    assert.deepEqual(writes, [['Password: ', true], ['\n', true], ['Repeat the password: ', true], ['\n', true]])
    assert.ok(!writes.some(([text]) => text.includes('secret')), 'nothing typed is written back')
  })
})

describe('gatehouse serve', () => {
  it('starts the service like npm start, prints the first key once, and stops on SIGTERM', async () => {
    const port = await freePort()
    const child = spawn(process.execPath, [BIN, 'serve'], {
      env: { ...process.env, DATABASE_URL: `sqlite:${join(tmp, 'serve.db')}`, PORT: String(port), LOG_LEVEL: 'info', GATEHOUSE_ADMIN_API_KEY: '', GATEHOUSE_ADMIN_USERNAME: '', GATEHOUSE_ADMIN_PASSWORD: '' },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let stdout = ''
    child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
    try {
      const deadline = Date.now() + 15_000
      while (!/gatehouse is serving/.test(stdout) && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 50))
      const key = /Admin API key \(shown once, store it now\): (gatehouse_\w+)/.exec(stdout)?.[1]
      assert.ok(key, stdout)
      const res = await fetch(`http://127.0.0.1:${port}/auth/api/users`, { headers: { 'x-api-key': key } })
      assert.equal(res.status, 200)
    } finally {
      child.kill('SIGTERM')
    }
    const [code] = await once(child, 'exit') as [number | null]
    assert.equal(code, 0)
  })
})

describe('npm start on a port that is in use', () => {
  it('says so in one line and exits 1, and neither issues nor prints the first admin key', { timeout: 30_000 }, async () => {
    const holder = createServer()
    holder.listen(0, '127.0.0.1')
    await once(holder, 'listening')
    const port = (holder.address() as { port: number }).port
    const database = `sqlite:${join(tmp, 'busy-port.db')}`
    try {
      // What `npm start` runs (dist/server.js, compiled from this file), from source, without npm's own output around it.
      const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('../src/server.ts', import.meta.url))], {
        env: { ...process.env, DATABASE_URL: database, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn', GATEHOUSE_ADMIN_API_KEY: '', GATEHOUSE_ADMIN_USERNAME: '', GATEHOUSE_ADMIN_PASSWORD: '' },
        stdio: ['ignore', 'pipe', 'pipe']
      })
      let stdout = ''
      let stderr = ''
      child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
      child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
      const killer = setTimeout(() => child.kill('SIGKILL'), 20_000)
      const [code] = await once(child, 'exit') as [number | null]
      clearTimeout(killer)
      assert.equal(code, 1, stderr)
      assert.equal(stderr, `gatehouse: port ${port} on 127.0.0.1 is in use; set PORT to a free port, or stop the process that holds it\n`)
      // No key is issued before the port is bound, so none was printed and the next start makes one.
      assert.doesNotMatch(stdout, /Admin API key/, stdout)
      const app = await buildApp({ config: defaultConfig({ databaseUrl: database, logLevel: 'silent' }), logger: false })
      try {
        assert.equal(await app.db.selectFrom('api_keys').select('id').executeTakeFirst(), undefined, 'no key was stored either')
      } finally {
        await app.close()
      }
    } finally {
      holder.close()
    }
  })
})

for (const dialect of dialects()) {
  describe(`gatehouse CLI against a running service (${dialect.name})`, () => {
    let t: TestApp
    let env: Record<string, string>
    before(async () => {
      t = await createTestApp(dialect)
      env = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey }
    })
    after(async () => { await t.app.close() })
    const cli = async (args: string[], input?: string, extra: Record<string, string> = {}) =>
      await runCli(args, { env: { ...env, ...extra }, ...(input !== undefined ? { input } : {}) })
    const userNamed = async (username: string) =>
      (await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })).json()[0]

    it('users create / get / list / update / delete, with --json output', async () => {
      const username = uniqueName('ada')
      const created = await cli(['users', 'create', username, '--email', `${username}@example.com`, '--first-name', 'Ada',
        '--group', 'etl', '--group', 'ops', '--password-stdin', '--json'], `${GOOD_PASSWORD}\n`)
      assert.equal(created.code, 0, created.stderr)
      const user = JSON.parse(created.stdout)
      assert.equal(user.username, username)
      assert.deepEqual(user.groups, ['etl', 'ops'])
      assert.ok(user.password_changed_at, 'the password from stdin was set')
      assert.ok(!created.stdout.includes(GOOD_PASSWORD))

      const got = await cli(['users', 'get', username, '--json'])
      assert.equal(got.code, 0, got.stderr)
      assert.deepEqual(JSON.parse(got.stdout), user)
      const byId = await cli(['users', 'get', user.id])
      assert.equal(byId.code, 0)
      assert.match(byId.stdout, new RegExp(`^username +${username}$`, 'm'))

      const listed = await cli(['users', 'list', '--group', 'etl', '--q', username, '--json'])
      assert.equal(listed.code, 0, listed.stderr)
      assert.deepEqual(JSON.parse(listed.stdout).map((u: { id: string }) => u.id), [user.id])
      const table = await cli(['users', 'list', '--username', username])
      assert.match(table.stdout, new RegExp(`│ ${user.id} │ ${username} `))

      const updated = await cli(['users', 'update', username, '--last-name', 'Lovelace', '--email', '', '--clear-groups', '--disable', '--json'])
      assert.equal(updated.code, 0, updated.stderr)
      const u2 = JSON.parse(updated.stdout)
      assert.equal(u2.last_name, 'Lovelace')
      assert.equal(u2.email, null)
      assert.deepEqual(u2.groups, [])
      assert.equal(u2.disabled, true)
      const stale = await cli(['users', 'update', user.id, '--enable', '--if-match', '"1"'])
      assert.equal(stale.code, 1)
      assert.match(stale.stderr, /^gatehouse: The user changed since you read it/)

      const deleted = await cli(['users', 'delete', username, '--json'])
      assert.equal(deleted.code, 0, deleted.stderr)
      assert.deepEqual(JSON.parse(deleted.stdout), { deleted: { id: user.id, username }, db_role: null })
      assert.equal(await userNamed(username), undefined)
      const again = await cli(['users', 'delete', username])
      assert.equal(again.code, 1)
      assert.equal(again.stderr, `gatehouse: no user has the id or username "${username}"\n`)
    })

    it('groups create / list / get / add / members / remove / rename / delete, each change seen in the members\' groups', async () => {
      const name = uniqueName('crew')
      const [ada, bob] = [uniqueName('ada'), uniqueName('bob')]
      for (const username of [ada, bob]) assert.equal((await cli(['users', 'create', username])).code, 0)
      const created = await cli(['groups', 'create', name, '--external-id', 'okta-1', '--member', ada, '--json'])
      assert.equal(created.code, 0, created.stderr)
      const group = JSON.parse(created.stdout)
      assert.deepEqual([group.display_name, group.external_id, group.member_count], [name, 'okta-1', 1])
      assert.deepEqual((await userNamed(ada)).groups, [name])

      const added = await cli(['groups', 'add', name, bob])
      assert.equal(added.code, 0, added.stderr)
      assert.equal(added.stdout, `Group ${name} (${group.id}) has 2 members\n`)
      const table = await cli(['groups', 'list', '--search', name])
      assert.equal(table.code, 0, table.stderr)
      assert.match(table.stdout, new RegExp(`│ ${group.id} │ ${name} │ 2 +│ okta-1 `))
      const members = await cli(['groups', 'members', group.id, '--json'])
      assert.deepEqual(JSON.parse(members.stdout).map((u: { username: string }) => u.username), [ada, bob].sort())
      const byName = await cli(['groups', 'get', name])
      assert.match(byName.stdout, /^member_count +2$/m)

      assert.equal((await cli(['groups', 'remove', name, ada])).code, 0)
      assert.deepEqual((await userNamed(ada)).groups, [])
      const renamed = await cli(['groups', 'rename', name, `${name}-x`, '--json'])
      assert.equal(renamed.code, 0, renamed.stderr)
      assert.equal(JSON.parse(renamed.stdout).display_name, `${name}-x`)
      assert.deepEqual((await userNamed(bob)).groups, [`${name}-x`])
      const taken = await cli(['groups', 'create', `${name}-x`])
      assert.equal(taken.code, 1)
      assert.equal(taken.stderr, `gatehouse: A group named "${name}-x" already exists.\n`)

      const deleted = await cli(['groups', 'delete', `${name}-x`])
      assert.equal(deleted.code, 0, deleted.stderr)
      assert.deepEqual((await userNamed(bob)).groups, [])
      const missing = await cli(['groups', 'delete', `${name}-x`])
      assert.equal(missing.code, 1)
      assert.equal(missing.stderr, `gatehouse: no group has the id or name "${name}-x"\n`)
    })

    it('admin create works on the configured database directly, and its key and user work in the service', async () => {
      const local: Record<string, string> = {}
      let schema: string | undefined
      if (dialect.url !== undefined) {
        schema = `gh_test_${randomBytes(6).toString('hex')}`
        Object.assign(local, { DATABASE_URL: dialect.url, DATABASE_SCHEMA: schema })
      } else {
        local.DATABASE_URL = `sqlite:${join(tmp, `admin-${randomBytes(4).toString('hex')}.db`)}`
      }
      try {
        const migrated = await runCli(['migrate', '--json'], { env: local })
        assert.equal(migrated.code, 0, migrated.stderr)
        assert.ok(JSON.parse(migrated.stdout).applied.includes('0001_init'))
        assert.deepEqual(JSON.parse((await runCli(['migrate', '--json'], { env: local })).stdout), { applied: [] })

        const keyRun = await runCli(['admin', 'create', '--json'], { env: local })
        assert.equal(keyRun.code, 0, keyRun.stderr)
        const key = JSON.parse(keyRun.stdout)
        assert.deepEqual(key.scopes, ['admin'])
        const userRun = await runCli(['admin', 'create', '--username', 'boss', '--password-stdin', '--json'], { env: local, input: `${GOOD_PASSWORD}\n` })
        assert.equal(userRun.code, 0, userRun.stderr)
        assert.equal(JSON.parse(userRun.stdout).role, 'admin')
        const weak = await runCli(['admin', 'create', '--username', 'boss2', '--password-stdin'], { env: local, input: 'boss2boss2\n' })
        assert.equal(weak.code, 1)
        assert.match(weak.stderr, /must not contain the username/)
        const invalid = await runCli(['admin', 'create', '--username', 'bad name', '--password-stdin'], { env: local, input: `${GOOD_PASSWORD}\n` })
        assert.equal(invalid.code, 2)
        const longName = await runCli(['admin', 'create', '--name', 'k'.repeat(101)], { env: local })
        assert.equal(longName.code, 2, 'a key name the API would refuse (over 100 characters) is a usage error')

        const config = defaultConfig({ databaseUrl: local.DATABASE_URL!, databaseSchema: schema, logLevel: 'silent' })
        const app = await buildApp({ config, logger: false })
        try {
          const users = await app.inject({ url: '/auth/api/users', headers: auth(key.key) })
          assert.equal(users.statusCode, 200)
          assert.deepEqual(users.json().map((u: { username: string }) => u.username), ['boss'])
          const events = (await app.inject({ url: '/auth/api/events', headers: auth(key.key) })).json()
          assert.deepEqual(events.map((e: { type: string, actor: unknown }) => [e.type, e.actor]).sort(),
            [['api_key.created', { type: 'system', id: 'cli' }], ['user.created', { type: 'system', id: 'cli' }]])
          const { bootstrap } = await import('../src/bootstrap.ts')
          assert.deepEqual(await bootstrap(app.db, app.passwords, config, app.log), {}, 'a first start prints no other key')
        } finally {
          await app.close()
        }
      } finally {
        if (schema !== undefined) await dropSchema(dialect.url!, schema)
      }
    })

    // The HTTP commands do not depend on the service's database: the rest runs once, on SQLite.
    if (dialect.name !== 'sqlite') return

    it('prints the API\'s problem detail and field errors, with exit code 1', async () => {
      const username = uniqueName('dup')
      assert.equal((await cli(['users', 'create', username])).code, 0)
      const dup = await cli(['users', 'create', username.toUpperCase()])
      assert.equal(dup.code, 1)
      assert.match(dup.stderr, /^gatehouse: A user with that username already exists/)
      const invalid = await cli(['users', 'create', 'has space', '--email', 'nope'])
      assert.equal(invalid.code, 1)
      assert.match(invalid.stderr, /\n {2}\/username: /)
      assert.match(invalid.stderr, /\n {2}\/email: /)
      const weak = await cli(['users', 'create', uniqueName(), '--password-stdin'], 'short\n')
      assert.equal(weak.code, 1)
      assert.match(weak.stderr, /at least 8 characters/)
      const badKey = await cli(['users', 'list'], undefined, { GATEHOUSE_API_KEY: 'gatehouse_wrong' })
      assert.equal(badKey.code, 1)
      assert.match(badKey.stderr, /^gatehouse: .+\n$/)
      const empty = await cli(['users', 'update', username])
      assert.equal(empty.code, 2)
      assert.match(empty.stderr, /nothing to change/)
      const noStdin = await cli(['users', 'create', uniqueName(), '--password-stdin'], '')
      assert.equal(noStdin.code, 2)
      assert.match(noStdin.stderr, /empty password/)
    })

    it('says to include the base path when GATEHOUSE_URL misses it', async () => {
      const origin = new URL(env.GATEHOUSE_URL!).origin
      const bare = await cli(['users', 'list'], undefined, { GATEHOUSE_URL: origin })
      assert.equal(bare.code, 1)
      assert.equal(bare.stderr, `gatehouse: No operation at GET /api/users. GATEHOUSE_URL is ${origin} — did you mean ${origin}/auth? ` +
        'It must include the service\'s base path (BASE_PATH, /auth by default).\n')
      // The same through a trailing slash, and from the import operation, which posts on its own.
      const slash = await cli(['users', 'get', 'ada'], undefined, { GATEHOUSE_URL: `${origin}/` })
      assert.match(slash.stderr, new RegExp(`did you mean ${origin}/auth\\?`))
      const other = await cli(['keys', 'list'], undefined, { GATEHOUSE_URL: `${origin}/gate` })
      assert.equal(other.code, 1)
      assert.match(other.stderr, /^gatehouse: No operation at GET \/gate\/api\/api-keys\. GATEHOUSE_URL is .*\/gate: it must include the service's base path \(BASE_PATH, \/auth by default\); is \/gate that path\?\n$/)
      // A 404 of an operation that exists is not about the URL.
      const missing = await cli(['keys', 'revoke', '01a20dac-c4bf-721a-9106-12968674de67'])
      assert.equal(missing.code, 1)
      assert.doesNotMatch(missing.stderr, /GATEHOUSE_URL/)
    })

    it('tables have a rule under the header only; piped they keep every value whole, with COLUMNS they fit it', async () => {
      const prefix = uniqueName('wide')
      const names = [`${prefix}-a-rather-long-username-for-a-table`, `${prefix}-b`]
      for (const name of names) {
        const r = await cli(['users', 'create', name, '--email', `${name}@a-long-domain-name.example.com`, '--first-name', 'Augusta Ada', '--last-name', 'King-Noel, Countess of Lovelace'])
        assert.equal(r.code, 0, r.stderr)
      }
      const ids = await Promise.all(names.map(async name => (await userNamed(name)).id as string))
      const linesOf = (stdout: string): string[] => stdout.trimEnd().split('\n')

      const piped = await cli(['users', 'list', '--q', prefix, '--sort', 'username'])
      assert.equal(piped.code, 0, piped.stderr)
      const plain = linesOf(piped.stdout)
      // Top, header, the rule under it, one line per user, bottom.
      assert.equal(plain.length, 3 + names.length + 1, piped.stdout)
      assert.match(plain[2]!, /^├─+┼/)
      for (const [i, name] of names.entries()) assert.match(plain[3 + i]!, new RegExp(`^│ ${ids[i]} │ ${name} +│ ${name}@a-long-domain-name\\.example\\.com `))
      assert.ok([...plain[0]!].length > 100, 'piped output is as wide as its values')

      const narrow = await cli(['users', 'list', '--q', prefix, '--sort', 'username'], undefined, { COLUMNS: '80' })
      assert.equal(narrow.code, 0, narrow.stderr)
      const fitted = linesOf(narrow.stdout)
      assert.equal(fitted.length, plain.length, narrow.stdout)
      for (const line of fitted) assert.ok([...line].length <= 80, `wider than 80 columns: ${line}`)
      assert.equal([...fitted[0]!].length, 80, 'the table uses the width it has')
      assert.match(fitted[3]!, /… │/, 'cut values end in an ellipsis')
      assert.match(fitted[3]!, /│ user │/, 'a narrow column keeps its width')

      const json = await cli(['users', 'list', '--q', prefix, '--sort', 'username', '--json'], undefined, { COLUMNS: '80' })
      assert.deepEqual(JSON.parse(json.stdout).map((u: { username: string }) => u.username), names)
    })

    it('tables fit the width of the terminal they are printed on', { skip: SCRIPT === undefined && 'needs script(1) for a pseudo-terminal' }, async () => {
      const prefix = uniqueName('tty')
      const name = `${prefix}-with-a-username-long-enough-to-need-cutting`
      assert.equal((await cli(['users', 'create', name, '--email', `${name}@example.com`])).code, 0)
      const r = await runCliOnTerminal(['users', 'list', '--q', prefix], { env, columns: 72 })
      assert.equal(r.code, 0, r.output)
      const lines = r.output.trimEnd().split('\r\n')
      assert.equal(lines.length, 5, r.output)
      for (const line of lines) assert.ok([...line].length <= 72, `wider than the terminal: ${line}`)
      assert.match(lines[3]!, /…/)
    })

    it('users import on a terminal shows its progress from the start: rows done of all, and the rate', { skip: SCRIPT === undefined && 'needs script(1) for a pseudo-terminal' }, async () => {
      const names = [uniqueName('prog'), uniqueName('prog'), uniqueName('prog')]
      const file = join(tmp, `${names[0]!}.jsonl`)
      writeFileSync(file, names.map(username => JSON.stringify({ username })).join('\n') + '\n')
      const r = await runCliOnTerminal(['users', 'import', file, '--batch-size', '1'], { env, columns: 100 })
      assert.equal(r.code, 0, r.output)
      // Each frame starts with \r and ends clearing the rest of the line (ESC [K); lines end in \r\n.
      const frames = r.output.replaceAll('\u001b[K', '').split(/\r\n|\r/).map(f => f.trim()).filter(f => f !== '')
      const importing = frames.filter(f => f.startsWith('importing '))
      assert.ok(frames.some(f => f.startsWith(`reading ${file}: `)), r.output)
      assert.ok(frames.some(f => /^checking 3 rows against the existing users: \d+ read$/.test(f)), r.output)
      assert.match(importing[0] ?? '', /^importing \[\.{20}\] 0\/3 rows, \d+ rows\/s, \d+ s$/, 'drawn before the first batch is answered')
      assert.match(importing.at(-1) ?? '', /^importing \[#{20}\] 3\/3 rows, \d+ rows\/s, \d+ s/)
      assert.match(r.output, /\r\nCreated 3 of 3 users\r\n/, 'the report starts on a line of its own')
      for (const name of names) assert.ok(await userNamed(name), name)

      // Piped, stderr stays quiet.
      const again = await cli(['users', 'import', file, '--dry-run'])
      assert.equal(again.stderr, '')
    })

    it('keys create / list / rotate / revoke; a secret is printed once and works at once', async () => {
      const created = await cli(['keys', 'create', 'cli test', '--scope', 'users:read', '--json'])
      assert.equal(created.code, 0, created.stderr)
      const key = JSON.parse(created.stdout)
      assert.deepEqual(key.scopes, ['users:read'])
      const ok = async (secret: string) => (await t.app.inject({ url: '/auth/api/users?limit=1', headers: auth(secret) })).statusCode
      assert.equal(await ok(key.key), 200)

      const text = await cli(['keys', 'create', 'text output'])
      assert.match(text.stdout, /^API key \(shown once, store it now\): gatehouse_\w{43}\n/)

      const rotated = await cli(['keys', 'rotate', key.id, '--json'])
      assert.equal(rotated.code, 0, rotated.stderr)
      const newSecret = JSON.parse(rotated.stdout).key
      assert.notEqual(newSecret, key.key)
      assert.equal(await ok(key.key), 401)
      assert.equal(await ok(newSecret), 200)

      const listed = JSON.parse((await cli(['keys', 'list', '--json'])).stdout)
      assert.ok(listed.some((k: { id: string }) => k.id === key.id))
      assert.ok(listed.every((k: Record<string, unknown>) => !('key' in k)))

      const revoked = await cli(['keys', 'revoke', key.id])
      assert.equal(revoked.code, 0, revoked.stderr)
      assert.equal(revoked.stdout, `Revoked API key ${key.id}\n`)
      assert.equal(await ok(newSecret), 401)
      const withRevoked = JSON.parse((await cli(['keys', 'list', '--include-revoked', '--json'])).stdout)
      assert.ok(withRevoked.find((k: { id: string }) => k.id === key.id).revoked_at)
      const missing = await cli(['keys', 'rotate', '01900000-0000-7000-8000-000000000000'])
      assert.equal(missing.code, 1)
      assert.match(missing.stderr, /No API key has the id/)
    })

    it('users export writes one JSON line per user, following pages', async () => {
      const group = uniqueName('exp')
      const names = [uniqueName('e'), uniqueName('e'), uniqueName('e')]
      for (const username of names) {
        await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username, groups: [group] } })
      }
      const r = await cli(['users', 'export', '--group', group, '--sort', 'username'])
      assert.equal(r.code, 0, r.stderr)
      const lines = r.stdout.trimEnd().split('\n').map(l => JSON.parse(l))
      assert.deepEqual(lines.map(u => u.username), [...names].sort())
      assert.ok(lines.every(u => typeof u.id === 'string' && !('password' in u)))

      const file = join(tmp, `${group}.jsonl`)
      const toFile = await cli(['users', 'export', '--group', group, '--output', file])
      assert.equal(toFile.code, 0, toFile.stderr)
      assert.deepEqual(readFileSync(file, 'utf8').trimEnd().split('\n').map(l => JSON.parse(l).username), names, 'oldest first by default')
      assert.match(toFile.stderr, /exported 3 users/)
    })

    it('users import: all or nothing by default, --dry-run creates nothing, --continue-on-error keeps the valid rows', async () => {
      const [a, b, c] = [uniqueName('imp'), uniqueName('imp'), uniqueName('imp')]
      const csv = join(tmp, `${a}.csv`)
      writeFileSync(csv, `username,email,first_name,groups,disabled\n${a},${a}@example.com,"Ada, the first",etl;ops,false\n${b},not-an-email,,,\n${c},,,"[""x""]",yes\n`)

      const all = await cli(['users', 'import', csv])
      assert.equal(all.code, 1)
      assert.match(all.stdout, new RegExp(`^line 3 \\(${b}\\): /email: must match format "email"$`, 'm'))
      assert.match(all.stdout, /Nothing was imported/)
      assert.equal(await userNamed(a), undefined)

      const dry = await cli(['users', 'import', csv, '--dry-run', '--json'])
      assert.equal(dry.code, 1)
      const report = JSON.parse(dry.stdout)
      assert.equal(report.dry_run, true)
      assert.deepEqual(report.rows.map((r: { line: number, status: string }) => [r.line, r.status]), [[2, 'valid'], [3, 'failed'], [4, 'valid']])
      assert.equal(await userNamed(a), undefined)

      const some = await cli(['users', 'import', csv, '--continue-on-error', '--json'])
      assert.equal(some.code, 1)
      const done = JSON.parse(some.stdout)
      assert.equal(done.created, 2)
      assert.equal(done.failed, 1)
      const ada = await userNamed(a)
      assert.equal(ada.first_name, 'Ada, the first')
      assert.deepEqual(ada.groups, ['etl', 'ops'])
      assert.equal((await userNamed(c)).disabled, true)

      // The export of those users imports again, elsewhere, once they are gone here; here they conflict.
      const again = await cli(['users', 'import', csv, '--dry-run'])
      assert.match(again.stdout, new RegExp(`line 2 \\(${a}\\): a user named "${a}" already exists`))

      const jsonl = join(tmp, `${a}.jsonl`)
      const d = uniqueName('imp')
      writeFileSync(jsonl, `{"username":"${d}","groups":["x"],"id":"ignored","created_at":"2020-01-01T00:00:00Z"}\n\n{"username":"${uniqueName()}","password_hash":"$argon2id$v=19$m=19456,t=2,p=1$x$y"}\n`)
      const hashes = await cli(['users', 'import', jsonl, '--continue-on-error'])
      assert.equal(hashes.code, 1)
      assert.match(hashes.stdout, /line 3 .*\/password_hash: not an argon2 PHC string.*password_hash_unsupported/)
      assert.match(hashes.stdout, /Created 1 of 2 users/)
      assert.deepEqual((await userNamed(d)).groups, ['x'])
    })

    it('users import moves users with their password hashes (bcrypt, scrypt) and plaintext passwords; sign-in upgrades the hashes', async () => {
      const [b, s, p, big] = [uniqueName('hb'), uniqueName('hs'), uniqueName('hp'), uniqueName('hx')]
      const salt = randomBytes(16)
      const b64 = (x: Buffer): string => x.toString('base64').replace(/=+$/, '')
      const scryptHash = `$scrypt$ln=10,r=8,p=1$${b64(salt)}$${b64(scryptSync(GOOD_PASSWORD, salt, 32, { N: 1024, r: 8, p: 1 }))}`
      const csv = join(tmp, `${b}.csv`)
      writeFileSync(csv, `username,email,password_hash,password\n${b},${b}@example.com,${bcryptHashSync(GOOD_PASSWORD, 4)},\n${s},,"${scryptHash}",\n${p},,,${GOOD_PASSWORD}\n`)
      const r = await cli(['users', 'import', csv, '--json'])
      assert.equal(r.code, 0, r.stdout + r.stderr)
      assert.equal(JSON.parse(r.stdout).created, 3)
      for (const username of [b, s, p]) {
        const login = await t.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
        assert.equal(login.statusCode, 200, username)
        const row = await t.app.db.selectFrom('users').select('password_hash').where('username_key', '=', username.toLowerCase()).executeTakeFirstOrThrow()
        assert.match(row.password_hash ?? '', /^\$argon2id\$v=19\$m=19456,t=2,p=1\$/)
      }

      // Out-of-bound parameters fail the row before anything is sent.
      const jsonl = join(tmp, `${big}.jsonl`)
      writeFileSync(jsonl, `{"username":"${big}","password_hash":"$2b$16$${'a'.repeat(53)}"}\n`)
      const refused = await cli(['users', 'import', jsonl, '--dry-run'])
      assert.equal(refused.code, 1)
      assert.match(refused.stdout, /line 1 .*bcrypt cost is over the import bound.*password_hash_out_of_bounds/)
    })

    it('users import all-or-nothing deletes again what earlier batches created when the service refuses a row', async () => {
      // The service's password rules are not checked by the CLI: the fifth row fails in the third batch of two.
      const names = Array.from({ length: 6 }, () => uniqueName('rb'))
      const rows = names.map((username, i) => JSON.stringify(i === 4 ? { username, password: 'short' } : { username }))
      const file = join(tmp, `${names[0]!}.jsonl`)
      writeFileSync(file, rows.join('\n') + '\n')
      const r = await cli(['users', 'import', file, '--json', '--batch-size', '2'])
      assert.equal(r.code, 1, r.stderr)
      const report = JSON.parse(r.stdout)
      assert.equal(report.created, 0)
      assert.equal(report.failed, 1)
      assert.equal(report.rolled_back, 4)
      assert.deepEqual(report.rows.map((row: { status: string }) => row.status), ['rolled_back', 'rolled_back', 'rolled_back', 'rolled_back', 'failed', 'not_attempted'])
      assert.match(report.rows[4].error, /at least 8 characters.*password_too_short/)
      for (const username of names) assert.equal(await userNamed(username), undefined, username)

      const human = await cli(['users', 'import', file, '--batch-size', '2'])
      assert.match(human.stdout, /Nothing was imported: 1 of 6 rows failed \(the 4 users created before the failure were deleted again\)/)
      const bad = await cli(['users', 'import', file, '--batch-size', '1001'])
      assert.equal(bad.code, 2)
    })

    it('users import needs an admin key: the service refuses the batch as a whole', async () => {
      const limited = (await t.app.inject({ method: 'POST', url: '/auth/api/api-keys', headers: auth(t.adminKey), payload: { name: 'importer', scopes: ['users:read', 'users:write'] } })).json().key
      const names = [uniqueName('lk'), uniqueName('lk')]
      const file = join(tmp, `${names[0]!}.jsonl`)
      writeFileSync(file, names.map(username => JSON.stringify({ username })).join('\n') + '\n')
      const r = await cli(['users', 'import', file, '--json'], undefined, { GATEHOUSE_API_KEY: limited })
      assert.equal(r.code, 1, r.stderr)
      const report = JSON.parse(r.stdout)
      assert.equal(report.created, 0)
      assert.equal(report.failed, 2)
      assert.match(report.rows[0].error, /"admin" scope/)
      for (const username of names) assert.equal(await userNamed(username), undefined, username)
    })
  })
}
