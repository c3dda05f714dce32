import { hash, verify, type Options } from '@node-rs/argon2'

/** `Algorithm.Argon2id`; the package declares it as a const enum, which isolated modules cannot import. */
const ARGON2ID = 2 as NonNullable<Options['algorithm']>
import pLimit, { type LimitFunction } from 'p-limit'
import type { Config } from '../config.ts'
import { AppError } from '../errors.ts'

/**
 * argon2id hashing on libuv's thread pool, never on the event loop, with a
 * bound on how many run at once: each hash holds ~19 MiB and a core for ~9 ms,
 * so unbounded concurrency would let a burst of requests exhaust memory and CPU.
 */
export class PasswordHasher {
  readonly #limit: LimitFunction
  readonly #queueLimit: number
  readonly #options: Options & { memoryCost: number, timeCost: number, parallelism: number }

  constructor (config: Pick<Config, 'argon2MemoryKib' | 'argon2TimeCost' | 'argon2Parallelism' | 'hashConcurrency' | 'hashQueueLimit'>) {
    this.#limit = pLimit(config.hashConcurrency)
    this.#queueLimit = config.hashQueueLimit
    this.#options = {
      algorithm: ARGON2ID,
      memoryCost: config.argon2MemoryKib,
      timeCost: config.argon2TimeCost,
      parallelism: config.argon2Parallelism
    }
  }

  /** Hashes waiting for a slot, for the metrics endpoint. */
  get pendingCount (): number {
    return this.#limit.pendingCount
  }

  async hash (password: string): Promise<string> {
    return await this.#run(async () => await hash(password, this.#options))
  }

  /** False for a malformed hash as for a wrong password: a bad row must not become a 500 at sign-in. */
  async verify (passwordHash: string, password: string): Promise<boolean> {
    return await this.#run(async () => await verify(passwordHash, password).catch(() => false))
  }

  /** True when the stored hash is weaker than what this deployment now writes. */
  needsRehash (passwordHash: string): boolean {
    const match = /^\$argon2id\$v=19\$m=(\d+),t=(\d+),p=(\d+)\$/.exec(passwordHash)
    if (match === null) return true
    const [, m, t, p] = match.map(Number)
    return m! < this.#options.memoryCost || t! < this.#options.timeCost || p! < this.#options.parallelism
  }

  async #run<T> (task: () => Promise<T>): Promise<T> {
    // Refuse only when every slot is busy and the queue is full; an idle hasher always takes work.
    if (this.#limit.activeCount >= this.#limit.concurrency && this.#limit.pendingCount >= this.#queueLimit) {
      throw new AppError('server_busy', 503, 'Too many password operations are queued; try again shortly.', { headers: { 'Retry-After': '1' } })
    }
    return await this.#limit(task)
  }
}
