import { createRequire } from 'node:module'
import { Worker } from 'node:worker_threads'
import type { Options } from '@node-rs/argon2'

/**
 * argon2id on worker threads of their own, each lowered to HASH_NICE with
 * `os.setPriority` on its thread id (Linux: `/proc/thread-self`), instead of
 * on libuv's thread pool at the event loop's priority.
 *
 * Why: a hash woken on the pool preempts the event loop on its core (the
 * scheduler favours the thread that has slept), and then shares the core
 * with it for ~10 ms. Measured (`npx tsx bench/hash-wakeup.ts`, Node 20,
 * 2-core VM, load 7 to 9), per call, the synchronous part only: argon2's
 * `verify()` 0.13 to 0.14 ms on the CPU and 0.7 to 1.4 ms waiting in the run
 * queue, the CPU lost in 40 to 54% of the calls; a `crypto.pbkdf2` of about a
 * hash's length 0.13 to 0.16 ms and 0.5 to 0.85 ms; one of no work 0.01 to
 * 0.02 ms and ~0. So a profile's time "in" `verify()` is mostly the event
 * loop off the CPU after waking a busy pool thread, not argon2's work. At a lower priority the hash takes what the event loop
 * leaves: the gate (/verify) keeps its throughput during a sign-in storm,
 * and sign-ins slow down whenever the event loop wants the CPU. On by
 * default on Linux (HASH_NICE=19; 0 turns it off): a flood of sign-ins must
 * not starve the gate (docs/security.md; the figures are in bench/README.md,
 * "Issue 20: the storm, fourth pass").
 */

/** Runs in each worker: the synchronous hash, on the worker's own (lowered) thread. */
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads')
const { readlinkSync } = require('node:fs')
const { setPriority } = require('node:os')
const argon2 = require(workerData.argon2)
let niced = false
try {
  // Linux: the thread's own id; os.setPriority on it changes this thread only.
  const tid = Number(readlinkSync('/proc/thread-self').split('/').pop())
  setPriority(tid, workerData.nice)
  niced = true
} catch {}
parentPort.postMessage({ ready: true, niced })
parentPort.on('message', (task) => {
  try {
    const result = task.op === 'hash' ? argon2.hashSync(task.password, task.options) : argon2.verifySync(task.hash, task.password)
    parentPort.postMessage({ result })
  } catch (error) {
    parentPort.postMessage({ error: error instanceof Error ? error.message : String(error) })
  }
})
`

interface Pending { resolve: (value: string | boolean) => void, reject: (error: Error) => void }

interface HashWorker { worker: Worker, task: Pending | undefined }

/**
 * A fixed set of `size` workers, one task each at a time. The caller bounds
 * the tasks in flight to `size` (PasswordHasher's limit), so a task always
 * finds an idle worker; one that does not waits for the next to finish. A
 * worker that stops (it ran out of memory, say) fails its task and is
 * replaced, so the slot is not lost.
 */
export class HashWorkers {
  readonly #slots: HashWorker[] = []
  readonly #waiting: Array<() => void> = []
  #ready: Promise<boolean> | undefined
  readonly #size: number
  readonly #argon2 = createRequire(import.meta.url).resolve('@node-rs/argon2')
  readonly #nice: number
  #closed = false

  constructor (size: number, nice: number) {
    this.#size = size
    this.#nice = nice
  }

  /**
   * The workers start with the first hash, not with the server: each holds a
   * V8 isolate of its own, ~10 MiB of resident memory (idle RSS right after
   * start, SQLite, HASH_NICE=19, 3 interleaved starts: 109.1 to 109.7 MiB
   * started eagerly, 99.2 to 99.5 without workers; the command is in
   * bench/README.md before 2 December 2026 (git history), "Issue 20: the storm, fourth pass"), and the idle
   * server is guarded under 100 MiB.
   */
  #start (): Promise<boolean> {
    if (this.#ready === undefined) {
      const readies: Array<Promise<boolean>> = []
      for (let i = 0; i < this.#size; i++) readies.push(this.#spawn(i))
      this.#ready = Promise.all(readies).then(niced => niced.every(Boolean))
      this.#ready.catch(() => {})
    }
    return this.#ready
  }

  /** Starts the worker of slot `index`; resolves with whether its thread took the lower priority. */
  #spawn (index: number): Promise<boolean> {
    const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { argon2: this.#argon2, nice: this.#nice }, name: `gatehouse-hash-${index}` })
    // Idle workers must not keep a process (a test, the CLI) alive; #run refs a worker while it hashes.
    worker.unref()
    const slot: HashWorker = { worker, task: undefined }
    this.#slots[index] = slot
    const ready = new Promise<boolean>((resolve, reject) => {
      worker.once('message', (message: { niced: boolean }) => { resolve(message.niced) })
      worker.once('error', reject)
    })
    worker.on('message', (message: { ready?: true, result?: string | boolean, error?: string }) => {
      if (message.ready === true) return
      const task = slot.task
      slot.task = undefined
      worker.unref()
      this.#waiting.shift()?.()
      if (message.error !== undefined) task?.reject(new Error(message.error))
      else task?.resolve(message.result!)
    })
    worker.on('error', () => {})
    worker.on('exit', () => {
      const task = slot.task
      slot.task = undefined
      task?.reject(new Error('a hash worker stopped'))
      if (this.#closed) return
      this.#spawn(index).catch(() => {})
      this.#waiting.shift()?.()
    })
    return ready
  }

  /** Whether every worker's thread took the lower priority (false off Linux). */
  async niced (): Promise<boolean> {
    return await this.#start()
  }

  async hash (password: string, options: Options): Promise<string> {
    return await this.#run({ op: 'hash', password, options }) as string
  }

  async verify (hash: string, password: string): Promise<boolean> {
    return await this.#run({ op: 'verify', hash, password }) as boolean
  }

  async #run (task: Record<string, unknown>): Promise<string | boolean> {
    if (this.#ready === undefined) this.#start().catch(() => {})
    let slot = this.#slots.find(w => w.task === undefined)
    while (slot === undefined) {
      await new Promise<void>(resolve => this.#waiting.push(resolve))
      slot = this.#slots.find(w => w.task === undefined)
    }
    if (this.#closed) throw new Error('the hash workers are closed')
    const chosen = slot
    const done = new Promise<string | boolean>((resolve, reject) => { chosen.task = { resolve, reject } })
    chosen.worker.ref()
    chosen.worker.postMessage(task)
    return await done
  }

  async close (): Promise<void> {
    this.#closed = true
    await Promise.all(this.#slots.map(async w => await w.worker.terminate()))
  }
}
