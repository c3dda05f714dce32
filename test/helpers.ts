import { randomBytes } from 'node:crypto'
import { after, before } from 'node:test'
import pg from 'pg'
import { buildApp } from '../src/app.ts'
import type { FastifyTypeBox } from '../src/lib/http.ts'
import { defaultConfig, type Config } from '../src/config.ts'
import { bootstrap } from '../src/bootstrap.ts'

export interface Dialect { name: 'sqlite' | 'postgres', url: string | undefined }

/** SQLite always; PostgreSQL too when TEST_DATABASE_URL is set (CI sets it). */
export function dialects (): Dialect[] {
  const list: Dialect[] = [{ name: 'sqlite', url: undefined }]
  if (process.env.TEST_DATABASE_URL !== undefined && process.env.TEST_DATABASE_URL !== '') {
    list.push({ name: 'postgres', url: process.env.TEST_DATABASE_URL })
  }
  return list
}

const schemasToDrop: Array<{ url: string, schema: string }> = []
/** Drops a PostgreSQL schema a test made, with everything in it. */
export async function dropSchema (url: string, schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await client.query(`drop schema if exists "${schema}" cascade`)
  } finally {
    await client.end()
  }
}

after(async () => {
  for (const { url, schema } of schemasToDrop.splice(0)) await dropSchema(url, schema)
})

export interface TestApp {
  app: FastifyTypeBox
  /** An admin API key, from the bootstrap path a fresh deployment takes. */
  adminKey: string
  config: Config
}

/**
 * A fresh app on a fresh database: SQLite in memory, or a PostgreSQL schema
 * of its own (dropped when the test file ends). Built through buildApp, so
 * every Fastify and Ajv option is the production one.
 */
export async function createTestApp (dialect: Dialect, overrides: Partial<Config> = {}, logStream?: { write: (line: string) => void }): Promise<TestApp> {
  let databaseUrl = 'sqlite::memory:'
  let databaseSchema: string | undefined
  if (dialect.url !== undefined) {
    databaseUrl = dialect.url
    databaseSchema = `gh_test_${randomBytes(6).toString('hex')}`
    schemasToDrop.push({ url: dialect.url, schema: databaseSchema })
  }
  const config = defaultConfig({ databaseUrl, databaseSchema, logLevel: logStream !== undefined ? 'info' : 'silent', ...overrides })
  const app = await buildApp({ config, ...(logStream !== undefined ? { logStream } : { logger: false }) })
  let generatedKey: string | undefined
  try {
    generatedKey = (await bootstrap(app.db, app.passwords, config, app.log)).generatedKey
    await app.ready()
  } catch (error) {
    await app.close()
    throw error
  }
  return { app, adminKey: generatedKey ?? overrides.bootstrapAdminApiKey ?? '', config }
}

/**
 * A fresh app for the enclosing describe(): built before its tests, closed
 * after them. Fields are filled in by the before hook.
 */
export function useTestApp (dialect: Dialect, overrides: Partial<Config> = {}, logStream?: { write: (line: string) => void }): TestApp {
  const holder = {} as TestApp
  before(async () => { Object.assign(holder, await createTestApp(dialect, overrides, logStream)) })
  after(async () => { await holder.app?.close() })
  return holder
}

export function auth (key: string): Record<string, string> {
  return { 'x-api-key': key }
}

let counter = 0
/** A username that no other test in this process uses. */
export function uniqueName (stem = 'user'): string {
  counter += 1
  return `${stem}${counter}_${randomBytes(3).toString('hex')}`
}

export const GOOD_PASSWORD = 'correct horse battery staple'

/**
 * Why the suites that kill a running service with SIGKILL skip, or false
 * when they run: TEST_CRASH=off (CI runs them on its first Node only,
 * .ci/run: what they test is the database's durability and gatehouse's
 * recovery, not the Node version).
 */
export function crashTestsSkipped (): string | false {
  return process.env.TEST_CRASH === 'off' ? 'TEST_CRASH=off' : false
}
