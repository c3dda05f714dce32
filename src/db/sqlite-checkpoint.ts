import { statSync } from 'node:fs'
import { stat } from 'node:fs/promises'
import { resolve as resolvePath } from 'node:path'
import { Worker } from 'node:worker_threads'
import { BETTER_SQLITE3_PATH } from './sqlite-binding.ts'

/*
 * SQLite's WAL checkpoints, on a thread of their own.
 *
 * By default the connection that commits checkpoints the WAL itself once it
 * holds 1,000 pages: it copies them into the database file and fsyncs both,
 * inside that commit, on the event loop. A sign-in adds about three pages
 * to the WAL (12.5 KB measured on a fresh file: the user, the session, the
 * sign-in address, the event and their indexes), so during a sign-in storm
 * about every 330th sign-in stopped the event loop for the whole checkpoint,
 * and every request waiting (the reverse proxy's /verify above all) waited
 * with it. Measured with better-sqlite3 alone on the 2-core
 * VM (3,000 transactions of 4 indexed inserts, load 5): autocheckpoint on,
 * p99 9.6 ms and max 16.7 ms per commit, 1,270 ms in all; off, p99 2.4 ms and
 * max 6.4 ms, 789 ms in all. The figures for the server are in bench/README.md
 * (issue 20, `npm run bench:storm`).
 *
 * So the server's connection never checkpoints (wal_autocheckpoint=0), and a
 * worker thread with a connection of its own runs PASSIVE checkpoints, which
 * wait for no reader or writer. It starts only once the WAL has grown past
 * WAL_BYTES (an idle or read-mostly server never pays for a thread), and
 * checkpoints whenever the WAL is that big and was written to since the last
 * look. Should the worker fail, the connection goes back to checkpointing for
 * itself.
 *
 * PASSIVE checkpoints alone do not bound the WAL. SQLite starts the WAL over
 * only when a write transaction begins after a checkpoint copied all of it
 * and no reader still uses it; under writes that never pause (issue 38: a
 * 300,000-user import, 1,000 a request, two requests in flight) each
 * checkpoint ended with new pages behind it, and the WAL grew to 8.46 GB
 * beside a 1.06 GB database. So once the WAL has passed its limit
 * (SQLITE_WAL_LIMIT_MIB, 64 MiB), the next statement or transaction waits
 * while the worker runs a TRUNCATE checkpoint, which copies the rest and
 * empties the file: the WAL stays under the limit plus what one transaction
 * writes (an import's batch of 1,000: 20 to 45 MiB), under twice the limit
 * for the import above (peak 69 MiB, bench/README.md). The event loop keeps
 * running meanwhile; statements wait for the reset as for a transaction. A
 * reader in another process that holds an old snapshot (a backup) keeps the
 * WAL from being emptied: then it grows while that reader lasts, a warning
 * says so, and the reset is tried again every second.
 */

/** SQLite's own threshold: 1,000 pages of 4 KiB. */
const WAL_BYTES = 4 * 1024 * 1024
/** How often the WAL's size is looked at (an async stat, off the event loop). */
const LOOK_INTERVAL_MS = 250
const AUTOCHECKPOINT_PAGES = 1000
/**
 * How often, at most, the connection's user looks at the WAL's size before a
 * statement (a synchronous stat, about 4 µs): during an import that writes
 * 200 MB of WAL a second, a reset comes at most 0.4 MB late.
 */
const BEFORE_USE_INTERVAL_MS = 2
/**
 * How long a reset waits for another process's reader or writer. The
 * server's own statements wait for the reset, so it must not wait long.
 */
const RESET_WAIT_MS = 200
/** After a reset that could not be made, how long until the next try. */
const RESET_RETRY_MS = 1000

/** CommonJS, evaluated in the worker; it loads the same better-sqlite3 as the server. */
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads')
const Sqlite = require(workerData.module)
const db = new Sqlite(workerData.file, { timeout: workerData.busyTimeoutMs })
parentPort.on('message', message => {
  if (message.mode === 'close') {
    db.close()
    parentPort.close()
    return
  }
  try {
    const [row] = db.pragma('wal_checkpoint(' + (message.mode === 'TRUNCATE' ? 'TRUNCATE' : 'PASSIVE') + ')')
    parentPort.postMessage({ id: message.id, ok: true, busy: row.busy !== 0 })
  } catch (error) {
    parentPort.postMessage({ id: message.id, ok: false, busy: true, message: String(error && error.message) })
  }
})
`

interface Pragmatic { pragma: (source: string) => unknown }

interface Answer { ok: boolean, busy: boolean, message?: string }

export interface CheckpointOptions {
  /** The WAL size from which the worker checkpoints; 4 MiB, or the limit if that is smaller. */
  walBytes?: number
  /** The WAL size past which the next statement waits for the WAL to be emptied. */
  limitBytes: number
}

export interface Checkpointer {
  /** Checkpoints done by the worker so far, resets included. */
  readonly count: number
  /** Times the WAL was emptied because it had passed the limit. */
  readonly resets: number
  /** True while the WAL is being emptied: the connection must not write until it is done. */
  readonly resetting: boolean
  /** True once the worker failed and the connection checkpoints for itself again. */
  readonly fellBack: boolean
  /**
   * To be called with the connection held and no transaction open on it,
   * before a statement or a transaction: when the WAL has passed the limit,
   * answers a promise that settles (never rejects) once the WAL has been
   * emptied or could not be. Undefined when there is nothing to wait for.
   */
  beforeUse: () => Promise<void> | undefined
  stop: () => void
}

const mib = (bytes: number): string => (bytes / 1024 / 1024).toFixed(1)

/**
 * Takes the checkpoints of `connection` (a WAL-mode database in `file`) off the
 * thread that runs it, and keeps its WAL near `limitBytes`.
 */
export function checkpointInBackground (connection: Pragmatic, file: string, busyTimeoutMs: number, options: CheckpointOptions): Checkpointer {
  const path = resolvePath(file)
  const walPath = `${path}-wal`
  const limitBytes = options.limitBytes
  const walBytes = options.walBytes ?? Math.min(WAL_BYTES, limitBytes)
  let worker: Worker | undefined
  let running = false
  let stopped = false
  let fellBack = false
  let resetting = false
  let warned = false
  let count = 0
  let resets = 0
  let lastWrittenMs = 0
  let lastLookedMs = -Infinity
  let retryAtMs = -Infinity
  let nextId = 0
  const pending = new Map<number, (answer: Answer) => void>()

  const answerAll = (answer: Answer): void => {
    for (const resolve of pending.values()) resolve(answer)
    pending.clear()
  }

  const fallBack = (reason: string): void => {
    if (fellBack || stopped) return
    fellBack = true
    clearInterval(timer)
    worker?.removeAllListeners()
    worker?.terminate().catch(() => {})
    worker = undefined
    answerAll({ ok: false, busy: true, message: reason })
    connection.pragma(`wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`)
    process.emitWarning(`SQLite checkpoints are back on the event loop: ${reason}`)
  }

  const startWorker = (): Worker => {
    // Resets wait for other processes' readers and writers (PASSIVE checkpoints never wait): not for long.
    const timeout = busyTimeoutMs < 0 ? busyTimeoutMs : Math.min(busyTimeoutMs, RESET_WAIT_MS)
    const started = new Worker(WORKER_SOURCE, { eval: true, workerData: { module: BETTER_SQLITE3_PATH, file: path, busyTimeoutMs: timeout } })
    started.unref()
    started.on('error', error => fallBack(error.message))
    started.on('exit', code => { if (!stopped) fallBack(`the checkpoint thread exited (${code})`) })
    started.on('message', (answer: Answer & { id: number }) => {
      const resolve = pending.get(answer.id)
      pending.delete(answer.id)
      resolve?.(answer)
    })
    return started
  }

  /** The worker answers its messages one at a time, in order: a reset asked for during a PASSIVE checkpoint runs after it. */
  const ask = async (mode: 'PASSIVE' | 'TRUNCATE'): Promise<Answer> => {
    worker ??= startWorker()
    const id = nextId++
    const answer = new Promise<Answer>(resolve => { pending.set(id, resolve) })
    worker.postMessage({ id, mode })
    return await answer
  }

  const look = async (): Promise<void> => {
    if (running || stopped || fellBack) return
    running = true
    try {
      const wal = await stat(walPath).catch(() => undefined)
      // Nothing written since the last checkpoint, or not yet worth one.
      if (wal === undefined || wal.size < walBytes || wal.mtimeMs === lastWrittenMs || stopped) return
      lastWrittenMs = wal.mtimeMs
      const answer = await ask('PASSIVE')
      if (!answer.ok) fallBack(answer.message ?? 'unknown error')
      else count++
    } catch (error) {
      fallBack((error as Error).message)
    } finally {
      running = false
    }
  }

  /*
   * A TRUNCATE checkpoint copies what is left of the WAL into the database
   * and empties the file. It takes the write lock, so it runs only while the
   * connection's user holds the connection outside a transaction (a
   * transaction that had read and then found the write lock taken would fail
   * with SQLITE_BUSY at once, SQLite's busy handler being only for the first
   * lock a transaction takes). It waits for no reader of this process: the
   * connection's reads run synchronously, on its own thread.
   */
  const reset = async (sizeBytes: number): Promise<void> => {
    resetting = true
    try {
      const answer = await ask('TRUNCATE')
      if (stopped) return
      if (!answer.ok) {
        fallBack(answer.message ?? 'unknown error')
      } else if (answer.busy) {
        retryAtMs = performance.now() + RESET_RETRY_MS
        if (!warned) {
          warned = true
          process.emitWarning(`The SQLite WAL (${walPath}) is ${mib(sizeBytes)} MiB, past its limit of ${mib(limitBytes)} MiB, and could not be emptied: ` +
            'another process is reading from it or writing to it. It keeps growing until that ends; tried again every second.')
        }
      } else {
        count++
        resets++
        warned = false
      }
    } finally {
      resetting = false
    }
  }

  const beforeUse = (): Promise<void> | undefined => {
    if (stopped || fellBack) return undefined
    const now = performance.now()
    if (now - lastLookedMs < BEFORE_USE_INTERVAL_MS || now < retryAtMs) return undefined
    lastLookedMs = now
    const size = statSync(walPath, { throwIfNoEntry: false })?.size ?? 0
    return size < limitBytes ? undefined : reset(size)
  }

  connection.pragma('wal_autocheckpoint = 0')
  // look() never rejects: it falls back instead.
  const timer = setInterval(() => { look().catch(() => {}) }, LOOK_INTERVAL_MS).unref()

  return {
    get count () { return count },
    get resets () { return resets },
    get resetting () { return resetting },
    get fellBack () { return fellBack },
    beforeUse,
    stop: () => {
      stopped = true
      clearInterval(timer)
      answerAll({ ok: true, busy: true })
      if (worker !== undefined) {
        worker.removeAllListeners()
        // The worker closes its connection and ends by itself; nothing waits for it.
        worker.on('error', () => {})
        worker.postMessage({ mode: 'close' })
      }
    }
  }
}
