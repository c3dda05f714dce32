/** After a wake-up finds nothing (the signalling transaction had not committed yet), look again after these delays. */
const WAKE_RETRIES_MS = [5, 25, 100]

/**
 * When an outbox worker (webhooks/webhooks.worker.ts, mail/mail.worker.ts)
 * runs its cycle: never two at once; at once when this process queued
 * something (`wake`), and again shortly after, since the queuing transaction
 * may not have committed when the cycle looked; otherwise every poll
 * interval, for what other instances queued and for retries coming due.
 */
export class PollingLoop {
  readonly #cycle: () => Promise<void>
  readonly #intervalMs: number
  #timer: NodeJS.Timeout | undefined
  #running: Promise<void> | undefined
  #stopped = true
  #wakeRetry = WAKE_RETRIES_MS.length

  /** `cycle` must not throw: it logs its own failures, and the loop goes on. */
  constructor (cycle: () => Promise<void>, intervalMs: number) {
    this.#cycle = cycle
    this.#intervalMs = intervalMs
  }

  /** True from construction until `start`, and after `stop`: a cycle in flight checks it to end early. */
  get stopped (): boolean {
    return this.#stopped
  }

  start (): void {
    if (!this.#stopped) return
    this.#stopped = false
    this.#schedule(0)
  }

  /** Schedules nothing more; resolves when the cycle in flight, if any, has ended. */
  async stop (): Promise<void> {
    this.#stopped = true
    clearTimeout(this.#timer)
    await this.#running
  }

  wake (): void {
    if (this.#stopped) return
    this.#wakeRetry = 0
    if (this.#running === undefined) this.#schedule(0)
  }

  /** Said by a cycle that found work: the wake-up did its job, so no quick second look is needed. */
  found (): void {
    this.#wakeRetry = WAKE_RETRIES_MS.length
  }

  #schedule (delayMs: number): void {
    clearTimeout(this.#timer)
    if (this.#stopped) return
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      this.#running = this.#cycle().finally(() => { this.#running = undefined; this.#next() })
    }, delayMs)
    this.#timer.unref()
  }

  #next (): void {
    if (this.#stopped) return
    if (this.#wakeRetry < WAKE_RETRIES_MS.length) {
      this.#schedule(WAKE_RETRIES_MS[this.#wakeRetry++]!)
      return
    }
    this.#schedule(this.#intervalMs)
  }
}
