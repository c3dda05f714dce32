import type { FastifyBaseLogger } from 'fastify'

/**
 * Work a request starts and does not wait for, run after its answer: what
 * must not change the answer's timing (without SMTP, recording what a
 * password-reset request would have come to). Each task is awaited on close,
 * so a stopping instance finishes what it accepted; a crash loses what had
 * not run, so nothing that must survive one belongs here: that goes to the
 * mail outbox (mail.outbox.ts, enqueueMailRequest).
 */
export class BackgroundTasks {
  private readonly running = new Set<Promise<void>>()
  private readonly log: FastifyBaseLogger

  constructor (log: FastifyBaseLogger) {
    this.log = log
  }

  /** Starts `task` on a later turn of the event loop, after the current answer is on its way. */
  run (name: string, task: () => Promise<void>): void {
    const done: Promise<void> = new Promise<void>(resolve => { setImmediate(resolve) })
      .then(task)
      .catch((err: unknown) => { this.log.error({ err, task: name }, 'a background task failed') })
      .finally(() => { this.running.delete(done) })
    this.running.add(done)
  }

  /** Resolves once every task started so far has finished. */
  async drain (): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running])
  }
}
