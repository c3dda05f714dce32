import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { sql } from 'kysely'
import { buildApp } from '../src/app.ts'
import { loadConfig } from '../src/config.ts'
import { WAL_SIZE_LIMIT_BYTES } from '../src/db/database.ts'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import { checkpointInBackground } from '../src/db/sqlite-checkpoint.ts'
import { auth, createTestApp, type TestApp } from './helpers.ts'
import { eventually, waitFor } from './polling.ts'

/*
 * SQLite only: PostgreSQL has no WAL of ours to checkpoint. The server's
 * connection (src/db/database.ts) hands its checkpoints to a worker thread;
 * these tests use a small WAL threshold so a few writes reach it.
 */
const WAL_BYTES = 64 * 1024
const dir = mkdtempSync(join(tmpdir(), 'gatehouse-checkpoint-'))
after(() => { rmSync(dir, { recursive: true, force: true }) })

function openWal (name: string): { raw: InstanceType<typeof Sqlite>, file: string } {
  const file = join(dir, name)
  const raw = new Sqlite(file)
  raw.pragma('journal_mode = WAL')
  raw.pragma('synchronous = NORMAL')
  raw.exec('create table notes (id text primary key, body text not null)')
  return { raw, file }
}

function writeRows (raw: InstanceType<typeof Sqlite>, rows: number): void {
  const insert = raw.prepare('insert into notes (id, body) values (?, ?)')
  raw.transaction(() => { for (let i = 0; i < rows; i++) insert.run(randomBytes(16).toString('hex'), randomBytes(512).toString('hex')) })()
}

describe('SQLite checkpoints off the event loop (sqlite)', () => {
  it('the connection stops checkpointing, and a worker thread copies the WAL into the database file once it is big', async () => {
    const { raw, file } = openWal('worker.db')
    const checkpointer = checkpointInBackground(raw, file, 5000, { walBytes: WAL_BYTES, limitBytes: WAL_SIZE_LIMIT_BYTES })
    try {
      assert.equal(raw.pragma('wal_autocheckpoint', { simple: true }), 0)
      const before = statSync(file).size
      writeRows(raw, 200)
      assert.ok(statSync(`${file}-wal`).size >= WAL_BYTES, 'the WAL is past the threshold')
      await waitFor('a checkpoint by the worker', () => checkpointer.count > 0)
      assert.equal(checkpointer.fellBack, false)
      // Only a checkpoint moves pages from the WAL into the file, and this connection makes none.
      assert.ok(statSync(file).size > before + 100 * 1024, `the database file grew from ${before} to ${statSync(file).size} bytes`)
      const reader = new Sqlite(file, { readonly: true })
      try {
        assert.deepEqual(reader.prepare('select count(*) as n from notes').get(), { n: 200 })
      } finally {
        reader.close()
      }
    } finally {
      checkpointer.stop()
      raw.close()
    }
  })

  it('when the worker cannot open the database, the connection checkpoints for itself again', async () => {
    const { raw, file } = openWal('fallback.db')
    const warnings: string[] = []
    const onWarning = (warning: Error): void => { warnings.push(warning.message) }
    process.on('warning', onWarning)
    // A busy timeout better-sqlite3 refuses: the worker's connection fails to open.
    const checkpointer = checkpointInBackground(raw, file, -1, { walBytes: WAL_BYTES, limitBytes: WAL_SIZE_LIMIT_BYTES })
    try {
      writeRows(raw, 200)
      await waitFor('the fall-back', () => checkpointer.fellBack)
      assert.equal(raw.pragma('wal_autocheckpoint', { simple: true }), 1000)
      await waitFor('the warning', () => warnings.some(w => w.startsWith('SQLite checkpoints are back on the event loop')))
    } finally {
      process.off('warning', onWarning)
      checkpointer.stop()
      raw.close()
    }
  })
})

describe('the server\'s WAL file after a large write (sqlite)', () => {
  it('is cut back to 64 MiB once checkpointed, instead of keeping the size of its largest write', async () => {
    const file = join(dir, 'server.db')
    const app = await buildApp({ config: loadConfig({ DATABASE_URL: `sqlite:${file}` }), logger: false })
    const walBytes = (): number => statSync(`${file}-wal`).size
    try {
      // One transaction of about 72 MiB, as an import or an upgrade's migrations write at a million users.
      await sql`create table bulk (body blob not null)`.execute(app.db)
      await sql`with recursive n(i) as (select 1 union all select i + 1 from n where i < 18000) insert into bulk select randomblob(4000) from n`.execute(app.db)
      const peak = walBytes()
      assert.ok(peak > WAL_SIZE_LIMIT_BYTES, `the WAL reached ${peak} bytes`)
      // The background checkpointer copies the WAL back; the first commit after it has copied all of it cuts the file.
      await eventually(30_000, async () => {
        await sql`insert into bulk values (x'00')`.execute(app.db)
        assert.ok(walBytes() <= WAL_SIZE_LIMIT_BYTES, `the WAL file is still ${walBytes()} bytes`)
      })
      const { rows } = await sql<{ n: number }>`select count(*) as n from bulk where length(body) = 4000`.execute(app.db)
      assert.equal(rows[0]?.n, 18000)
    } finally {
      await app.close()
    }
  })
})

describe('the server\'s WAL under imports that never pause (sqlite)', () => {
  // Scaled down from issue 38's 300,000-user import (an 8.46 GB WAL beside a 1.06 GB database): a 4 MiB limit, and
  // batches small enough that one transaction writes well under it. The WAL stays under twice the limit: the limit,
  // and the transaction that passed it.
  const LIMIT_MIB = 4
  const LIMIT_BYTES = LIMIT_MIB * 1024 * 1024
  const BOUND_BYTES = 2 * LIMIT_BYTES
  const BATCH = 250

  /** Posts `batches` imports of BATCH users, two in flight, and answers the largest WAL seen after each answer and every few milliseconds. */
  async function importSampled (t: TestApp, file: string, stem: string, batches: number): Promise<number> {
    let peak = 0
    const look = (): void => { peak = Math.max(peak, statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0) }
    const sampler = setInterval(look, 2)
    let next = 0
    const poster = async (): Promise<void> => {
      while (next < batches) {
        const batch = next++
        const users = Array.from({ length: BATCH }, (_, k) => ({ username: `${stem}${batch}_${k}`, email: `${stem}${batch}_${k}@example.com`, first_name: 'Imported', groups: ['etl'] }))
        const res = await t.app.inject({ method: 'POST', url: '/auth/api/users/import', headers: auth(t.adminKey), payload: { users } })
        assert.equal(res.statusCode, 200, res.body)
        assert.equal(res.json<{ created: number }>().created, BATCH)
        look()
      }
    }
    try {
      await Promise.all([poster(), poster()])
    } finally {
      clearInterval(sampler)
    }
    return peak
  }

  it('is emptied between transactions once past SQLITE_WAL_LIMIT_MIB, so it stays under twice the limit', async () => {
    const file = join(dir, 'import.db')
    const t = await createTestApp({ name: 'sqlite', url: undefined }, { databaseUrl: `sqlite:${file}`, sqliteWalLimitMib: LIMIT_MIB })
    try {
      const peak = await importSampled(t, file, 'walcap', 32)
      // Every page of the file came through the WAL: more than the bound, twice over, did.
      assert.ok(statSync(file).size > 2 * BOUND_BYTES, `the database file is ${statSync(file).size} bytes`)
      assert.ok(peak < BOUND_BYTES, `the WAL reached ${peak} bytes (limit ${LIMIT_BYTES})`)
      const last = await t.app.inject({ method: 'GET', url: '/auth/api/users?q=walcap31_249', headers: auth(t.adminKey) })
      assert.equal(last.json<unknown[]>().length, 1)
    } finally {
      await t.app.close()
    }
  })

  it('warns when another process\'s reader keeps it from being emptied, answers every import, and empties it once the reader is gone', async () => {
    const file = join(dir, 'import-reader.db')
    const t = await createTestApp({ name: 'sqlite', url: undefined }, { databaseUrl: `sqlite:${file}`, sqliteWalLimitMib: LIMIT_MIB })
    const warnings: string[] = []
    const onWarning = (warning: Error): void => { warnings.push(warning.message) }
    process.on('warning', onWarning)
    // A backup or a report reading one snapshot for its whole run (its own connection, as another process has).
    const reader = new Sqlite(file, { readonly: true })
    try {
      reader.exec('begin')
      reader.prepare('select count(*) from users').get()
      await importSampled(t, file, 'held', 12)
      await waitFor('the warning', () => warnings.some(w => /^The SQLite WAL \(.*\) is [\d.]+ MiB, past its limit of 4\.0 MiB, and could not be emptied/.test(w)))
      const held = statSync(`${file}-wal`).size
      assert.ok(held >= LIMIT_BYTES, `the WAL was large when the reader left (${held} bytes)`)
      reader.exec('commit')
      // The reset is tried again once a second while writes go on: keep writing until it has happened.
      let round = 0
      await waitFor('the WAL emptied once the reader is gone', async () => {
        await importSampled(t, file, `freed${round++}_`, 2)
        return statSync(`${file}-wal`).size < BOUND_BYTES
      }, 30_000)
    } finally {
      process.off('warning', onWarning)
      reader.close()
      await t.app.close()
    }
  })
})
