import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { buildApp } from '../src/app.ts'
import { loadConfig } from '../src/config.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import { auth } from './helpers.ts'

/* SQLite only: the page size a database file is made with (src/db/database.ts, openSqlite). */
const dir = mkdtempSync(join(tmpdir(), 'gatehouse-page-size-'))
after(() => { rmSync(dir, { recursive: true, force: true }) })

/** The page size written in the file, as another connection reads it. */
function pageSizeOf (file: string): number {
  const other = new Sqlite(file, { readonly: true })
  try {
    return other.pragma('page_size', { simple: true }) as number
  } finally {
    other.close()
  }
}

/** Starts the service on `file`, creates a user and lists users, as a first start and an upgrade do. */
async function serveUsers (file: string): Promise<string[]> {
  const config = loadConfig({ DATABASE_URL: `sqlite:${file}` })
  const app = await buildApp({ config, logger: false })
  try {
    const { generatedKey } = await bootstrap(app.db, app.passwords, config, app.log)
    const created = await app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(generatedKey!), payload: { username: 'paged-ada' } })
    assert.equal(created.statusCode, 201)
    const res = await app.inject({ url: '/auth/api/users?limit=100', headers: auth(generatedKey!) })
    assert.equal(res.statusCode, 200)
    return (res.json() as Array<{ username: string }>).map(user => user.username)
  } finally {
    await app.close()
  }
}

describe('SQLite page size', () => {
  it('makes a new database file with pages of 8 KiB', async () => {
    const file = join(dir, 'new.db')
    assert.deepEqual(await serveUsers(file), ['paged-ada'])
    assert.equal(pageSizeOf(file), 8192)
  })

  it('serves a file made with pages of 4 KiB as it is, without rewriting it', async () => {
    const file = join(dir, 'older.db')
    const older = new Sqlite(file)
    try {
      older.pragma('page_size = 4096')
      older.pragma('journal_mode = WAL')
      // The size is written with the first table; a file made by an earlier release holds gatehouse's own.
      older.exec('create table made_before (id integer primary key)')
    } finally {
      older.close()
    }
    assert.equal(pageSizeOf(file), 4096)
    assert.deepEqual(await serveUsers(file), ['paged-ada'])
    assert.equal(pageSizeOf(file), 4096)
  })
})
