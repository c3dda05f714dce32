import { sql, type Kysely } from 'kysely'
import { isPostgres } from '../database.ts'

/**
 * PostgreSQL: a successful sign-in writes `users.last_login_at`, which no
 * credential's answer depends on (auth/credential-cache.ts keeps the same
 * list). Migration 0007's trigger counted it as a change, so every sign-in
 * sent NOTIFY gatehouse_credentials and emptied every instance's credential
 * cache: during a sign-in storm the reverse-proxy gate (`/verify`) read the
 * database again after each sign-in (issue 20). Now the trigger ignores it,
 * as it ignores the other sign-in bookkeeping (failed_logins, locked_until).
 */
const TRIGGER = 'users_credentials_changed_update'

async function recreate (db: Kysely<any>, ignored: string[]): Promise<void> {
  await sql`drop trigger if exists ${sql.id(TRIGGER)} on users`.execute(db)
  const strip = sql.join(ignored.map(column => sql`- ${sql.lit(column)}`), sql` `)
  await sql`
    create trigger ${sql.id(TRIGGER)} after update on users
    for each row when ((to_jsonb(old) ${strip}) is distinct from (to_jsonb(new) ${strip}))
    execute function gatehouse_credentials_changed()`.execute(db)
}

export const phase = 'expand'

export async function up (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await recreate(db, ['failed_logins', 'locked_until', 'last_login_at'])
}

export async function down (db: Kysely<any>): Promise<void> {
  if (!isPostgres(db)) return
  await recreate(db, ['failed_logins', 'locked_until'])
}
