import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, it } from 'node:test'
import { fileURLToPath } from 'node:url'
import { sql } from 'kysely'
import { buildApp } from '../src/app.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import { createDb } from '../src/db/database.ts'
import { MIGRATION_NAMES, migrateTo, migrateToLatest, schemaState } from '../src/db/migrate.ts'
import { dialects, dropSchema } from './helpers.ts'
import { freePort } from './ports.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

interface Place { config: Config, env: Record<string, string>, cleanUp: () => Promise<void> }

/** A fresh database of the dialect, as the service's settings and as environment variables. */
function freshPlace (dialect: ReturnType<typeof dialects>[number]): Place {
  if (dialect.name === 'sqlite') {
    const dir = mkdtempSync(join(tmpdir(), 'gatehouse-migrate-start-'))
    const url = `sqlite:${join(dir, 'gatehouse.db')}`
    return { config: defaultConfig({ databaseUrl: url }), env: { DATABASE_URL: url }, cleanUp: async () => { rmSync(dir, { recursive: true, force: true }) } }
  }
  const schema = `gh_mstart_${randomBytes(6).toString('hex')}`
  return {
    config: defaultConfig({ databaseUrl: dialect.url!, databaseSchema: schema }),
    env: { DATABASE_URL: dialect.url!, DATABASE_SCHEMA: schema },
    cleanUp: async () => { await dropSchema(dialect.url!, schema) }
  }
}

/** Runs a command of the service (src/server.ts, or the CLI) to its end, or for at most `ms`. */
async function run (args: string[], env: Record<string, string>, ms = 60_000): Promise<{ code: number | null, output: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    cwd: ROOT, env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  for (const stream of [child.stdout, child.stderr]) stream.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  const timer = setTimeout(() => child.kill('SIGKILL'), ms)
  const code = await new Promise<number | null>(resolve => child.once('exit', resolve))
  clearTimeout(timer)
  return { code, output }
}

for (const dialect of dialects()) {
  describe(`the schema at start on ${dialect.name}`, () => {
    const places: Place[] = []
    after(async () => { for (const place of places.splice(0)) await place.cleanUp() })

    it('with MIGRATE_ON_START=false, refuses a database that is behind and names the command to run; after gatehouse migrate it serves', { timeout: 180_000 }, async () => {
      const place = freshPlace(dialect)
      places.push(place)
      const port = await freePort()
      const env = { ...place.env, HOST: '127.0.0.1', PORT: String(port), MIGRATE_ON_START: 'false', LOG_LEVEL: 'warn' }

      const refused = await run(['src/server.ts'], env)
      assert.equal(refused.code, 2, refused.output)
      assert.match(refused.output, /the database is behind this release: \d+ migration\(s\) to run .*MIGRATE_ON_START=false; run `gatehouse migrate`/)

      const migrated = await run(['src/cli/main.ts', 'migrate', '--json'], place.env)
      assert.equal(migrated.code, 0, migrated.output)

      const db = createDb(place.config)
      try {
        assert.deepEqual(await schemaState(db, place.config.databaseSchema), { pending: [], newer: [] })
      } finally {
        await db.destroy()
      }
      // With nothing pending the same settings start: the app is built on the migrated database.
      const app = await buildApp({ config: { ...place.config, migrateOnStart: false }, logger: false })
      try {
        const res = await app.inject({ method: 'GET', url: '/auth/readyz' })
        assert.equal(res.statusCode, 200, res.body)
      } finally {
        await app.close()
      }
    })

    it('serves a database a newer release has migrated further, and migrates nothing', { timeout: 120_000 }, async () => {
      const place = freshPlace(dialect)
      places.push(place)
      const db = createDb(place.config)
      try {
        await migrateToLatest(db, place.config.databaseSchema)
        // What the next release's `gatehouse migrate` leaves: a migration this release does not know.
        const table = place.config.databaseSchema !== undefined ? sql.table(`${place.config.databaseSchema}.kysely_migration`) : sql.table('kysely_migration')
        await sql`insert into ${table} (name, timestamp) values (${'9999_from_a_newer_release'}, ${new Date().toISOString()})`.execute(db)
        assert.deepEqual(await schemaState(db, place.config.databaseSchema), { pending: [], newer: ['9999_from_a_newer_release'] })
        assert.deepEqual(await migrateToLatest(db, place.config.databaseSchema), [])
      } finally {
        await db.destroy()
      }
      const lines: string[] = []
      const app = await buildApp({ config: place.config, logger: { level: 'info', stream: { write: (line: string) => { lines.push(line) } } } })
      try {
        const res = await app.inject({ method: 'GET', url: '/auth/readyz' })
        assert.equal(res.statusCode, 200, res.body)
        assert.ok(lines.some(line => line.includes('1 migration(s) of a newer release (9999_from_a_newer_release)')), lines.join(''))
      } finally {
        await app.close()
      }
    })

    it('applies the pending migrations one at a time, oldest first, and lists them', { timeout: 120_000 }, async () => {
      const place = freshPlace(dialect)
      places.push(place)
      const db = createDb(place.config)
      try {
        const middle = MIGRATION_NAMES[Math.floor(MIGRATION_NAMES.length / 2)]!
        await migrateTo(db, middle, place.config.databaseSchema)
        const { pending } = await schemaState(db, place.config.databaseSchema)
        assert.deepEqual(pending, MIGRATION_NAMES.slice(MIGRATION_NAMES.indexOf(middle) + 1))
        assert.deepEqual(await migrateToLatest(db, place.config.databaseSchema), pending)
        assert.deepEqual(await schemaState(db, place.config.databaseSchema), { pending: [], newer: [] })
      } finally {
        await db.destroy()
      }
    })
  })
}
