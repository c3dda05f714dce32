/**
 * What a backup holds: every table of gatehouse's schema whose rows are data,
 * in an order in which each table's foreign keys point only at tables before
 * it, with each column's kind, which says how its values are written in the
 * portable file and bound again on either database.
 *
 * Left out, because the schema makes them from the rows: the sort keys of
 * `group_members` (triggers write them at insert), SQLite's full-text tables and PostgreSQL's trigram indexes, PostgreSQL's
 * `users_page_stamp` (a change counter that only has to move), and Kysely's
 * `kysely_migration` tables (the restore runs the migrations itself).
 *
 * A migration that adds a table or a column must add it here: a backup of a
 * database with a column this list does not know is refused, and
 * test/backup.test.ts compares the list with both migrated schemas.
 */
export type ColumnKind = 'text' | 'uuid' | 'ts' | 'json' | 'bool' | 'int' | 'blob'

export interface BackupTable {
  name: string
  primaryKey: readonly string[]
  columns: Readonly<Record<string, ColumnKind>>
  /** Columns made by triggers from other rows or columns: neither backed up nor inserted. */
  derived?: readonly string[]
  /** A foreign key to the same table (a user's manager): inserted as null, then set once every row is in. */
  selfReferences?: readonly string[]
}

const T = 'text' as const
const U = 'uuid' as const
const TS = 'ts' as const
const J = 'json' as const
const B = 'bool' as const
const I = 'int' as const

export const BACKUP_TABLES: readonly BackupTable[] = [
  {
    name: 'gatehouse_meta',
    primaryKey: ['key'],
    columns: { key: T, value: T }
  },
  {
    name: 'users',
    primaryKey: ['id'],
    columns: {
      id: U,
      username: T,
      username_key: T,
      email: T,
      email_key: T,
      first_name: T,
      last_name: T,
      role: T,
      groups: J,
      disabled: B,
      password_hash: T,
      version: I,
      created_at: TS,
      updated_at: TS,
      last_login_at: TS,
      password_changed_at: TS,
      failed_logins: I,
      locked_until: TS,
      password_sign_in: B,
      external_id: T,
      display_name: T,
      formatted_name: T,
      scim_emails: J,
      provisioned_at: TS,
      email_verified: B,
      invitation_pending: B,
      employee_number: T,
      cost_center: T,
      organization: T,
      division: T,
      department: T,
      manager_id: U
    },
    selfReferences: ['manager_id']
  },
  {
    name: 'groups',
    primaryKey: ['id'],
    columns: { id: U, display_name: T, name_key: T, external_id: T, version: I, created_at: TS, updated_at: TS }
  },
  {
    name: 'group_members',
    primaryKey: ['group_id', 'user_id'],
    columns: { group_id: U, user_id: U },
    derived: ['created_at', 'updated_at', 'username_key']
  },
  {
    name: 'api_keys',
    primaryKey: ['id'],
    columns: {
      id: U,
      name: T,
      prefix: T,
      digest: T,
      scopes: J,
      user_id: U,
      created_by_type: T,
      created_by_id: T,
      created_at: TS,
      expires_at: TS,
      last_used_at: TS,
      revoked_at: TS
    }
  },
  {
    name: 'sessions',
    primaryKey: ['id'],
    columns: {
      id: U,
      user_id: U,
      digest: T,
      created_at: TS,
      last_seen_at: TS,
      expires_at: TS,
      ended_at: TS,
      client_ip: T,
      user_agent: T,
      mfa: B,
      reauthenticated_at: TS,
      sign_in_method: T,
      sign_in_provider: T
    }
  },
  {
    name: 'sign_in_addresses',
    primaryKey: ['user_id', 'client_ip'],
    columns: { user_id: U, client_ip: T, last_sign_in_at: TS }
  },
  {
    name: 'totp_factors',
    primaryKey: ['user_id'],
    columns: { user_id: U, secret: T, confirmed_at: TS, last_time_step: I, created_at: TS, confirm_failures: I }
  },
  {
    name: 'recovery_codes',
    primaryKey: ['id'],
    columns: { id: U, user_id: U, digest: T, used_at: TS, created_at: TS }
  },
  {
    name: 'passkeys',
    primaryKey: ['id'],
    columns: {
      id: U, user_id: U, credential_id: T, public_key: T, sign_count: I, transports: J, name: T, created_at: TS, last_used_at: TS
    }
  },
  {
    name: 'mfa_challenges',
    primaryKey: ['id'],
    columns: {
      id: U,
      purpose: T,
      digest: T,
      user_id: U,
      webauthn_challenge: T,
      enrol: B,
      created_at: TS,
      expires_at: TS,
      used_at: TS,
      sign_in_method: T,
      sign_in_provider: T
    }
  },
  {
    name: 'user_identities',
    primaryKey: ['id'],
    columns: { id: U, user_id: U, provider: T, subject: T, email: T, created_at: TS, last_sign_in_at: TS }
  },
  {
    name: 'oidc_providers',
    primaryKey: ['id'],
    columns: {
      id: T,
      display_name: T,
      issuer: T,
      client_id: T,
      client_secret: T,
      scopes: J,
      enabled: B,
      jit: B,
      link_by_email: B,
      groups_claim: T,
      group_map: J,
      admin_groups: J,
      created_at: TS,
      updated_at: TS
    }
  },
  {
    name: 'oidc_logins',
    primaryKey: ['id'],
    columns: {
      id: U, state_digest: T, provider_id: T, code_verifier: T, nonce: T, next: T, created_at: TS, expires_at: TS, used_at: TS
    }
  },
  {
    name: 'account_tokens',
    primaryKey: ['id'],
    columns: {
      id: U,
      user_id: U,
      purpose: T,
      digest: T,
      code_digest: T,
      code_failures: I,
      email: T,
      created_at: TS,
      expires_at: TS,
      used_at: TS,
      ended_reason: T
    }
  },
  {
    name: 'events',
    primaryKey: ['id'],
    columns: {
      id: U,
      type: T,
      occurred_at: TS,
      actor_type: T,
      actor_id: T,
      target_type: T,
      target_id: T,
      request_id: T,
      client_ip: T,
      data: J,
      trace_id: T,
      span_id: T
    }
  },
  {
    name: 'webhook_endpoints',
    primaryKey: ['id'],
    columns: {
      id: U,
      url: T,
      description: T,
      event_types: J,
      event_patterns: J,
      enabled: B,
      disabled_reason: T,
      secret: T,
      previous_secret: T,
      previous_secret_expires_at: TS,
      failing_since: TS,
      created_at: TS,
      updated_at: TS
    }
  },
  {
    name: 'webhook_deliveries',
    primaryKey: ['endpoint_id', 'event_id'],
    columns: {
      endpoint_id: U,
      event_id: U,
      status: T,
      attempts: I,
      next_attempt_at: TS,
      give_up_at: TS,
      locked_until: TS,
      lock_token: T,
      last_attempt_at: TS,
      last_status_code: I,
      last_error: T,
      created_at: TS,
      delivered_at: TS
    }
  },
  {
    name: 'webhook_attempts',
    primaryKey: ['id'],
    columns: {
      id: U,
      endpoint_id: U,
      event_id: U,
      attempted_at: TS,
      succeeded: B,
      status_code: I,
      latency_ms: I,
      error: T,
      next_attempt_at: TS
    }
  },
  {
    name: 'idempotency_keys',
    primaryKey: ['scope', 'method', 'path', 'key'],
    columns: {
      scope: T,
      method: T,
      path: T,
      key: T,
      fingerprint: T,
      state: T,
      lock_token: T,
      locked_until: TS,
      status_code: I,
      response_headers: T,
      response_body: 'blob',
      created_at: TS
    }
  },
  {
    name: 'mail_outbox',
    primaryKey: ['id'],
    columns: {
      id: U,
      user_id: U,
      template: T,
      payload: T,
      status: T,
      attempts: I,
      next_attempt_at: TS,
      locked_until: TS,
      lock_token: T,
      last_error: T,
      created_at: TS,
      finished_at: TS
    }
  }
]

/**
 * Tables of the schema that hold no data of their own (see above), and
 * `login_throttle_windows`, which only marks which sign-in throttle windows
 * have recorded their event (a restored service starts new windows). A
 * database holding any other table is not one this release knows, and its
 * backup is refused.
 */
export const UNSAVED_TABLES: ReadonlySet<string> = new Set(['kysely_migration', 'kysely_migration_lock', 'users_page_stamp', 'login_throttle_windows'])

/** SQLite's full-text index of users (migration 0019) and the shadow tables FTS5 keeps for it. */
export function isSearchIndexTable (name: string): boolean {
  return name === 'users_search' || name.startsWith('users_search_')
}

export const TABLES_BY_NAME: ReadonlyMap<string, BackupTable> = new Map(BACKUP_TABLES.map(table => [table.name, table]))
