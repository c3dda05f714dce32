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
 * itself: the WAL never grows without bound.
 */

/** SQLite's own threshold: 1,000 pages of 4 KiB. */
const WAL_BYTES = 4 * 1024 * 1024
/** How often the WAL's size is looked at (an async stat, off the event loop). */
const LOOK_INTERVAL_MS = 250
const AUTOCHECKPOINT_PAGES = 1000

/** CommonJS, evaluated in the worker; it loads the same better-sqlite3 as the server. */
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads')
const Sqlite = require(workerData.module)
const db = new Sqlite(workerData.file, { timeout: workerData.busyTimeoutMs })
parentPort.on('message', message => {
  if (message === 'close') {
    db.close()
    parentPort.close()
    return
  }
  try {
    db.pragma('wal_checkpoint(PASSIVE)')
    parentPort.postMessage({ ok: true })
  } catch (error) {
    parentPort.postMessage({ ok: false, message: String(error && error.message) })
  }
})
`

interface Pragmatic { pragma: (source: string) => unknown }

export interface Checkpointer {
  /** Checkpoints done by the worker so far. */
  readonly count: number
  /** True once the worker failed and the connection checkpoints for itself again. */
  readonly fellBack: boolean
  stop: () => void
}

/**
 * Takes the checkpoints of `connection` (a WAL-mode database in `file`) off the
 * thread that runs it. `walBytes` is for the tests.
 */
export function checkpointInBackground (connection: Pragmatic, file: string, busyTimeoutMs: number, walBytes = WAL_BYTES): Checkpointer {
  const path = resolvePath(file)
  let worker: Worker | undefined
  let running = false
  let stopped = false
  let fellBack = false
  let count = 0
  let lastWrittenMs = 0

  const fallBack = (reason: string): void => {
    if (fellBack || stopped) return
    fellBack = true
    clearInterval(timer)
    worker?.removeAllListeners()
    worker?.terminate().catch(() => {})
    worker = undefined
    connection.pragma(`wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`)
    process.emitWarning(`SQLite checkpoints are back on the event loop: ${reason}`)
  }

  const startWorker = (): Worker => {
    const started = new Worker(WORKER_SOURCE, { eval: true, workerData: { module: BETTER_SQLITE3_PATH, file: path, busyTimeoutMs } })
    started.unref()
    started.on('error', error => fallBack(error.message))
    started.on('exit', code => { if (!stopped) fallBack(`the checkpoint thread exited (${code})`) })
    return started
  }

  const checkpoint = async (thread: Worker): Promise<void> => {
    const answer = await new Promise<{ ok: boolean, message?: string }>(resolve => {
      thread.once('message', resolve)
      thread.postMessage('checkpoint')
    })
    if (!answer.ok) fallBack(answer.message ?? 'unknown error')
    else count++
  }

  const look = async (): Promise<void> => {
    if (running || stopped || fellBack) return
    running = true
    try {
      const wal = await stat(`${path}-wal`).catch(() => undefined)
      // Nothing written since the last checkpoint, or not yet worth one.
      if (wal === undefined || wal.size < walBytes || wal.mtimeMs === lastWrittenMs || stopped) return
      lastWrittenMs = wal.mtimeMs
      worker ??= startWorker()
      await checkpoint(worker)
    } catch (error) {
      fallBack((error as Error).message)
    } finally {
      running = false
    }
  }

  connection.pragma('wal_autocheckpoint = 0')
  // look() never rejects: it falls back instead.
  const timer = setInterval(() => { look().catch(() => {}) }, LOOK_INTERVAL_MS).unref()

  return {
    get count () { return count },
    get fellBack () { return fellBack },
    stop: () => {
      stopped = true
      clearInterval(timer)
      if (worker !== undefined) {
        worker.removeAllListeners()
        // The worker closes its connection and ends by itself; nothing waits for it.
        worker.on('error', () => {})
        worker.postMessage('close')
      }
    }
  }
}
