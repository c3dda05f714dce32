import { v7 } from 'uuid'

/** Time-ordered UUIDs (v7): ids sort by creation, which keyset paging relies on. */
export function newId (): string {
  return v7()
}

export function nowIso (): string {
  return new Date().toISOString()
}
