import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { gunzipSync, gzipSync } from 'node:zlib'
import { after, before, describe, it } from 'node:test'
import { generate } from 'otplib'
import pg from 'pg'
import { buildApp } from '../src/app.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { TableDigest } from '../src/backup/backup-file.ts'
import { BACKUP_TABLES } from '../src/backup/backup-tables.ts'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import { auth, createTestApp, dialects, dropSchema, GOOD_PASSWORD, uniqueName, type Dialect, type TestApp } from './helpers.ts'
import { listen, runCli } from './cli-helpers.ts'

const tmp = mkdtempSync(join(tmpdir(), 'gatehouse-backup-'))
after(() => { rmSync(tmp, { recursive: true, force: true }) })

const MFA_KEY = randomBytes(32)
/** The same settings on the source and on every restored database: TOTP secrets are sealed with MFA_ENCRYPTION_KEY. */
const SETTINGS: Partial<Config> = { mfaEncryptionKey: MFA_KEY, webhookDelivery: false, webhookAllowPrivate: true, mailDelivery: false }
const WRITERS = 20

const schemasToDrop: Array<{ url: string, schema: string }> = []
after(async () => { for (const { url, schema } of schemasToDrop.splice(0)) await dropSchema(url, schema) })

/** A database for a restore: a SQLite file that does not exist yet, or a PostgreSQL schema of its own. */
function newDatabase (dialect: Dialect): { env: Record<string, string>, databaseUrl: string, databaseSchema: string | undefined } {
  if (dialect.url === undefined) {
    const databaseUrl = `sqlite:${join(tmp, `restored-${randomBytes(4).toString('hex')}.db`)}`
    return { env: { DATABASE_URL: databaseUrl }, databaseUrl, databaseSchema: undefined }
  }
  const schema = `gh_restore_${randomBytes(5).toString('hex')}`
  schemasToDrop.push({ url: dialect.url, schema })
  return { env: { DATABASE_URL: dialect.url, DATABASE_SCHEMA: schema }, databaseUrl: dialect.url, databaseSchema: schema }
}

/** The service on a restored database, started as production starts it (migrations, bootstrap). */
async function serviceOn (database: { databaseUrl: string, databaseSchema: string | undefined }): Promise<FastifyTypeBox> {
  const config = defaultConfig({ databaseUrl: database.databaseUrl, databaseSchema: database.databaseSchema, logLevel: 'silent', ...SETTINGS })
  const app = await buildApp({ config, logger: false })
  try {
    const { generatedKey } = await bootstrap(app.db, app.passwords, config, app.log)
    // The backup holds the deployment's bootstrap mark: a restored deployment issues no new admin key.
    assert.equal(generatedKey, undefined)
    await app.ready()
  } catch (error) {
    await app.close()
    throw error
  }
  return app
}

async function get (app: FastifyTypeBox, url: string, key: string): Promise<unknown> {
  const res = await app.inject({ url, headers: auth(key) })
  assert.equal(res.statusCode, 200, `${url}: ${res.body}`)
  return res.json()
}

async function codeAt (secret: string, steps: number): Promise<string> {
  return await generate({ secret, epoch: Math.floor(Date.now() / 1000) + steps * 30 })
}

interface Seeded { alice: { id: string, username: string }, totpSecret: string, apiKey: string, groupId: string, webhookId: string }

/** What every restored database must answer as the source did: a user with a TOTP factor, a manager, an identity, a group, a key, a webhook. */
async function seed (t: TestApp): Promise<Seeded> {
  const post = async (url: string, payload: Record<string, unknown>, headers = auth(t.adminKey)): Promise<any> => {
    const res = await t.app.inject({ method: 'POST', url, headers, payload })
    assert.ok(res.statusCode === 200 || res.statusCode === 201, `${url}: ${res.body}`)
    return res.json()
  }
  const boss = await post('/auth/api/users', { username: uniqueName('boss') })
  const alice = await post('/auth/api/users', { username: uniqueName('alice'), password: GOOD_PASSWORD, email: `${uniqueName('a')}@example.test`, groups: ['ops'] })
  const { token } = await post('/auth/api/login', { username: alice.username, password: GOOD_PASSWORD }, {})
  const bearer = { authorization: `Bearer ${token as string}` }
  const { secret } = await post('/auth/api/me/mfa/totp', {}, bearer)
  await post('/auth/api/me/mfa/totp/confirm', { code: await codeAt(secret, 0) }, bearer)
  const key = await post('/auth/api/api-keys', { name: 'backup test key' })
  const webhook = await post('/auth/api/webhooks', { url: 'http://127.0.0.1:9/hook', event_types: ['user.*'] })
  const groups = await get(t.app, '/auth/api/groups', t.adminKey) as Array<{ id: string, display_name: string }>
  const group = groups.find(g => g.display_name === 'ops')!
  // No API writes these two: an identity is made by an OIDC or LDAP sign-in, a manager by SCIM.
  await t.app.db.insertInto('user_identities').values({ id: randomUUID(), user_id: alice.id, provider: 'oidc:corp', subject: 'alice-sub', email: null, created_at: new Date().toISOString(), last_sign_in_at: null }).execute()
  await t.app.db.updateTable('users').set({ manager_id: boss.id }).where('id', '=', alice.id).execute()
  return { alice, totpSecret: secret, apiKey: key.key, groupId: group.id, webhookId: webhook.id }
}

/** What a service answers about the seeded data; equal on the source and on every restored database. */
async function answers (app: FastifyTypeBox, key: string, s: Seeded): Promise<Record<string, unknown>> {
  return {
    alice: await get(app, `/auth/api/users/${s.alice.id}`, key),
    factors: await get(app, `/auth/api/users/${s.alice.id}/mfa`, key),
    identities: await get(app, `/auth/api/users/${s.alice.id}/identities`, key),
    events: await get(app, `/auth/api/events?target_id=${s.alice.id}&limit=1000`, key),
    group: await get(app, `/auth/api/groups/${s.groupId}`, key),
    members: await get(app, `/auth/api/groups/${s.groupId}/members`, key),
    // The admin key's last use goes on moving on the source, where the writers use it.
    keys: (await get(app, '/auth/api/api-keys', key) as Array<Record<string, unknown>>).map(({ last_used_at: _, ...rest }) => rest),
    webhooks: await get(app, `/auth/api/webhooks/${s.webhookId}`, key),
    // The sealed secret as stored, and the last time step used (a code is never taken twice).
    totp: await app.db.selectFrom('totp_factors').select(['secret', 'confirmed_at', 'last_time_step']).where('user_id', '=', s.alice.id).execute()
      .then(rows => rows.map(row => ({ ...row, last_time_step: Number(row.last_time_step) }))),
    manager: (await app.db.selectFrom('users').select('manager_id').where('id', '=', s.alice.id).executeTakeFirstOrThrow()).manager_id
  }
}

/** Every user id the service lists (without `limit`, one streamed array of them all). */
async function allUserIds (app: FastifyTypeBox, key: string): Promise<Set<string>> {
  return new Set((await get(app, '/auth/api/users', key) as Array<{ id: string }>).map(user => user.id))
}

/** Rewrites a backup's JSON lines through `change`, then gives each table's end line and the footer the checksums of what is now there. */
function rewriteBackup (from: string, to: string, change: (lines: string[]) => string[]): void {
  const lines = change(gunzipSync(readFileSync(from)).toString('utf8').split('\n').filter(l => l !== ''))
  const header = JSON.parse(lines[0]!) as { tables: Array<{ name: string, columns: Array<[string, any]> }> }
  const summaries: Record<string, { rows: number, sha256: string }> = {}
  let digest: TableDigest | undefined
  const out = lines.map(line => {
    const item = JSON.parse(line)
    if (item.table !== undefined) digest = new TableDigest(header.tables.find(t => t.name === item.table)!.columns.map(([, kind]) => kind))
    else if (Array.isArray(item)) digest!.add(item)
    else if (item.end !== undefined) return JSON.stringify({ end: item.end, ...(summaries[item.end] = digest!.summary()) })
    else if (item.complete === true) return JSON.stringify({ ...item, tables: summaries })
    return line
  })
  writeFileSync(to, gzipSync(out.join('\n') + '\n'))
}

describe('the backup lists every column of both migrated schemas', () => {
  for (const dialect of dialects()) {
    it(`knows every column of gatehouse's tables (${dialect.name})`, async () => {
      const t = await createTestApp(dialect, { databaseUrl: dialect.url ?? `sqlite:${join(tmp, `schema-${randomBytes(3).toString('hex')}.db`)}` })
      try {
        const { describe: describeDb, openSqliteConnection, openPgConnection, closeConnection } = await import('../src/backup/backup-database.ts')
        const connection = dialect.url === undefined ? openSqliteConnection(t.config.databaseUrl.slice(7), { mustExist: true }) : await openPgConnection(dialect.url, t.config.databaseSchema)
        try {
          const { tables } = await describeDb(connection)
          assert.deepEqual(tables.map(x => x.table.name), BACKUP_TABLES.map(x => x.name))
          for (const present of tables) assert.deepEqual(present.columns, Object.keys(present.table.columns), present.table.name)
        } finally {
          await closeConnection(connection)
        }
      } finally {
        await t.app.close()
      }
    })
  }
})

for (const source of dialects()) {
  describe(`gatehouse backup and restore, from ${source.name}`, () => {
    let t: TestApp
    let seeded: Seeded
    let sourceEnv: Record<string, string>
    const file = join(tmp, `backup-${source.name}.gz`)
    /** Users and groups whose creation was answered before the backup was started. */
    const ackedBefore = { users: [] as string[], groups: [] as string[] }
    let writtenDuring = 0
    let backupOutput = ''

    before(async () => {
      t = await createTestApp(source, { ...SETTINGS, ...(source.url === undefined ? { databaseUrl: `sqlite:${join(tmp, 'source.db')}` } : {}) })
      sourceEnv = { DATABASE_URL: t.config.databaseUrl, ...(t.config.databaseSchema !== undefined ? { DATABASE_SCHEMA: t.config.databaseSchema } : {}) }
      seeded = await seed(t)
      const base = await listen(t.app)
      const headers = { 'x-api-key': t.adminKey, 'content-type': 'application/json' }
      const acked: Array<{ kind: 'users' | 'groups', id: string, at: number }> = []
      const writing = { stop: false }
      const writer = async (n: number): Promise<void> => {
        for (let i = 0; !writing.stop; i++) {
          const group = i % 5 === 4
          const res = await fetch(`${base}/api/${group ? 'groups' : 'users'}`, {
            method: 'POST',
            headers,
            body: JSON.stringify(group ? { display_name: uniqueName(`g${n}_`) } : { username: uniqueName(`w${n}_`), groups: [`team${n % 4}`] })
          })
          const body = await res.json() as { id: string }
          assert.equal(res.status, 201, JSON.stringify(body))
          acked.push({ kind: group ? 'groups' : 'users', id: body.id, at: Date.now() })
        }
      }
      const writers = Array.from({ length: WRITERS }, async (_, n) => { await writer(n) })
      while (acked.length < 100) await new Promise(resolve => setTimeout(resolve, 20))
      const startedAt = Date.now()
      const backup = await runCli(['backup', file], { env: sourceEnv })
      const endedAt = Date.now()
      writing.stop = true
      await Promise.all(writers)
      backupOutput = `${backup.stdout}${backup.stderr}`
      assert.equal(backup.code, 0, backupOutput)
      for (const write of acked) if (write.at < startedAt) ackedBefore[write.kind].push(write.id)
      writtenDuring = acked.filter(w => w.at >= startedAt && w.at <= endedAt).length
    })
    after(async () => { await t?.app.close() })

    it('takes the backup while 20 writers go on writing, and verifies it', async () => {
      assert.match(backupOutput, new RegExp(`^Backed up \\d+ rows of ${BACKUP_TABLES.length} tables \\(\\d+ users\\) from ${source.name} to `))
      assert.ok(writtenDuring > 0, 'the writers wrote while the backup ran')
      const verified = await runCli(['backup', '--verify', file])
      assert.equal(verified.code, 0, verified.stderr)
      assert.match(verified.stdout, /is a complete gatehouse backup: \d+ rows in \d+ tables, every count and checksum matches/)
      const json = JSON.parse((await runCli(['backup', '--verify', file, '--json'])).stdout)
      assert.equal(json.dialect, source.name)
      assert.ok(json.tables.users.rows >= ackedBefore.users.length + 2)
    })

    for (const target of dialects()) {
      it(`restores into an empty ${target.name} database: every write answered before the backup, the same answers, a TOTP sign-in and an API key`, async () => {
        const database = newDatabase(target)
        const restored = await runCli(['restore', file], { env: database.env })
        assert.equal(restored.code, 0, restored.stderr)
        assert.match(restored.stdout, /^Restored \d+ rows of \d+ tables .* every count and checksum matches the backup\n$/)
        if (target.url === undefined) {
          const check = new Sqlite(database.databaseUrl.slice('sqlite:'.length), { readonly: true })
          try { assert.equal(check.pragma('integrity_check', { simple: true }), 'ok') } finally { check.close() }
        }
        const app = await serviceOn(database)
        let restoredAnswers: Record<string, unknown>
        try {
          const users = await allUserIds(app, t.adminKey)
          const missing = ackedBefore.users.filter(id => !users.has(id))
          assert.deepEqual(missing, [], `${missing.length} of ${ackedBefore.users.length} users answered before the backup are missing`)
          for (const id of ackedBefore.groups) assert.equal((await app.inject({ url: `/auth/api/groups/${id}`, headers: auth(t.adminKey) })).statusCode, 200)
          assert.deepEqual(await answers(app, t.adminKey, seeded), await answers(t.app, t.adminKey, seeded))
          // The key made through the API, on the restored service.
          assert.equal((await app.inject({ url: `/auth/api/users/${seeded.alice.id}`, headers: auth(seeded.apiKey) })).statusCode, 200)
          const login = await app.inject({ method: 'POST', url: '/auth/api/login', payload: { username: seeded.alice.username, password: GOOD_PASSWORD } })
          assert.equal(login.statusCode, 202, login.body)
          const signedIn = await app.inject({ method: 'POST', url: '/auth/api/login/mfa', payload: { challenge_token: login.json().challenge_token, totp_code: await codeAt(seeded.totpSecret, 1) } })
          assert.equal(signedIn.statusCode, 200, signedIn.body)
          assert.equal((await app.inject({ url: '/auth/api/me', headers: { authorization: `Bearer ${signedIn.json().token as string}` } })).statusCode, 200)
          restoredAnswers = await answers(app, t.adminKey, seeded)
        } finally {
          await app.close()
        }

        const refused = await runCli(['restore', file], { env: database.env })
        assert.equal(refused.code, 1)
        assert.match(refused.stderr, /^gatehouse: .* is not empty \(rows in gatehouse_meta, users, .*\); restore into an empty database, or pass --force/)

        // A file whose last table holds a row the database refuses (a mail for no user), checksums and all in order.
        const bad = join(tmp, `late-row-${randomBytes(3).toString('hex')}.gz`)
        rewriteBackup(file, bad, lines => {
          const end = lines.findIndex(l => l.startsWith('{"end":"mail_outbox"'))
          const now = new Date().toISOString()
          return [...lines.slice(0, end), JSON.stringify([randomUUID(), randomUUID(), 'invitation', null, 'pending', 0, now, null, null, null, now, null]), ...lines.slice(end)]
        })
        assert.equal((await runCli(['backup', '--verify', bad])).code, 0)
        const failed = await runCli(['restore', bad, '--force'], { env: database.env })
        assert.equal(failed.code, 1)
        assert.match(failed.stderr, /^gatehouse: the database refused it: .*(FOREIGN KEY|foreign key)/)
        if (target.url === undefined) assert.deepEqual(readdirSync(tmp).filter(name => name.includes('.restore-')), [])
        // What was there is still there, whole.
        const still = await serviceOn(database)
        try {
          assert.deepEqual(await answers(still, t.adminKey, seeded), restoredAnswers)
        } finally {
          await still.close()
        }

        const forced = await runCli(['restore', file, '--force'], { env: database.env })
        assert.equal(forced.code, 0, forced.stderr)
      })
    }

    it('leaves no database behind when a restore into an empty one fails midway', async () => {
      const bad = join(tmp, `late-row-empty-${randomBytes(3).toString('hex')}.gz`)
      rewriteBackup(file, bad, lines => {
        const end = lines.findIndex(l => l.startsWith('{"end":"mail_outbox"'))
        const now = new Date().toISOString()
        return [...lines.slice(0, end), JSON.stringify([randomUUID(), randomUUID(), 'invitation', null, 'pending', 0, now, null, null, null, now, null]), ...lines.slice(end)]
      })
      const database = newDatabase(source)
      const failed = await runCli(['restore', bad], { env: database.env })
      assert.equal(failed.code, 1, failed.stdout)
      if (source.url === undefined) {
        // No file, so a service given this DATABASE_URL would start a new, empty deployment rather than a part of this one.
        assert.equal(existsSync(database.databaseUrl.slice('sqlite:'.length)), false)
        assert.deepEqual(readdirSync(tmp).filter(name => name.includes('.restore-')), [])
      } else {
        const client = new pg.Client({ connectionString: source.url })
        await client.connect()
        try {
          const { rows } = await client.query('select count(*)::int as n from information_schema.tables where table_schema = $1', [database.databaseSchema])
          assert.equal(rows[0].n, 0)
        } finally {
          await client.end()
        }
      }
    })

    it('refuses a damaged, cut or altered file with a message saying so, and exit code 1', async () => {
      const bytes = readFileSync(file)
      const cut = join(tmp, `cut-${source.name}.gz`)
      writeFileSync(cut, bytes.subarray(0, Math.floor(bytes.length * 0.6)))
      const flipped = join(tmp, `flipped-${source.name}.gz`)
      const damaged = Buffer.from(bytes)
      damaged[Math.floor(bytes.length / 2)]! ^= 0xff
      writeFileSync(flipped, damaged)
      const altered = join(tmp, `altered-${source.name}.gz`)
      const lines = gunzipSync(bytes).toString('utf8').split('\n')
      const row = lines.findIndex(l => l.includes(seeded.alice.username))
      lines[row] = lines[row]!.replace(seeded.alice.username, 'mallory')
      writeFileSync(altered, gzipSync(lines.join('\n')))
      const notBackup = join(tmp, 'not-a-backup.gz')
      writeFileSync(notBackup, 'hello')
      const cases: Array<[string, RegExp]> = [
        [cut, /is damaged or cut short|is cut short/],
        [flipped, /is damaged or cut short|not valid JSON|checksum|must have|is not a/],
        [altered, /the rows of users do not match their checksum/],
        [notBackup, /is not a gatehouse backup/],
        [join(tmp, 'missing.gz'), /cannot read .*missing\.gz: no such file/]
      ]
      for (const [path, message] of cases) {
        const r = await runCli(['backup', '--verify', path])
        assert.equal(r.code, 1, `${path}: ${r.stdout}`)
        assert.match(r.stderr, message, path)
      }
      // The restore reads through the same checks.
      const restore = await runCli(['restore', altered], { env: newDatabase(source).env })
      assert.equal(restore.code, 1, restore.stdout)
      assert.match(restore.stderr, /the rows of users do not match their checksum/)
    })

    it('refuses to overwrite a file, and names a database that holds no gatehouse data', async () => {
      const again = await runCli(['backup', file], { env: sourceEnv })
      assert.equal(again.code, 1)
      assert.match(again.stderr, /already exists; give a new file name/)
      const empty = newDatabase(source)
      const none = await runCli(['backup', join(tmp, 'none.gz')], { env: empty.env })
      assert.equal(none.code, 1)
      assert.match(none.stderr, /^gatehouse: (DATABASE_URL holds no gatehouse database|cannot open the SQLite database)/)
      assert.equal(existsSync(join(tmp, 'none.gz')), false)
    })
  })
}
