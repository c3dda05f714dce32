import { sql, type Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * One migration for both engines: column types differ only where SQLite has no
 * native type (uuid, timestamptz, jsonb, boolean), and every rule the API
 * promises (case-insensitive uniqueness, one digest per key) is an index here.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid, ts, json, bool } = columnTypes(db)

  await db.schema.createTable('users')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('username', 'text', c => c.notNull())
    .addColumn('username_key', 'text', c => c.notNull())
    .addColumn('email', 'text')
    .addColumn('email_key', 'text')
    .addColumn('first_name', 'text')
    .addColumn('last_name', 'text')
    .addColumn('role', 'text', c => c.notNull().check(sql`role in ('admin', 'user')`))
    .addColumn('groups', json, c => c.notNull())
    .addColumn('disabled', bool, c => c.notNull())
    .addColumn('password_hash', 'text')
    .addColumn('version', 'integer', c => c.notNull())
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('updated_at', ts, c => c.notNull())
    .addColumn('last_login_at', ts)
    .addColumn('password_changed_at', ts)
    .execute()
  await db.schema.createIndex('users_username_key_unique').on('users').column('username_key').unique().execute()
  await db.schema.createIndex('users_email_key_unique').on('users').column('email_key').unique().execute()
  await db.schema.createIndex('users_created_at_idx').on('users').columns(['created_at', 'id']).execute()
  await db.schema.createIndex('users_updated_at_idx').on('users').columns(['updated_at', 'id']).execute()
  await db.schema.createIndex('users_role_idx').on('users').columns(['role', 'disabled']).execute()

  await db.schema.createTable('api_keys')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('name', 'text', c => c.notNull())
    .addColumn('prefix', 'text', c => c.notNull())
    .addColumn('digest', 'text', c => c.notNull())
    .addColumn('scopes', json, c => c.notNull())
    .addColumn('user_id', uuid, c => c.references('users.id').onDelete('cascade'))
    .addColumn('created_by_type', 'text', c => c.notNull())
    .addColumn('created_by_id', 'text')
    .addColumn('created_at', ts, c => c.notNull())
    .addColumn('expires_at', ts)
    .addColumn('last_used_at', ts)
    .addColumn('revoked_at', ts)
    .execute()
  await db.schema.createIndex('api_keys_digest_unique').on('api_keys').column('digest').unique().execute()
  await db.schema.createIndex('api_keys_user_id_idx').on('api_keys').column('user_id').execute()

  await db.schema.createTable('events')
    .addColumn('id', uuid, c => c.primaryKey())
    .addColumn('type', 'text', c => c.notNull())
    .addColumn('occurred_at', ts, c => c.notNull())
    .addColumn('actor_type', 'text', c => c.notNull())
    .addColumn('actor_id', 'text')
    .addColumn('target_type', 'text')
    .addColumn('target_id', 'text')
    .addColumn('request_id', 'text')
    .addColumn('client_ip', 'text')
    .addColumn('data', json, c => c.notNull())
    .execute()
  await db.schema.createIndex('events_type_idx').on('events').columns(['type', 'id']).execute()
  await db.schema.createIndex('events_target_idx').on('events').columns(['target_id', 'id']).execute()
  await db.schema.createIndex('events_actor_idx').on('events').columns(['actor_id', 'id']).execute()

  await db.schema.createTable('gatehouse_meta')
    .addColumn('key', 'text', c => c.primaryKey())
    .addColumn('value', 'text', c => c.notNull())
    .execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  for (const table of ['gatehouse_meta', 'events', 'api_keys', 'users']) {
    await db.schema.dropTable(table).execute()
  }
}
