import type { Db } from '../db/database.ts'
import { keyId, open, seal, SecretBoxError } from '../lib/secret-box.ts'
import { contextOf as mailContextOf, databaseMailKey, mailKeyOf } from '../mail/mail.outbox.ts'
import { secretContext } from '../sso/oidc.client.ts'
import { countSealedByPrefix, findSealedNotUnder, PREFIX_LENGTH, replaceSealed, SEALED_PLACES, type SealedPlace } from './sealed-values.repository.ts'

/**
 * What MFA_ENCRYPTION_KEY's ring has sealed, key id by key id, and moving it
 * all under the ring's first key (`gatehouse keys status`, `keys re-encrypt`;
 * docs/operations.md#key-rotation). Queued mail is sealed under a key derived
 * from a ring key (mailKeyOf), or, queued before any key was set, under the
 * database's own mail key; it is counted under the ring key it derives from.
 */
export const PLACES = Object.keys(SEALED_PLACES) as SealedPlace[]

/** `seals`: the ring's first key; `listed`: another of the ring; `database`: the database's own mail key; `unlisted`: no key this ring can open with; `unreadable`: not a sealed value at all. */
export type KeyRole = 'seals' | 'listed' | 'database' | 'unlisted' | 'unreadable'

export interface KeyIdCounts {
  keyId: string
  role: KeyRole
  /** 1-based place in MFA_ENCRYPTION_KEY, for a listed key. */
  position: number | undefined
  counts: Record<SealedPlace, number>
  total: number
}

interface PlaceKeys {
  /** The prefix of a value already where it should be. */
  target: string
  seal: Buffer
  opening: Buffer[]
  context: (key: string) => string
}

const SEALED_ID = new RegExp(`^v1\\.([A-Za-z0-9_-]{${PREFIX_LENGTH - 4}})\\.$`)

/** Counts of every sealed value by the key that sealed it, the ring's keys first (each listed even with nothing under it). */
export async function sealedValuesByKey (db: Db, ring: readonly Buffer[]): Promise<KeyIdCounts[]> {
  const ringIds = ring.map(key => keyId(key))
  // A mail key's id, as the id of the ring key it derives from.
  const mailIds = new Map(ring.map((key, index) => [keyId(mailKeyOf(key)!), ringIds[index]!]))
  const databaseId = keyId(await databaseMailKey(db))
  const byId = new Map<string, KeyIdCounts>()
  const entry = (id: string, role: KeyRole, position?: number): KeyIdCounts => {
    let found = byId.get(id)
    if (found === undefined) {
      found = { keyId: id, role, position, counts: { totp: 0, oidc: 0, mail: 0 }, total: 0 }
      byId.set(id, found)
    }
    return found
  }
  ringIds.forEach((id, index) => entry(id, index === 0 ? 'seals' : 'listed', index + 1))
  for (const place of PLACES) {
    for (const { prefix, count } of await countSealedByPrefix(db, place)) {
      const sealedId = SEALED_ID.exec(prefix)?.[1]
      let counted: KeyIdCounts
      if (sealedId === undefined) counted = entry('?', 'unreadable')
      else if (place !== 'mail') counted = entry(sealedId, 'unlisted')
      else if (mailIds.has(sealedId)) counted = entry(mailIds.get(sealedId)!, 'unlisted')
      else counted = entry(sealedId, sealedId === databaseId ? 'database' : 'unlisted')
      counted.counts[place] += count
      counted.total += count
    }
  }
  return [...byId.values()].filter(row => row.position !== undefined || row.total > 0)
}

/** What no key of the ring opens: values under a key MFA_ENCRYPTION_KEY does not list, and values that are not sealed values. */
export function unopenable (counts: KeyIdCounts[]): KeyIdCounts[] {
  return counts.filter(row => row.role === 'unlisted' || row.role === 'unreadable')
}

async function placeKeys (db: Db, ring: readonly Buffer[], place: SealedPlace): Promise<PlaceKeys> {
  if (place === 'mail') {
    const keys = ring.map(key => mailKeyOf(key)!)
    return { target: `v1.${keyId(keys[0]!)}.`, seal: keys[0]!, opening: [...keys, await databaseMailKey(db)], context: mailContextOf }
  }
  return { target: `v1.${keyId(ring[0]!)}.`, seal: ring[0]!, opening: [...ring], context: place === 'totp' ? id => id : secretContext }
}

export interface ReEncryptProgress {
  place: SealedPlace
  /** Moved under the first key in this place so far, by this run. */
  moved: number
  /** Values of this place not under the first key when the run began. */
  of: number
}

export interface ReEncryptResult {
  moved: number
  /** Values a listed key did not open after all (altered, or sealed for another row): left as they are. */
  failed: Array<{ place: SealedPlace, key: string, reason: string }>
}

/**
 * Reseals every value not under the ring's first key with it, `batchSize`
 * values to a transaction. Each committed batch stays done: a run that is
 * stopped (even by SIGKILL) is finished by running it again, which finds
 * what is left by its key id. A value changed meanwhile (a new TOTP set-up)
 * is not overwritten: it is under the first key already.
 */
export async function reEncrypt (db: Db, ring: readonly Buffer[], batchSize: number, onBatch: (progress: ReEncryptProgress) => void): Promise<ReEncryptResult> {
  const result: ReEncryptResult = { moved: 0, failed: [] }
  for (const place of PLACES) {
    const keys = await placeKeys(db, ring, place)
    const of = (await countSealedByPrefix(db, place)).filter(row => row.prefix !== keys.target).reduce((sum, row) => sum + row.count, 0)
    let moved = 0
    let after: string | undefined
    for (;;) {
      const batch = await db.transaction().execute(async trx => {
        const rows = await findSealedNotUnder(trx, place, keys.target, after, batchSize)
        let done = 0
        for (const row of rows) {
          let plaintext: string
          try {
            plaintext = open(keys.opening, row.sealed, keys.context(row.key))
          } catch (error) {
            if (!(error instanceof SecretBoxError)) throw error
            result.failed.push({ place, key: row.key, reason: error.message })
            continue
          }
          if (await replaceSealed(trx, place, row, seal(keys.seal, plaintext, keys.context(row.key)))) done += 1
        }
        return { last: rows.at(-1)?.key, read: rows.length, done }
      })
      if (batch.read === 0) break
      after = batch.last
      moved += batch.done
      result.moved += batch.done
      onBatch({ place, moved, of })
      if (batch.read < batchSize) break
    }
  }
  return result
}

const PLACE_NAMES: Record<SealedPlace, string> = { totp: 'TOTP secrets', oidc: 'OIDC client secrets', mail: 'queued mail payloads' }

/** "3 TOTP secrets, 1 OIDC client secret": what a row of counts holds, for a message. */
export function describeCounts (counts: Record<SealedPlace, number>): string {
  return PLACES.filter(place => counts[place] > 0).map(place => `${counts[place]} ${counts[place] === 1 ? PLACE_NAMES[place].replace(/s( |$)/, '$1') : PLACE_NAMES[place]}`).join(', ')
}

/** One line for each key id whose values no key of the ring opens; said at start, rather than at someone's sign-in. */
export async function unopenableWarnings (db: Db, ring: readonly Buffer[]): Promise<Array<{ keyId: string, count: number, message: string }>> {
  return unopenable(await sealedValuesByKey(db, ring)).map(row => ({
    keyId: row.keyId,
    count: row.total,
    message: row.role === 'unreadable'
      ? `${row.total} stored value(s) meant to be sealed are not sealed values (${describeCounts(row.counts)}); they cannot be opened`
      : `${row.total} sealed value(s) (${describeCounts(row.counts)}) are under key id ${row.keyId}, which MFA_ENCRYPTION_KEY ${ring.length === 0 ? 'does not list (it is not set)' : 'does not list'}: they will be refused when used. List that key again (after the first), then run gatehouse keys re-encrypt`
  }))
}
