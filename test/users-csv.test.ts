import { strict as assert } from 'node:assert'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'
import { parse } from 'csv-parse/sync'
import { auth, createTestApp, dialects, GOOD_PASSWORD, uniqueName, type TestApp } from './helpers.ts'
import { listen, runCli } from './cli-helpers.ts'

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-csv-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

/** The fields a user is made of, as the import can set them (not the server's ids, times and confirmations). */
const KEPT = ['username', 'email', 'first_name', 'last_name', 'role', 'groups', 'disabled', 'password_sign_in'] as const
type ApiUser = Record<string, unknown> & { id: string, username: string }
const keptOf = (user: ApiUser): Record<string, unknown> => Object.fromEntries(KEPT.map(k => [k, user[k]]))

async function createUser (t: TestApp, fields: Record<string, unknown>): Promise<ApiUser> {
  const res = await t.app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(t.adminKey), payload: fields })
  assert.equal(res.statusCode, 201, res.body)
  return res.json()
}

async function usersInGroup (t: TestApp, group: string): Promise<ApiUser[]> {
  const res = await t.app.inject({ url: `/auth/api/users?group=${encodeURIComponent(group)}&sort=username`, headers: auth(t.adminKey) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

/**
 * Users whose every field is something a CSV or a spreadsheet could get
 * wrong: delimiters, quotes and line breaks in names, cells a spreadsheet
 * would run as formulas, a Dutch name that starts with an apostrophe, groups
 * that cannot be `;`-separated, no email, other letters than ASCII.
 */
function awkwardUsers (group: string): Array<Record<string, unknown>> {
  const stem = uniqueName('csv')
  return [
    { username: `${stem}.plain`, email: `${stem}.plain@example.com`, first_name: 'Ada', last_name: 'Lovelace', groups: [group, 'etl', 'ops'] },
    { username: `-${stem}.dash`, first_name: 'Jean, "the first"', last_name: 'Line\nbreak; and tab\there', groups: [group], role: 'admin' },
    { username: `@${stem}.at`, email: `${stem}.at@example.com`, first_name: '=HYPERLINK("http://evil.example","x")', last_name: '+1-555', groups: [group, 'a;b'], disabled: true },
    { username: `${stem}.quote`, first_name: '\'t Hooft', last_name: '\'=already guarded', groups: [group, '[bracketed]'], password_sign_in: false },
    { username: `${stem}.space`, first_name: ' padded ', last_name: 'Ærøskøbing-Łódź 東京', groups: [group, ' spaced'] }
  ]
}

for (const dialect of dialects()) {
  describe(`users as CSV both ways (${dialect.name})`, () => {
    let source: TestApp
    let env: Record<string, string>
    before(async () => {
      source = await createTestApp(dialect)
      env = { GATEHOUSE_URL: await listen(source.app), GATEHOUSE_API_KEY: source.adminKey }
    })
    after(async () => { await source.app.close() })
    const cli = async (args: string[], extra: Record<string, string> = env) => await runCli(args, { env: extra })

    it('gatehouse users export --format csv writes what users import reads: the same users in a fresh database', async () => {
      const group = uniqueName('rt')
      for (const fields of awkwardUsers(group)) await createUser(source, { password: GOOD_PASSWORD, ...fields })
      const exported = await cli(['users', 'export', '--format', 'csv', '--group', group, '--sort', 'username'])
      assert.equal(exported.code, 0, exported.stderr)
      const lines = exported.stdout.split('\r\n')
      assert.equal(lines[0], 'id,username,email,first_name,last_name,role,groups,disabled,password_sign_in,email_verified,invitation_pending,' +
        'created_at,updated_at,last_login_at,password_changed_at', 'every field of User, in its order')
      // Formula cells get an apostrophe, and a cell that had one gets another, so the import can take exactly one off.
      assert.match(exported.stdout, /,"'=HYPERLINK\(""http:\/\/evil\.example"",""x""\)",'\+1-555,/)
      assert.match(exported.stdout, /,'-csv/)
      assert.match(exported.stdout, /,''t Hooft,''=already guarded,/)
      assert.doesNotMatch(exported.stdout, /(^|[,\n])[=+\-@]/, 'no cell starts with a formula character')
      const file = join(tmp, `${group}.csv`)
      writeFileSync(file, exported.stdout)

      const target = await createTestApp(dialect)
      try {
        const targetEnv = { GATEHOUSE_URL: await listen(target.app), GATEHOUSE_API_KEY: target.adminKey }
        const imported = await cli(['users', 'import', file, '--json'], targetEnv)
        assert.equal(imported.code, 0, imported.stdout + imported.stderr)
        assert.equal(JSON.parse(imported.stdout).created, 5)
        const before = (await usersInGroup(source, group)).map(keptOf)
        const after = (await usersInGroup(target, group)).map(keptOf)
        assert.equal(after.length, 5)
        assert.deepEqual(after, before)

        // And again from the copy: the CSV of the imported users is the CSV of the originals, but for the server's fields.
        const again = await cli(['users', 'export', '--format', 'csv', '--group', group, '--sort', 'username'], targetEnv)
        const kept = (csv: string): string[][] => (parse(csv) as string[][]).map(row => row.slice(1, 9))
        assert.deepEqual(kept(again.stdout), kept(exported.stdout))
      } finally {
        await target.app.close()
      }
    })

    it('gatehouse users export --output FILE.csv writes CSV; JSON Lines exports import again too', async () => {
      const group = uniqueName('out')
      const user = await createUser(source, { username: uniqueName('out'), email: `${uniqueName('m')}@example.com`, groups: [group] })
      const csvFile = join(tmp, `${group}.csv`)
      const toFile = await cli(['users', 'export', '--group', group, '--output', csvFile])
      assert.equal(toFile.code, 0, toFile.stderr)
      assert.match(toFile.stderr, /exported 1 users/)
      const rows = parse(readFileSync(csvFile, 'utf8'), { columns: true }) as Array<Record<string, string>>
      assert.deepEqual(rows.map(r => [r.id, r.username, r.groups, r.email_verified]), [[user.id, user.username, group, 'false']])
      const wrong = await cli(['users', 'export', '--format', 'xml'])
      assert.equal(wrong.code, 2)
      assert.match(wrong.stderr, /--format takes csv or jsonl/)

      // email_verified and invitation_pending are the service's to decide: skipped, like the ids and times.
      const jsonl = join(tmp, `${group}.jsonl`)
      assert.equal((await cli(['users', 'export', '--group', group, '--output', jsonl])).code, 0)
      const target = await createTestApp(dialect)
      try {
        const targetEnv = { GATEHOUSE_URL: await listen(target.app), GATEHOUSE_API_KEY: target.adminKey }
        const imported = await cli(['users', 'import', jsonl], targetEnv)
        assert.equal(imported.code, 0, imported.stdout + imported.stderr)
        assert.deepEqual((await usersInGroup(target, group)).map(keptOf), [keptOf(user)])
      } finally {
        await target.app.close()
      }
    })

    it('the console\'s Export CSV sends the list\'s users with its filters, as the CLI writes them, to admins only', async () => {
      const group = uniqueName('con')
      const admin = await createUser(source, { username: uniqueName('conadmin'), password: GOOD_PASSWORD, role: 'admin' })
      const plain = await createUser(source, { username: uniqueName('conuser'), password: GOOD_PASSWORD })
      const cookieOf = async (username: string): Promise<string> => {
        const res = await source.app.inject({ method: 'POST', url: '/auth/api/login', payload: { username, password: GOOD_PASSWORD } })
        assert.equal(res.statusCode, 200, res.body)
        return `gatehouse_session=${(res.json() as { token: string }).token}`
      }
      const adminCookie = await cookieOf(admin.username)
      const stem = uniqueName('con')
      await createUser(source, { username: `${stem}.on`, first_name: '=cmd|calc', groups: [group] })
      await createUser(source, { username: `${stem}.off`, groups: [group], disabled: true })
      await createUser(source, { username: `${stem}.other`, groups: [group], role: 'admin' })

      const list = await source.app.inject({ url: `/auth/admin/users?group=${group}&disabled=false&role=user&sort=-username`, headers: { cookie: adminCookie } })
      assert.equal(list.statusCode, 200)
      const link = /<a class="button secondary" href="([^"]+)" download>Export CSV<span class="visually-hidden"> of the users matching the filters<\/span><\/a>/.exec(list.body)
      assert.ok(link, 'the list offers Export CSV with its filters')
      const href = link[1]!.replaceAll('&#38;', '&')
      assert.equal(href, `/auth/admin/users/export?role=user&group=${group}&disabled=false&sort=-username`)

      const res = await source.app.inject({ url: href, headers: { cookie: adminCookie } })
      assert.equal(res.statusCode, 200, res.body)
      assert.equal(res.headers['content-type'], 'text/csv; charset=utf-8')
      assert.match(String(res.headers['content-disposition']), /^attachment; filename="gatehouse-users-\d{4}-\d{2}-\d{2}\.csv"$/)
      assert.equal(res.headers['cache-control'], 'no-store')
      assert.ok(res.body.startsWith('\uFEFFid,username,'), 'a BOM, then the header')
      const rows = parse(res.body, { bom: true, columns: true }) as Array<Record<string, string>>
      assert.deepEqual(rows.map(r => r.username), [`${stem}.on`], 'only the enabled plain users of the group')
      assert.equal(rows[0]!.first_name, "'=cmd|calc")

      // Byte for byte what the CLI writes for the same filters.
      const cli = await runCli(['users', 'export', '--format', 'csv', '--group', group, '--role', 'user', '--enabled', '--sort', '-username'], { env })
      assert.equal(res.body, `\uFEFF${cli.stdout}`)
      const unfiltered = await source.app.inject({ url: `/auth/admin/users/export?group=${group}`, headers: { cookie: adminCookie } })
      assert.equal((parse(unfiltered.body, { bom: true, columns: true }) as unknown[]).length, 3)

      const refused = await source.app.inject({ url: href, headers: { cookie: await cookieOf(plain.username) } })
      assert.equal(refused.statusCode, 403)
      assert.match(String(refused.headers['content-type']), /^text\/html/)
      assert.doesNotMatch(refused.body, new RegExp(stem), 'no user data on the refusal')
      const anonymous = await source.app.inject({ url: href })
      assert.equal(anonymous.statusCode, 303)
      const wrong = await source.app.inject({ url: '/auth/admin/users/export?role=boss', headers: { cookie: adminCookie } })
      assert.equal(wrong.statusCode, 422)
      assert.match(String(wrong.headers['content-type']), /^text\/html/)
      const doc = (await source.app.inject({ url: '/auth/openapi.json' })).json() as { paths: Record<string, unknown> }
      assert.ok(!Object.keys(doc.paths).some(p => p.includes('/admin')), 'a console route, not part of the API document')
    })

    it('users import reads ;- and tab-separated files and a UTF-8 BOM, as spreadsheets save them', async () => {
      const [semi, tab] = [uniqueName('semi'), uniqueName('tab')]
      const semiFile = join(tmp, `${semi}.csv`)
      // A spreadsheet in a German locale: BOM, semicolons, CRLF, a decimal comma in a quoted cell, groups quoted as one cell.
      writeFileSync(semiFile, `\uFEFFusername;first_name;last_name;groups;disabled\r\n${semi};Jürgen;"Müller, 3,5";"etl;ops";ja\r\n${semi}b;Zoë;;;nein\r\n`)
      const dry = await cli(['users', 'import', semiFile, '--dry-run', '--json'])
      const report = JSON.parse(dry.stdout)
      assert.equal(report.rows_read, 2, dry.stdout)
      assert.match(report.rows[0].error, /\/disabled: must be boolean/, 'ja is not one of the boolean words')
      writeFileSync(semiFile, `\uFEFFusername;first_name;last_name;groups;disabled\r\n${semi};Jürgen;"Müller, 3,5";"etl;ops";yes\r\n${semi}b;Zoë;;;no\r\n`)
      const imported = await cli(['users', 'import', semiFile])
      assert.equal(imported.code, 0, imported.stdout + imported.stderr)
      const [first] = (await source.app.inject({ url: `/auth/api/users?username=${semi}`, headers: auth(source.adminKey) })).json()
      assert.deepEqual([first.first_name, first.last_name, first.groups, first.disabled], ['Jürgen', 'Müller, 3,5', ['etl', 'ops'], true])

      const tabFile = join(tmp, `${tab}.csv`)
      writeFileSync(tabFile, `\uFEFFusername\temail\tgroups\n${tab}\t${tab}@example.com\tetl;ops\n`)
      const tabbed = await cli(['users', 'import', tabFile])
      assert.equal(tabbed.code, 0, tabbed.stdout + tabbed.stderr)
      const [second] = (await source.app.inject({ url: `/auth/api/users?username=${tab}`, headers: auth(source.adminKey) })).json()
      assert.deepEqual([second.email, second.groups], [`${tab}@example.com`, ['etl', 'ops']])
    })

    it('users import without a username column names the header it read, and creates nothing', async () => {
      const file = join(tmp, `${uniqueName('nohead')}.csv`)
      writeFileSync(file, '\uFEFFBenutzer;E-Mail;Gruppen\nada;ada@example.com;etl\n')
      const r = await cli(['users', 'import', file])
      assert.equal(r.code, 2, r.stdout + r.stderr)
      assert.equal(r.stderr, 'gatehouse: the CSV header has no username column: it read the columns "Benutzer", "E-Mail", "Gruppen" (separated by ";")\n')
      writeFileSync(file, 'user|mail\nada|ada@example.com\n')
      const one = await cli(['users', 'import', file])
      assert.equal(one.code, 2)
      assert.match(one.stderr, /it read the one column "user\|mail" \(looking for ",", ";" or tab between columns\)/)
    })
  })
}
