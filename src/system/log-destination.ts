import { write as writeAsync } from 'node:fs'
import sonicBoom from 'sonic-boom'

// A CommonJS package: its class is the module itself, also named SonicBoom on it.
const { SonicBoom } = sonicBoom
type SonicBoom = InstanceType<typeof SonicBoom>

export interface LogDestinationOptions {
  /** The file descriptor the lines go to (1, stdout, in production). */
  fd: number
  /** Where the one line saying the destination broke goes (2, stderr); written asynchronously, errors ignored. */
  noticeFd?: number
  /** Bytes gathered before a write. */
  minLength?: number
  /** At most this late, in ms, a line is written. */
  periodicFlush?: number
  /** Bytes held while the reader does not keep up; lines beyond are dropped and counted. */
  maxBuffered?: number
}

/**
 * Has Node.js open stdout or stderr as its own stream. For a pipe that puts
 * the descriptor in non-blocking mode, so a write to a pipe whose reader is
 * alive but no longer reading fails at once with EAGAIN (retried on a timer)
 * instead of parking a thread-pool thread in write(2) until the reader reads:
 * a parked thread also kept the process from exiting, as exit waits for the
 * thread pool. Their own write errors are ours to count, not a crash.
 */
function openedByNode (fd: number | undefined): void {
  // Once per stream: every app a process builds (tests build hundreds) would otherwise add a listener.
  const stream = fd === 1 ? process.stdout : fd === 2 ? process.stderr : undefined
  if (stream !== undefined && !quieted.has(stream)) {
    quieted.add(stream)
    stream.on('error', () => {})
  }
}
const quieted = new WeakSet<NodeJS.WriteStream>()

/**
 * Where the production logger writes. Lines are gathered and written a few
 * KiB at a time, off the request's path, by SonicBoom; what SonicBoom does
 * when the reader is gone is not left to it:
 *
 * - a write that fails for any reason other than a full pipe (EPIPE when the
 *   reader exited, EBADF, EIO, ENOSPC) breaks the destination: the lines still
 *   buffered and every later line are dropped and counted, never written again;
 * - a full pipe (EAGAIN) is retried on a timer, never in a loop, and holds at
 *   most `maxBuffered` bytes; lines beyond are dropped and counted;
 * - nothing is ever written synchronously. SonicBoom's flushSync, which
 *   pino.destination registers for process exit, retries every failed write
 *   forever with a sleep between: with the reader gone the process never
 *   exited, and its event loop, the shutdown timer included, never ran again.
 *   This destination is not registered for exit, and `flushWithin` bounds the
 *   last flush in time.
 */
export class LogDestination {
  readonly #sonic: SonicBoom
  readonly #noticeFd: number | undefined
  /** Byte lengths of the lines handed to SonicBoom and not yet written in full, oldest first from #head. */
  #pending: number[] = []
  #head = 0
  /** Bytes of the oldest pending line already written. */
  #headWritten = 0
  #dropped = 0
  #broken: NodeJS.ErrnoException | undefined

  /**
   * Each write goes through libuv's thread pool, waking a thread and then the
   * event loop: at 4 KiB a write, the request log cost the uncached users page
   * 6% more CPU per request than at 32 KiB (median of eight interleaved rounds;
   * bench/README.md before 2 December 2026 (git history), "Issue 20: the floor, the log line and the rate limits").
   * A busy server's lines are then some 10 ms later, an idle one's at most
   * periodicFlush as before.
   */
  constructor ({ fd, noticeFd, minLength = 32 * 1024, periodicFlush = 250, maxBuffered = 4 * 1024 * 1024 }: LogDestinationOptions) {
    for (const used of [fd, noticeFd]) openedByNode(used)
    this.#noticeFd = noticeFd
    // SonicBoom refuses a minLength at or above the most it writes at once (16 KiB by default). Lines go in as
    // bytes: in its text mode it measures the whole gathered text again for every line (Buffer.byteLength of a
    // string of up to maxWrite), and with 64 KiB that made the cache hit cost 4% more than before; as bytes, a
    // line costs only its own encoding (same section: the hit 0.906, the uncached page 0.965 of before).
    this.#sonic = new SonicBoom({ fd, sync: false, minLength, maxWrite: 2 * minLength, periodicFlush, maxLength: maxBuffered, contentMode: 'buffer' })
    this.#sonic.on('write', (bytes: number) => { this.#written(bytes) })
    // Emitted from inside write() when the line would take the buffer past maxBuffered: that line is not kept.
    this.#sonic.on('drop', () => {
      this.#pending.pop()
      this.#dropped++
    })
    this.#sonic.on('error', (error: NodeJS.ErrnoException) => { this.#break(error) })
  }

  /** Lines dropped so far: buffered when the reader went away, written after that, or beyond the buffer's bound. */
  get droppedLines (): number {
    return this.#dropped
  }

  /** Why the destination stopped writing, once it has. */
  get brokenBy (): string | undefined {
    return this.#broken === undefined ? undefined : (this.#broken.code ?? this.#broken.message)
  }

  /** Lines handed over and not yet written in full. */
  get pendingLines (): number {
    return this.#pending.length - this.#head
  }

  /** pino's stream interface: one call per log line. */
  write (line: string): boolean {
    if (this.#broken !== undefined) {
      this.#dropped++
      return true
    }
    const bytes = Buffer.from(line, 'utf8')
    this.#pending.push(bytes.length)
    // SonicBoom's types know only its text mode; in buffer mode write() takes bytes.
    return this.#sonic.write(bytes as unknown as string)
  }

  /**
   * Writes what is buffered, giving up after `ms`; what is left then is
   * counted as dropped. Never throws and never blocks the event loop.
   */
  async flushWithin (ms: number): Promise<void> {
    const deadline = Date.now() + ms
    let timer: NodeJS.Timeout | undefined
    const late = new Promise<void>(resolve => { timer = setTimeout(resolve, ms) })
    try {
      // SonicBoom's flush calls back once what is left fits minLength, not when it is all written: go on until nothing is left.
      while (this.#broken === undefined && this.pendingLines > 0 && Date.now() < deadline) {
        // Called back on error too (the destination is then broken), and not at all while a full pipe is retried.
        const flushed = new Promise<void>(resolve => { this.#sonic.flush(() => { resolve() }) })
        await Promise.race([flushed, late])
      }
    } finally {
      clearTimeout(timer)
    }
    if (this.#broken === undefined && this.pendingLines > 0) {
      this.#dropped += this.pendingLines
      this.#pending = []
      this.#head = 0
      this.#headWritten = 0
    }
  }

  #written (bytes: number): void {
    let left = this.#headWritten + bytes
    while (this.#head < this.#pending.length && left >= this.#pending[this.#head]!) {
      left -= this.#pending[this.#head]!
      this.#head++
    }
    this.#headWritten = left
    if (this.#head > 1024 && this.#head * 2 > this.#pending.length) {
      this.#pending = this.#pending.slice(this.#head)
      this.#head = 0
    }
  }

  #break (error: NodeJS.ErrnoException): void {
    if (this.#broken !== undefined) return
    this.#broken = error
    this.#dropped += this.pendingLines
    this.#pending = []
    this.#head = 0
    this.#headWritten = 0
    // Stops the periodic flush and drops SonicBoom's buffer; fds 1 and 2 are left open.
    try { this.#sonic.destroy() } catch {}
    if (this.#noticeFd !== undefined) {
      const notice = `gatehouse: log lines can no longer be written (${this.brokenBy ?? 'error'}); they are dropped and counted in gatehouse_log_lines_dropped_total\n`
      // Asynchronous: a notice must not be what holds the event loop either.
      writeAsync(this.#noticeFd, notice, () => {})
    }
  }
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The production logger's destination; undefined when the app was given its own stream. */
    stdoutLog: LogDestination | undefined
  }
}
