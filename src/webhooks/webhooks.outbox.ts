import { EventEmitter } from 'node:events'
import type { Db } from '../db/database.ts'
import { enqueueDeliveries, enqueueDeliveriesMany } from './webhooks.repository.ts'

/**
 * The webhook outbox's entry points, called in the transaction that records
 * events, and the in-process signal that wakes this process's worker so a
 * delivery need not wait for the next poll. The signal is only a hint: it may
 * come before the transaction commits, and other instances never hear it;
 * the worker's polling is what guarantees delivery.
 */
const queued = new EventEmitter()
queued.setMaxListeners(0)

export function onDeliveriesQueued (listener: () => void): () => void {
  queued.on('queued', listener)
  return () => { queued.off('queued', listener) }
}

/** Queues one event for every enabled endpoint whose filter matches its type. */
export async function queueDeliveries (trx: Db, event: { id: string, type: string, at: string }): Promise<void> {
  if (await enqueueDeliveries(trx, event) > 0) queued.emit('queued')
}

/** The same for many events written at once (an import). */
export async function queueDeliveriesMany (trx: Db, events: Array<{ id: string, type: string }>, at: string): Promise<void> {
  if (await enqueueDeliveriesMany(trx, events, at) > 0) queued.emit('queued')
}
