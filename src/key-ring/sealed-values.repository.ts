import { sql } from 'kysely'
import type { Db } from '../db/database.ts'

/**
 * Where sealed values (src/lib/secret-box.ts) are kept: each place's table,
 * its key column and its sealed column. A value starts `v1.<key id>.`, 15
 * characters, so counting and filtering by that prefix needs no decryption.
 */
export const SEALED_PLACES = {
  totp: { table: 'totp_factors', key: 'user_id', column: 'secret' },
  oidc: { table: 'oidc_providers', key: 'id', column: 'client_secret' },
  mail: { table: 'mail_outbox', key: 'id', column: 'payload' }
} as const

export type SealedPlace = keyof typeof SEALED_PLACES

export const PREFIX_LENGTH = 15

export interface SealedRow { key: string, sealed: string }

const prefixOf = (column: string): ReturnType<typeof sql> => sql`substr(${sql.ref(column)}, 1, ${sql.lit(PREFIX_LENGTH)})`

/** How many values of `place` start with each prefix (a null column holds nothing sealed). */
export async function countSealedByPrefix (db: Db, place: SealedPlace): Promise<Array<{ prefix: string, count: number }>> {
  const { table, column } = SEALED_PLACES[place]
  const { rows } = await sql<{ prefix: string, count: string | number }>`
    select ${prefixOf(column)} as prefix, count(*) as count from ${sql.table(table)}
    where ${sql.ref(column)} is not null group by ${prefixOf(column)}`.execute(db)
  return rows.map(row => ({ prefix: row.prefix, count: Number(row.count) }))
}

/** Up to `limit` values of `place` that do not start with `prefix`, in key order after `after`. */
export async function findSealedNotUnder (db: Db, place: SealedPlace, prefix: string, after: string | undefined, limit: number): Promise<SealedRow[]> {
  const { table, key, column } = SEALED_PLACES[place]
  const { rows } = await sql<SealedRow>`
    select ${sql.ref(key)} as key, ${sql.ref(column)} as sealed from ${sql.table(table)}
    where ${sql.ref(column)} is not null and ${prefixOf(column)} <> ${prefix}
    ${after !== undefined ? sql`and ${sql.ref(key)} > ${after}` : sql``}
    order by ${sql.ref(key)} limit ${limit}`.execute(db)
  return rows.map(row => ({ key: String(row.key), sealed: row.sealed }))
}

/** Replaces one value, only if it is still the one that was read (a concurrent change wins); whether it did. */
export async function replaceSealed (db: Db, place: SealedPlace, row: SealedRow, sealed: string): Promise<boolean> {
  const { table, key, column } = SEALED_PLACES[place]
  const result = await sql`update ${sql.table(table)} set ${sql.ref(column)} = ${sealed}
    where ${sql.ref(key)} = ${row.key} and ${sql.ref(column)} = ${row.sealed}`.execute(db)
  return Number(result.numAffectedRows ?? 0) === 1
}
