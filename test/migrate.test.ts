import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, it } from 'node:test'
import pg from 'pg'
import { defaultConfig } from '../src/config.ts'
import { createDb } from '../src/db/database.ts'
import { migrateToLatest } from '../src/db/migrate.ts'
import { dialects } from './helpers.ts'

const postgres = dialects().find(d => d.name === 'postgres')

describe('migrations on a PostgreSQL database shared with others', () => {
  it('succeed while other clients create and drop schemas of their own (the migrator reads only its own schema)', { skip: postgres === undefined ? 'TEST_DATABASE_URL is not set' : false, timeout: 120_000 }, async () => {
    const url = postgres!.url!
    const churning = { stop: false }
    // Two neighbours, each making and dropping a schema with a table as fast as they can.
    const neighbour = async (): Promise<void> => {
      const client = new pg.Client({ connectionString: url })
      await client.connect()
      try {
        while (!churning.stop) {
          const schema = `gh_neighbour_${randomBytes(6).toString('hex')}`
          await client.query(`create schema "${schema}"`)
          await client.query(`create table "${schema}".t (id serial primary key, a text, b text)`)
          await client.query(`drop schema "${schema}" cascade`)
        }
      } finally {
        await client.end()
      }
    }
    const neighbours = [neighbour(), neighbour()]
    const failures: string[] = []
    const admin = new pg.Client({ connectionString: url })
    await admin.connect()
    try {
      // Before the migrator was limited to its own schema, about six in ten of these failed (3F000).
      for (let i = 0; i < 12; i++) {
        const schema = `gh_test_${randomBytes(6).toString('hex')}`
        const db = createDb(defaultConfig({ databaseUrl: url, databaseSchema: schema }))
        try {
          const applied = await migrateToLatest(db, schema)
          assert.ok(applied.length > 0, 'a fresh schema gets every migration')
        } catch (error) {
          failures.push(`${(error as { code?: string }).code ?? ''} ${(error as Error).message}`)
        } finally {
          await db.destroy()
          await admin.query(`drop schema if exists "${schema}" cascade`)
        }
      }
    } finally {
      churning.stop = true
      await Promise.all(neighbours)
      await admin.end()
    }
    assert.deepEqual(failures, [])
  })
})
