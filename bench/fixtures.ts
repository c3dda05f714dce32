import { v7 } from 'uuid'
import { Sqlite as SQLite } from '../src/db/sqlite-binding.ts'

/**
 * Seed data shared by the benchmark driver (rows written to SQLite) and the
 * bare server (the fixed array it returns), so both targets send bodies of the
 * same shape and, to within a few bytes, the same size.
 */

/** The list operation's path in gatehouse (default BASE_PATH /auth); the bare server serves the same path. */
export const USERS_PATH = '/auth/api/users'

/** created_at of user 0; user i is created i seconds later, so the default sort (created_at) is the seed order. */
export const SEED_BASE_MS = Date.UTC(2024, 0, 1)

const FIRST_NAMES = ['Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Donald', 'Frances', 'Ken']
const LAST_NAMES = ['Lovelace', 'Hopper', 'Turing', 'Dijkstra', 'Liskov', 'Knuth', 'Allen', 'Thompson']

/** One row of the `users` table, columns exactly as in src/db/migrations/0001_init.ts (SQLite types). */
export interface SeedRow {
  id: string
  username: string
  username_key: string
  email: string
  email_key: string
  first_name: string
  last_name: string
  role: 'user'
  groups: string
  disabled: 0
  password_hash: null
  version: 1
  created_at: string
  updated_at: string
  last_login_at: null
  password_changed_at: null
}

export function seedRow (i: number): SeedRow {
  const msecs = SEED_BASE_MS + i * 1000
  const at = new Date(msecs).toISOString()
  const username = `Bench.User${String(i).padStart(6, '0')}`
  const email = `${username}@Example.org`
  return {
    id: v7({ msecs }),
    username,
    username_key: username.toLowerCase(),
    email,
    email_key: email.toLowerCase(),
    first_name: FIRST_NAMES[i % FIRST_NAMES.length]!,
    last_name: LAST_NAMES[i % LAST_NAMES.length]!,
    role: 'user',
    groups: '["etl"]',
    disabled: 0,
    password_hash: null,
    version: 1,
    created_at: at,
    updated_at: at,
    last_login_at: null,
    password_changed_at: null
  }
}

/** Writes users 0 to count - 1 (seedRow) into a migrated SQLite file, in one transaction, and checks the count. */
export function seedSqliteUsers (dbPath: string, count: number): void {
  const sqlite = new SQLite(dbPath)
  try {
    sqlite.pragma('journal_mode = WAL')
    const columns: Array<keyof SeedRow> = [
      'id', 'username', 'username_key', 'email', 'email_key', 'first_name', 'last_name', 'role', 'groups', 'disabled',
      'password_hash', 'version', 'created_at', 'updated_at', 'last_login_at', 'password_changed_at'
    ]
    const insert = sqlite.prepare(`insert into users (${columns.join(', ')}) values (${columns.map(c => '@' + c).join(', ')})`)
    sqlite.transaction(() => {
      for (let i = 0; i < count; i++) insert.run(seedRow(i))
    })()
    const { n } = sqlite.prepare('select count(*) as n from users').get() as { n: number }
    if (n !== count) throw new Error(`seeded ${n} users, expected ${count}`)
    // Copied into the file and the WAL emptied, now rather than at close: a server that has the file open already
    // (bench/ab-builds.ts, AB_SEPARATE_FILES) would otherwise read every page from the WAL by read(2), not through its
    // memory map, until its next write restarted the WAL.
    sqlite.pragma('wal_checkpoint(TRUNCATE)')
  } finally {
    sqlite.close()
  }
}
