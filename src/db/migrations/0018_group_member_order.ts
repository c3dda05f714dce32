import { sql, type Kysely } from 'kysely'
import { columnTypes, isPostgres } from '../database.ts'

export const phase = 'expand'

/**
 * The users list's `group=` filter as an index range walked in page order
 * (issue 20): each membership row carries its user's sort keys (created_at,
 * updated_at, username_key), with an index (group_id, key, user_id) per key.
 * A page of a group then reads the group's first members in the requested
 * order and stops, on both databases, whatever the group's size.
 *
 * Before, the filter was `users.id in (members of the group)`: SQLite read
 * every member and sorted them (a group of 10,000 members: p50 75 ms at
 * 1,000,000 users), and PostgreSQL's generic plan walked the whole users
 * index probing each user's membership (a group of 10 members: p50 1.6 s).
 *
 * The copies are kept in step by triggers, so every door that writes users or
 * memberships (the lifecycle, imports, SCIM, the CLI, SQL by hand) keeps them
 * right: a new membership takes its user's keys, and a change of a user's
 * keys is written to their memberships (a user is in at most 100 groups).
 * A sign-in does not change any of them.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { ts } = columnTypes(db)
  // Nullable: SQLite's trigger can only fill them after the insert. Every row has them once it is written.
  await db.schema.alterTable('group_members').addColumn('created_at', ts).execute()
  await db.schema.alterTable('group_members').addColumn('updated_at', ts).execute()
  await db.schema.alterTable('group_members').addColumn('username_key', 'text').execute()
  if (isPostgres(db)) {
    await sql`update group_members m set created_at = u.created_at, updated_at = u.updated_at, username_key = u.username_key
      from users u where u.id = m.user_id`.execute(db)
    // `set search_path from current`: the tables of the schema migrated, whatever a session's own path is.
    await sql`
      create function gatehouse_group_member_keys() returns trigger language plpgsql set search_path from current as $$
      begin
        select u.created_at, u.updated_at, u.username_key into new.created_at, new.updated_at, new.username_key
          from users u where u.id = new.user_id;
        return new;
      end
      $$`.execute(db)
    await sql`create trigger group_members_keys before insert on group_members
      for each row execute function gatehouse_group_member_keys()`.execute(db)
    await sql`
      create function gatehouse_user_member_keys() returns trigger language plpgsql set search_path from current as $$
      begin
        update group_members set created_at = new.created_at, updated_at = new.updated_at, username_key = new.username_key
          where user_id = new.id;
        return null;
      end
      $$`.execute(db)
    await sql`create trigger users_member_keys after update of created_at, updated_at, username_key on users
      for each row when (old.created_at is distinct from new.created_at or old.updated_at is distinct from new.updated_at
        or old.username_key is distinct from new.username_key)
      execute function gatehouse_user_member_keys()`.execute(db)
  } else {
    await sql`update group_members set (created_at, updated_at, username_key) =
      (select u.created_at, u.updated_at, u.username_key from users u where u.id = group_members.user_id)`.execute(db)
    await sql`create trigger group_members_keys after insert on group_members begin
      update group_members set (created_at, updated_at, username_key) =
        (select u.created_at, u.updated_at, u.username_key from users u where u.id = new.user_id)
        where group_id = new.group_id and user_id = new.user_id;
    end`.execute(db)
    await sql`create trigger users_member_keys after update of created_at, updated_at, username_key on users
      when old.created_at is not new.created_at or old.updated_at is not new.updated_at or old.username_key is not new.username_key
    begin
      update group_members set created_at = new.created_at, updated_at = new.updated_at, username_key = new.username_key
        where user_id = new.id;
    end`.execute(db)
  }
  for (const [column, name] of MEMBER_ORDER) {
    await db.schema.createIndex(`group_members_${name}_idx`).on('group_members').columns(['group_id', column, 'user_id']).execute()
  }
}

export async function down (db: Kysely<any>): Promise<void> {
  for (const [, name] of MEMBER_ORDER) await db.schema.dropIndex(`group_members_${name}_idx`).ifExists().execute()
  if (isPostgres(db)) {
    await sql`drop trigger if exists users_member_keys on users`.execute(db)
    await sql`drop trigger if exists group_members_keys on group_members`.execute(db)
    await sql`drop function if exists gatehouse_user_member_keys()`.execute(db)
    await sql`drop function if exists gatehouse_group_member_keys()`.execute(db)
  } else {
    await sql`drop trigger if exists users_member_keys`.execute(db)
    await sql`drop trigger if exists group_members_keys`.execute(db)
  }
  for (const column of ['username_key', 'updated_at', 'created_at']) await db.schema.alterTable('group_members').dropColumn(column).execute()
}

/** The users list's sort keys (users.repository.ts) and the index each is walked by. */
const MEMBER_ORDER = [['created_at', 'created'], ['updated_at', 'updated'], ['username_key', 'username']] as const
