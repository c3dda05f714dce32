import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { sql } from 'kysely'
import { buildApp } from '../src/app.ts'
import { loadConfig } from '../src/config.ts'
import { bootstrap } from '../src/bootstrap.ts'
import { Sqlite } from '../src/db/sqlite-binding.ts'
import { auth } from './helpers.ts'

/* SQLite only: the memory map is how the server's connection reads an SQLite file (src/db/database.ts). */
const dir = mkdtempSync(join(tmpdir(), 'gatehouse-mmap-'))
after(() => { rmSync(dir, { recursive: true, force: true }) })
let files = 0

async function mappedBytes (env: Record<string, string>): Promise<number> {
  const app = await buildApp({ config: loadConfig({ DATABASE_URL: `sqlite:${join(dir, `mapped-${files++}.db`)}`, ...env }), logger: false })
  try {
    const { rows } = await sql<{ mmap_size: number }>`pragma mmap_size`.execute(app.db)
    return rows[0]!.mmap_size
  } finally {
    await app.close()
  }
}

describe('SQLITE_MMAP_MIB', () => {
  it('maps 256 MiB of the database file by default, what it says otherwise, and nothing with 0', async () => {
    assert.equal(await mappedBytes({}), 256 * 1024 * 1024)
    assert.equal(await mappedBytes({ SQLITE_MMAP_MIB: '64' }), 64 * 1024 * 1024)
    assert.equal(await mappedBytes({ SQLITE_MMAP_MIB: '0' }), 0)
  })

  it('refuses more than SQLite can map, and anything but a whole number', () => {
    assert.equal(loadConfig({ SQLITE_MMAP_MIB: '2047' }).sqliteMmapMib, 2047)
    assert.throws(() => loadConfig({ SQLITE_MMAP_MIB: '2048' }), /SQLITE_MMAP_MIB must be at most 2047/)
    assert.throws(() => loadConfig({ SQLITE_MMAP_MIB: '-1' }), /SQLITE_MMAP_MIB/)
    assert.throws(() => loadConfig({ SQLITE_MMAP_MIB: '1.5' }), /SQLITE_MMAP_MIB/)
  })

  it('reads through the map what another connection wrote to the file (as the CLI or a second process writes)', async () => {
    const file = join(dir, 'shared.db')
    const config = loadConfig({ DATABASE_URL: `sqlite:${file}` })
    const app = await buildApp({ config, logger: false })
    try {
      const { generatedKey } = await bootstrap(app.db, app.passwords, config, app.log)
      const list = async (): Promise<string[]> => {
        const res = await app.inject({ url: '/auth/api/users?limit=100', headers: auth(generatedKey!) })
        assert.equal(res.statusCode, 200)
        return (res.json() as Array<{ username: string }>).map(user => user.username)
      }
      for (const username of ['mapped-ada', 'mapped-grace', 'mapped-alan']) {
        const created = await app.inject({ method: 'POST', url: '/auth/api/users', headers: auth(generatedKey!), payload: { username } })
        assert.equal(created.statusCode, 201)
      }
      const before = await list()
      assert.equal(before.length, 3)
      // Another connection to the file, as the CLI opens one: it changes a user the server has already read.
      const other = new Sqlite(file, { timeout: 5000 })
      try {
        const changed = other.prepare('update users set username = ?, username_key = ? where username_key = ?')
          .run('renamed-elsewhere', 'renamed-elsewhere', before[0]!.toLowerCase())
        assert.equal(changed.changes, 1)
      } finally {
        other.close()
      }
      assert.deepEqual(await list(), ['renamed-elsewhere', ...before.slice(1)])
    } finally {
      await app.close()
    }
  })
})
