import assert from 'node:assert/strict'
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { isAbsolute, join } from 'node:path'
import { stripVTControlCharacters } from 'node:util'
import { after, before, describe, it } from 'node:test'
import fc from 'fast-check'
import pg from 'pg'
import { createRoleSql, parsePrivileges, roleNameProblem, saslprep, scramVerifier } from '../src/cli/pg-role.ts'
import { SUPERUSER_PRIVILEGES_OPTION } from '../src/lib/pg-role-name.ts'
import { auth, createTestApp, type TestApp } from './helpers.ts'
import { listen, runCli, runCliOnTerminal, SCRIPT } from './cli-helpers.ts'
import { waitFor } from './polling.ts'

const STRICT = /^[a-z_][a-z0-9_$]{0,62}$/
const HOSTILE = [
  'x"; DROP ROLE postgres; --',
  'a" SUPERUSER --',
  "robert'); DROP TABLE users; --",
  'ädmin',
  '\u0430dmin', // Cyrillic a
  'Ada',
  'has space',
  'a\u0000b',
  '',
  'a'.repeat(64),
  'pg_signal_backend',
  'pg_x',
  'postgres',
  'public',
  'none',
  'current_user',
  'session_user',
  'current_role'
]

/** Checks a verifier against a password the way a server checks a client: recompute both keys from the stored salt. */
function verifierMatches (verifier: string, password: string): boolean {
  const match = /^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)$/.exec(verifier)
  if (match === null) return false
  const salted = pbkdf2Sync(password, Buffer.from(match[2]!, 'base64'), Number(match[1]), 32, 'sha256')
  const storedKey = createHash('sha256').update(createHmac('sha256', salted).update('Client Key').digest()).digest('base64')
  const serverKey = createHmac('sha256', salted).update('Server Key').digest('base64')
  return storedKey === match[3] && serverKey === match[4]
}

describe('db-user rules (no database needed)', () => {
  it('accepts exactly the lower-case identifiers of at most 63 bytes that are not reserved', () => {
    for (const name of HOSTILE) assert.notEqual(roleNameProblem(name), undefined, JSON.stringify(name))
    for (const name of ['ada', '_x', 'a$1', 'a'.repeat(63)]) assert.equal(roleNameProblem(name), undefined, name)
    fc.assert(fc.property(fc.oneof(fc.string({ unit: 'binary' }), fc.stringMatching(/^[a-z_][a-z0-9_$]{0,70}$/)), (name) => {
      const problem = roleNameProblem(name)
      if (problem !== undefined) return
      assert.match(name, STRICT)
      assert.ok(Buffer.byteLength(name) <= 63 && !name.startsWith('pg_'))
      // Nothing in an accepted name needs escaping: the quoted name is the name in double quotes.
      assert.ok(createRoleSql(name, new Set(['login']), undefined).startsWith(`CREATE ROLE "${name}" WITH `))
    }), { numRuns: 2000 })
  })

  it('spells out every attribute, and takes only the known privileges', () => {
    assert.equal(createRoleSql('ada', parsePrivileges('login,createdb'), undefined),
      'CREATE ROLE "ada" WITH LOGIN NOSUPERUSER CREATEDB NOCREATEROLE INHERIT NOREPLICATION NOBYPASSRLS')
    assert.throws(() => parsePrivileges('login,replication'), /unknown privilege "replication"/)
    assert.throws(() => parsePrivileges(','), /comma-separated/)
    assert.throws(() => createRoleSql('a"b', new Set(), undefined), /not a valid database role name/)
  })

  it('always gives a database user LOGIN, as CREATE USER does, whatever --privileges lists', () => {
    assert.match(createRoleSql('ada', parsePrivileges(' SUPERUSER '), scramVerifier('x')), /^CREATE ROLE "ada" WITH LOGIN SUPERUSER NOCREATEDB NOCREATEROLE .* PASSWORD 'SCRAM-SHA-256\$4096:/)
    assert.match(createRoleSql('ada', parsePrivileges('superuser,createdb'), undefined), /^CREATE ROLE "ada" WITH LOGIN SUPERUSER CREATEDB NOCREATEROLE /)
    assert.match(createRoleSql('ada', new Set(), undefined), /^CREATE ROLE "ada" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE /)
    assert.deepEqual([...parsePrivileges('createdb')].sort(), ['createdb', 'login'])
    assert.deepEqual([...parsePrivileges('login')], ['login'], '"login" is still accepted, and adds nothing')
    assert.throws(() => parsePrivileges('nologin'), /unknown privilege "nologin".*always has LOGIN/)
  })

  it('refuses --privileges superuser without --yes when not on a terminal, with exit code 2, before anything is asked or changed', async () => {
    for (const args of [
      ['db-user', 'create', 'ada', '--privileges', 'superuser', '--password-stdin'],
      ['users', 'create', 'ada', '--db-user', '--privileges', 'createdb,superuser', '--password-stdin']
    ]) {
      // No SERVICE_DATABASE_URL and no reachable service: the refusal comes before either is needed.
      const r = await runCli(args, { env: { GATEHOUSE_URL: 'http://127.0.0.1:9/auth', GATEHOUSE_API_KEY: 'unused' }, input: 'a password\n' })
      assert.equal(r.code, 2, r.stderr)
      assert.equal(r.stdout, '')
      assert.match(r.stderr, /gatehouse: --privileges superuser needs a confirmation: run on a terminal to be asked, or add --yes\. Nothing was changed\.\n$/, args.join(' '))
    }
  })

  it('asks on a terminal before a superuser role, and goes on only when the answer is yes', { skip: SCRIPT === undefined && 'needs script(1) for a pseudo-terminal' }, async () => {
    const question = 'Type "yes" to go on: '
    const refused = await runCliOnTerminal(['db-user', 'create', 'ada', '--privileges', 'superuser'], { columns: 100, answers: [{ after: question, type: 'no\r' }] })
    assert.equal(refused.code, 1, refused.output)
    // What the terminal shows, without readline's cursor moves and the terminal's carriage returns.
    const shown = (output: string): string => stripVTControlCharacters(output).replaceAll('\r', '')
    assert.match(shown(refused.output), /^gatehouse: warning: superuser bypasses[^\n]*\nCreate the database role ada as a SUPERUSER of the whole cluster\? Type "yes" to go on: no\ngatehouse: not confirmed; nothing was changed\n$/)
    assert.ok(!refused.output.includes('Password:'), 'no password is asked for')
    // "yes" goes on to the password; Ctrl-C there stops it before any database is reached.
    const confirmed = await runCliOnTerminal(['db-user', 'create', 'ada', '--privileges', 'superuser'], { columns: 100, answers: [{ after: question, type: 'yes\r' }, { after: 'Password: ', type: '\u0003' }] })
    assert.equal(confirmed.code, 130, confirmed.output)
    assert.match(shown(confirmed.output), /Type "yes" to go on: yes\nPassword: /)
    // Without superuser nothing is asked: straight to the password.
    const plain = await runCliOnTerminal(['db-user', 'create', 'ada', '--privileges', 'createdb'], { columns: 100, answers: [{ after: 'Password: ', type: '\u0003' }] })
    assert.equal(plain.code, 130, plain.output)
    assert.ok(!plain.output.includes(question))
  })

  it('spells the superuser step one way in the help of both commands and in the docs, and never asks for login in the list', async () => {
    assert.equal(SUPERUSER_PRIVILEGES_OPTION, '--privileges createdb,superuser')
    assert.deepEqual([...parsePrivileges(SUPERUSER_PRIVILEGES_OPTION.split(' ')[1]!)].sort(), ['createdb', 'login', 'superuser'])
    for (const args of [['db-user', 'create', '--help'], ['users', 'create', '--help']]) {
      const r = await runCli(args)
      assert.equal(r.code, 0, r.stderr)
      // Commander wraps long descriptions; the words are what matters.
      const help = r.stdout.replace(/\s+/g, ' ')
      assert.ok(help.includes(SUPERUSER_PRIVILEGES_OPTION), `${args.join(' ')}: ${help}`)
      assert.ok(help.includes('the role always has LOGIN'), args.join(' '))
    }
    const root = new URL('..', import.meta.url)
    const docs = ['README.md', ...readdirSync(new URL('docs/', root)).filter(f => f.endsWith('.md')).map(f => `docs/${f}`)]
    for (const file of ['README.md', 'docs/cli.md', 'docs/console.md']) {
      assert.ok(readFileSync(new URL(file, root), 'utf8').replace(/\s+/g, ' ').includes(SUPERUSER_PRIVILEGES_OPTION), file)
    }
    const sources = readdirSync(new URL('src/', root), { recursive: true, encoding: 'utf8' }).filter(f => f.endsWith('.ts')).map(f => `src/${f}`)
    for (const file of [...docs, ...sources]) {
      // `login` in a list is accepted but adds nothing; showing it suggests it is needed.
      assert.doesNotMatch(readFileSync(new URL(file, root), 'utf8'), /--privileges[ =]\S*(,login|login,)/, file)
    }
  })

  it('builds a SCRAM-SHA-256 verifier of the password with a fresh 16-byte salt', () => {
    const a = scramVerifier('correct horse battery staple')
    const b = scramVerifier('correct horse battery staple')
    assert.notEqual(a, b)
    assert.match(a, /^SCRAM-SHA-256\$4096:[A-Za-z0-9+/]{22}==\$[A-Za-z0-9+/]{43}=:[A-Za-z0-9+/]{43}=$/)
    assert.ok(verifierMatches(a, 'correct horse battery staple'))
    assert.ok(!verifierMatches(a, 'correct horse battery staplE'))
    assert.equal(saslprep('I\u00ADX\u00A0\u2163'), 'IX IV')
    assert.equal(saslprep('ab\u0007\u00e9'), 'ab\u0007\u00e9', 'a prohibited character keeps the raw string, as PostgreSQL does')
  })
})

const url = process.env.TEST_DATABASE_URL
const skip = url === undefined || url === '' ? 'needs TEST_DATABASE_URL (PostgreSQL)' : false

describe('gatehouse db-user against PostgreSQL', { skip }, () => {
  let admin: pg.Client
  const made = new Set<string>()
  const newName = (): string => {
    const name = `gh_cli_${randomBytes(5).toString('hex')}`
    made.add(name)
    return name
  }
  const env = { SERVICE_DATABASE_URL: url ?? '' }
  const roleRow = async (name: string) => (await admin.query(
    'SELECT rolname, rolsuper, rolcreatedb, rolcreaterole, rolcanlogin, rolinherit, rolreplication, rolbypassrls, rolpassword FROM pg_authid WHERE rolname = $1', [name]
  )).rows[0] as Record<string, unknown> | undefined
  const roleCount = async () => Number((await admin.query('SELECT count(*) AS n FROM pg_roles')).rows[0].n)

  before(async () => {
    admin = new pg.Client({ connectionString: url })
    await admin.connect()
  })
  after(async () => {
    for (const name of made) await admin.query(`DROP ROLE IF EXISTS ${pg.escapeIdentifier(name)}`)
    await admin.end()
  })

  it('computes byte for byte the verifier PostgreSQL computes itself, SASLprep included', async () => {
    await admin.query("SET password_encryption = 'scram-sha-256'")
    for (const password of ['plain ascii 1!', 'p\u00e4ssw\u00f6rd\u00A0\uFB01\u00ADx', '\u2163 \uFF21\uFF22', 'ab\u0007\u00e9', '\uE000\u00e9\u00e9']) {
      const name = newName()
      await admin.query(`CREATE ROLE ${pg.escapeIdentifier(name)} NOLOGIN PASSWORD ${pg.escapeLiteral(password)}`)
      const stored = String((await roleRow(name))!.rolpassword)
      const [, iterations, salt] = /^SCRAM-SHA-256\$(\d+):([^$]+)\$/.exec(stored)!
      assert.equal(scramVerifier(password, { salt: Buffer.from(salt!, 'base64'), iterations: Number(iterations) }), stored, JSON.stringify(password))
    }
  })

  it('creates a role with exactly the requested attributes, a SCRAM verifier of the password, and drops it', async () => {
    const name = newName()
    const password = `pw ${randomBytes(6).toString('hex')}`
    const r = await runCli(['db-user', 'create', name, '--password-stdin', '--json'], { env, input: `${password}\n` })
    assert.equal(r.code, 0, r.stderr)
    assert.deepEqual(JSON.parse(r.stdout), { role: name, privileges: ['createdb', 'login'], created: true, event_id: null })
    assert.equal(r.stderr, 'gatehouse: the role change is not recorded in gatehouse\'s events; set GATEHOUSE_API_KEY (and GATEHOUSE_URL) to record it as database_role.created\n')
    const row = (await roleRow(name))!
    assert.deepEqual({ ...row, rolpassword: undefined }, {
      rolname: name, rolsuper: false, rolcreatedb: true, rolcreaterole: false, rolcanlogin: true, rolinherit: true, rolreplication: false, rolbypassrls: false, rolpassword: undefined
    })
    assert.ok(String(row.rolpassword).startsWith('SCRAM-SHA-256$4096:'))
    assert.ok(verifierMatches(String(row.rolpassword), password))

    const target = new URL(url!)
    const asRole = new pg.Client({ user: name, password, host: target.hostname, port: Number(target.port || 5432), database: target.pathname.slice(1) })
    await asRole.connect()
    assert.equal((await asRole.query('SELECT current_user AS u')).rows[0].u, name)
    await asRole.end()

    const superName = newName()
    const su = await runCli(['db-user', 'create', superName, '--privileges', 'superuser,createrole', '--password-stdin', '--yes', '--json'], { env, input: 'another password\n' })
    assert.equal(su.code, 0, su.stderr)
    assert.match(su.stderr, /^gatehouse: warning: superuser bypasses every permission check[^\n]*\ngatehouse: the role change is not recorded[^\n]*\n$/)
    assert.deepEqual(JSON.parse(su.stdout).privileges, ['superuser', 'createrole', 'login'])
    assert.deepEqual([(await roleRow(superName))!.rolsuper, (await roleRow(superName))!.rolcanlogin, (await roleRow(superName))!.rolcreaterole, (await roleRow(superName))!.rolcreatedb], [true, true, true, false])

    const dropped = await runCli(['db-user', 'drop', name], { env })
    assert.equal(dropped.code, 0, dropped.stderr)
    assert.equal(dropped.stdout, `Dropped database role ${name}\n`)
    assert.equal(await roleRow(name), undefined)
    assert.ok(await roleRow(superName), 'only the named role is dropped')
    const again = await runCli(['db-user', 'drop', name], { env })
    assert.equal(again.code, 1)
    assert.match(again.stderr, /no database role is named/)
  })

  it('creates a database user that can log in even when --privileges leaves login out', async () => {
    const name = newName()
    const password = `pw ${randomBytes(6).toString('hex')}`
    const r = await runCli(['db-user', 'create', name, '--privileges', 'superuser,createdb', '--password-stdin', '--yes'], { env, input: `${password}\n` })
    assert.equal(r.code, 0, r.stderr)
    assert.equal(r.stdout, `Created database role ${name} (superuser, createdb, login)\n`)
    assert.equal((await roleRow(name))!.rolcanlogin, true)
    const target = new URL(url!)
    const asRole = new pg.Client({ user: name, password, host: target.hostname, port: Number(target.port || 5432), database: target.pathname.slice(1) })
    await asRole.connect()
    assert.equal((await asRole.query('SELECT current_user AS u')).rows[0].u, name)
    await asRole.end()
  })

  it('never alters an existing role, and refuses reserved and hostile names without touching the database', async () => {
    const name = newName()
    assert.equal((await runCli(['db-user', 'create', name, '--password-stdin'], { env, input: 'first password\n' })).code, 0)
    const before = (await roleRow(name))!.rolpassword
    const second = await runCli(['db-user', 'create', name, '--privileges', 'superuser,login', '--password-stdin', '--yes'], { env, input: 'second password\n' })
    assert.equal(second.code, 1)
    assert.match(second.stderr, /already exists; gatehouse never alters an existing role/)
    assert.equal((await roleRow(name))!.rolpassword, before)
    assert.equal((await roleRow(name))!.rolsuper, false)

    const postgresBefore = (await roleRow('postgres'))?.rolpassword ?? null
    const count = await roleCount()
    for (const hostile of ['postgres', 'x"; DROP ROLE postgres; --', 'a" SUPERUSER --', '\u00e4dmin', 'a'.repeat(64)]) {
      const r = await runCli(['db-user', 'create', hostile, '--password-stdin'], { env, input: 'some password\n' })
      assert.equal(r.code, 2, hostile)
      assert.match(r.stderr, /^gatehouse: not a valid database role name /, hostile)
    }
    assert.equal(await roleCount(), count)
    assert.equal((await roleRow('postgres'))?.rolpassword ?? null, postgresBefore)

    const longest = `gh_cli_${'x'.repeat(56)}`
    made.add(longest)
    const long = await runCli(['db-user', 'create', longest, '--password-stdin'], { env, input: 'some password\n' })
    assert.equal(long.code, 0, long.stderr)
    assert.equal((await roleRow(longest))!.rolname, longest, 'a 63-byte name is kept whole')
  })

  describe('users create/delete --db-user against a running service', () => {
    let t: TestApp
    let cliEnv: Record<string, string>
    before(async () => {
      t = await createTestApp({ name: 'sqlite', url: undefined })
      cliEnv = { GATEHOUSE_URL: await listen(t.app), GATEHOUSE_API_KEY: t.adminKey, SERVICE_DATABASE_URL: url ?? '' }
    })
    after(async () => { await t.app.close() })
    const userNamed = async (username: string) =>
      (await t.app.inject({ url: `/auth/api/users?username=${username}`, headers: auth(t.adminKey) })).json()[0]

    it('creates the user and the role, then deletes both', async () => {
      const name = newName()
      const password = `pw ${randomBytes(8).toString('hex')}`
      const created = await runCli(['users', 'create', name, '--db-user', '--privileges', 'login', '--password-stdin', '--json'], { env: cliEnv, input: `${password}\n` })
      assert.equal(created.code, 0, created.stderr)
      const out = JSON.parse(created.stdout)
      assert.deepEqual({ ...out.db_role, event_id: undefined }, { name, privileges: ['login'], event_id: undefined })
      assert.equal((await userNamed(name)).id, out.id)
      const row = (await roleRow(name))!
      assert.deepEqual([row.rolcanlogin, row.rolcreatedb, row.rolsuper], [true, false, false])
      assert.ok(verifierMatches(String(row.rolpassword), password), 'the role has the user\'s password')

      const noRole = await runCli(['users', 'create', 'Not.A.Role', '--db-user', '--password-stdin'], { env: cliEnv, input: `${password}\n` })
      assert.equal(noRole.code, 2)
      assert.match(noRole.stderr, /not a valid database role name "Not.A.Role"/)
      assert.equal(await userNamed('Not.A.Role'), undefined, 'nothing is created when the role name is wrong')

      const deleted = await runCli(['users', 'delete', name, '--db-user'], { env: cliEnv })
      assert.equal(deleted.code, 0, deleted.stderr)
      assert.equal(deleted.stdout, `Deleted user ${name} (${out.id})\nDropped database role ${name}\n`)
      assert.equal(await userNamed(name), undefined)
      assert.equal(await roleRow(name), undefined)

      const other = newName()
      await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: { username: other } })
      const missingRole = await runCli(['users', 'delete', other, '--db-user'], { env: cliEnv })
      assert.equal(missingRole.code, 1)
      assert.match(missingRole.stderr, /no database role is named .*the user was not deleted/)
      assert.ok(await userNamed(other))
    })

    it('records each role change as a database_role event whose actor is the key, with the role, its privileges, the database and the user', async () => {
      const eventsOf = async (type: string, role: string) =>
        ((await t.app.inject({ url: `/auth/api/events?type=${type}`, headers: auth(t.adminKey) })).json() as Array<Record<string, any>>).filter(e => e.data.role === role)
      const keys = (await t.app.inject({ url: '/auth/api/api-keys', headers: auth(t.adminKey) })).json() as Array<{ id: string, prefix: string }>
      const keyId = keys.find(k => t.adminKey.startsWith(k.prefix))!.id
      const database = `${new URL(url!).hostname}:${new URL(url!).port || '5432'}/${new URL(url!).pathname.slice(1)}`

      const name = newName()
      const created = await runCli(['db-user', 'create', name, '--privileges', 'createrole,createdb', '--password-stdin', '--json'], { env: cliEnv, input: 'role pass phrase 7\n' })
      assert.equal(created.code, 0, created.stderr)
      assert.equal(created.stderr, '')
      const [event, ...more] = await eventsOf('database_role.created', name)
      assert.equal(more.length, 0)
      assert.equal(JSON.parse(created.stdout).event_id, event!.id)
      assert.deepEqual({ actor: event!.actor, target: event!.target, data: event!.data }, {
        actor: { type: 'api_key', id: keyId },
        target: null,
        data: { role: name, database, privileges: ['createdb', 'createrole', 'login'] }
      })
      assert.equal((await runCli(['db-user', 'drop', name], { env: cliEnv })).code, 0)
      assert.deepEqual((await eventsOf('database_role.dropped', name)).map(e => e.data), [{ role: name, database }])

      const user = newName()
      const made = await runCli(['users', 'create', user, '--db-user', '--password-stdin', '--json'], { env: cliEnv, input: 'role pass phrase 8\n' })
      assert.equal(made.code, 0, made.stderr)
      const userId = JSON.parse(made.stdout).id as string
      const [withUser] = await eventsOf('database_role.created', user)
      assert.equal(JSON.parse(made.stdout).db_role.event_id, withUser!.id)
      assert.deepEqual(withUser!.data, { role: user, database, privileges: ['createdb', 'login'], user_id: userId })
      assert.deepEqual(withUser!.target, { type: 'user', id: userId }, 'the user\'s own events show it')
      assert.equal((await runCli(['users', 'delete', user, '--db-user'], { env: cliEnv })).code, 0)
      assert.deepEqual((await eventsOf('database_role.dropped', user)).map(e => e.data), [{ role: user, database, user_id: userId }])
    })

    it('with log_statement=all, the server log never holds a plaintext password; a failed database step deletes the user again', async (ctx) => {
      const logFile = await serverLog(admin)
      if (logFile === undefined) {
        ctx.skip('the PostgreSQL server log is not readable from here')
        return
      }
      const limited = newName()
      await admin.query(`CREATE ROLE ${pg.escapeIdentifier(limited)} LOGIN NOCREATEROLE NOSUPERUSER`)
      const offset = statSync(logFile).size
      await admin.query("ALTER SYSTEM SET log_statement = 'all'")
      await admin.query('SELECT pg_reload_conf()')
      try {
        await waitFor('the server to log every statement', async () => {
          const probe = new pg.Client({ connectionString: url })
          await probe.connect()
          const value = (await probe.query('SHOW log_statement')).rows[0].log_statement
          await probe.end()
          return value === 'all'
        })
        const sentinels = [`Sentinel-${randomBytes(8).toString('hex')}`, `Sentinel-${randomBytes(8).toString('hex')}`]
        const name = newName()
        const ok = await runCli(['db-user', 'create', name, '--password-stdin'], { env, input: `${sentinels[0]!}\n` })
        assert.equal(ok.code, 0, ok.stderr)

        // Connected as a role that may not create roles: the user is created, CREATE ROLE fails, the user is deleted again.
        const target = new URL(url!)
        target.username = limited
        target.password = ''
        const username = newName()
        const failed = await runCli(['users', 'create', username, '--db-user', '--password-stdin'],
          { env: { ...cliEnv, SERVICE_DATABASE_URL: target.toString() }, input: `${sentinels[1]!}\n` })
        assert.equal(failed.code, 1)
        assert.match(failed.stderr, new RegExp(`^gatehouse: the database role failed: PostgreSQL refused: permission denied to create role.*; the user ${username} was deleted again, so nothing was created\\n$`))
        assert.equal(await userNamed(username), undefined)
        assert.equal(await roleRow(username), undefined)

        let log = ''
        await waitFor('both CREATE ROLE statements in the server log', async () => {
          // `offset` counts bytes (the file's size): cut the bytes, then decode. Decoding first and
          // cutting characters skipped as many characters as the log held bytes beyond one per
          // character, and once other tests' logged statements held enough non-ASCII text, that
          // was all of what this test waits for.
          log = readFileSync(logFile).subarray(offset).toString('utf8')
          return log.includes(`CREATE ROLE "${name}"`) && log.includes(`CREATE ROLE "${username}"`)
        })
        assert.match(log, /permission denied to create role/)
        for (const sentinel of sentinels) {
          assert.ok(!log.includes(sentinel), 'the plaintext password is in the server log')
          for (const output of [ok.stdout, ok.stderr, failed.stdout, failed.stderr]) assert.ok(!output.includes(sentinel))
        }
        assert.match(log, /PASSWORD 'SCRAM-SHA-256\$4096:/)
      } finally {
        await admin.query('ALTER SYSTEM RESET log_statement')
        await admin.query('SELECT pg_reload_conf()')
      }
    })
  })
})

/** The file the server writes its log to, when this process can read it. */
async function serverLog (client: pg.Client): Promise<string | undefined> {
  const row = (await client.query("SELECT pg_current_logfile() AS file, current_setting('data_directory') AS dir")).rows[0] as { file: string | null, dir: string }
  const candidates: string[] = []
  if (row.file !== null) candidates.push(isAbsolute(row.file) ? row.file : join(row.dir, row.file))
  const dir = '/var/log/postgresql'
  if (existsSync(dir)) {
    candidates.push(...readdirSync(dir).filter(f => f.endsWith('.log')).map(f => join(dir, f))
      .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs))
  }
  for (const file of candidates) {
    try {
      readFileSync(file, { flag: 'r' }).subarray(0, 1)
      return file
    } catch {}
  }
  return undefined
}
