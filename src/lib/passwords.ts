import { scrypt, timingSafeEqual } from 'node:crypto'
import { hash, verify, type Options } from '@node-rs/argon2'

/** `Algorithm.Argon2id`; the package declares it as a const enum, which isolated modules cannot import. */
const ARGON2ID = 2 as NonNullable<Options['algorithm']>
import pLimit, { type LimitFunction } from 'p-limit'
import type { Config } from '../config.ts'
import { AppError } from '../errors.ts'
import { HashWorkers } from './hash-workers.ts'
import { inSpan } from './tracing.ts'

/** The scheme a stored hash names, for its span: never anything of the hash itself. */
function schemeOf (passwordHash: string): string {
  const match = /^\$(argon2id|argon2i|argon2d|2[abxy]?|scrypt)\$/.exec(passwordHash)
  return match === null ? 'unknown' : match[1]!.startsWith('2') ? 'bcrypt' : match[1]!
}

/**
 * argon2id hashing off the event loop, with a bound on how many run at once:
 * each hash holds ~19 MiB and a core for ~9 ms, so unbounded concurrency would
 * let a burst of requests exhaust memory and CPU. With HASH_NICE (by default
 * on Linux) on worker threads of lower priority (lib/hash-workers.ts);
 * with HASH_NICE=0, on libuv's thread pool.
 */
export class PasswordHasher {
  readonly #limit: LimitFunction
  readonly #queueLimit: number
  readonly #options: Options & { memoryCost: number, timeCost: number, parallelism: number }
  readonly #workers: HashWorkers | undefined

  constructor (config: Pick<Config, 'argon2MemoryKib' | 'argon2TimeCost' | 'argon2Parallelism' | 'hashConcurrency' | 'hashQueueLimit' | 'hashNice'>) {
    this.#limit = pLimit(config.hashConcurrency)
    this.#queueLimit = config.hashQueueLimit
    this.#workers = config.hashNice > 0 ? new HashWorkers(config.hashConcurrency, config.hashNice) : undefined
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

  /** How many hashes run at once; callers with many to do keep at most this many in flight. */
  get concurrency (): number {
    return this.#limit.concurrency
  }

  /** With HASH_NICE: whether the hashing threads run at that priority (Linux only); undefined without it. */
  async lowered (): Promise<boolean | undefined> {
    return await this.#workers?.niced()
  }

  async close (): Promise<void> {
    await this.#workers?.close()
  }

  /**
   * A hash made while the server starts (the dummy hash failed sign-ins are
   * checked against): on libuv's pool even with HASH_NICE, so the hash
   * workers start with the first sign-in or new password, not at start-up
   * (hash-workers.ts: ~10 MiB of idle RSS). Nothing else wants the CPU then.
   */
  async hashAtStartUp (password: string): Promise<string> {
    return await this.#run(async () => await hash(password, this.#options))
  }

  async hash (password: string): Promise<string> {
    // Traced with its wait for a free slot: the span is what the request spent on hashing.
    return await inSpan('password.hash', { attributes: { 'password.scheme': 'argon2id' } }, async () =>
      await this.#run(async () => this.#workers !== undefined ? await this.#workers.hash(password, this.#options) : await hash(password, this.#options)))
  }

  /**
   * False for a malformed hash as for a wrong password: a bad row must not become a 500 at sign-in.
   * Verifies argon2 (what this service writes) and the imported schemes, bcrypt and
   * scrypt (see checkImportedHash), all on libuv's thread pool. bcrypt and scrypt
   * hashes over the import bounds are refused unverified, however they got into the table.
   */
  async verify (passwordHash: string, password: string): Promise<boolean> {
    return await inSpan('password.verify', { attributes: { 'password.scheme': schemeOf(passwordHash) } }, async () => await this.#verify(passwordHash, password))
  }

  async #verify (passwordHash: string, password: string): Promise<boolean> {
    return await this.#run(async () => {
      try {
        if (passwordHash.startsWith('$argon2')) return this.#workers !== undefined ? await this.#workers.verify(passwordHash, password) : await verify(passwordHash, password)
        if (passwordHash.startsWith('$2')) {
          // bcrypt reads only the first 72 bytes; a longer password would match on its prefix alone.
          if (!checkImportedHash(passwordHash).ok || Buffer.byteLength(password, 'utf8') > BCRYPT_MAX_BYTES) return false
          // Only imported hashes are bcrypt; the native module loads with the first of them.
          const { verify: bcryptVerify } = await import('@node-rs/bcrypt')
          return await bcryptVerify(password, passwordHash)
        }
        if (passwordHash.startsWith('$scrypt$')) {
          const parsed = parseScrypt(passwordHash)
          if ('ok' in parsed) return false
          return timingSafeEqual(await scryptKey(password, parsed), parsed.hash)
        }
        return false
      } catch {
        return false
      }
    })
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

/**
 * The bounds on imported hashes (as Ory Kratos's hash_limits.go): an imported
 * hash carries its own cost parameters, and verifying it spends what they say,
 * so a hash with a 16 GiB argon2 memory or a bcrypt cost of 31 would be a way
 * to exhaust the server's memory or CPU at sign-in.
 */
export const IMPORT_HASH_LIMITS = {
  argon2MemoryKib: 1_048_576,
  argon2TimeCost: 10,
  argon2Parallelism: 16,
  bcryptMinCost: 4,
  bcryptMaxCost: 15,
  scryptMaxLogN: 17,
  scryptMaxR: 32,
  scryptMaxP: 16
} as const

const BCRYPT_MAX_BYTES = 72

export type ImportedHashScheme = 'argon2id' | 'argon2i' | 'argon2d' | 'bcrypt' | 'scrypt'

export type ImportedHashCheck =
  | { ok: true, scheme: ImportedHashScheme }
  | { ok: false, code: 'password_hash_unsupported' | 'password_hash_out_of_bounds', detail: string }

const ARGON2 = /^\$(argon2id|argon2i|argon2d)\$v=(\d{1,4})\$m=(\d{1,10}),t=(\d{1,10}),p=(\d{1,10})\$([A-Za-z0-9+/]{11,86})\$([A-Za-z0-9+/]{16,171})$/
const BCRYPT = /^\$2[aby]\$(\d{2})\$[./A-Za-z0-9]{53}$/
const SCRYPT = /^\$scrypt\$([a-z0-9=,]{1,64})\$([A-Za-z0-9+/.]{11,88}={0,2})\$([A-Za-z0-9+/.]{22,172}={0,2})$/

const ACCEPTED = 'a PHC string: $argon2id$/$argon2i$/$argon2d$ (v=19), bcrypt $2a$/$2b$/$2y$, or $scrypt$ln=<log2 N>,r=<r>,p=<p>$<salt>$<hash>'

function unsupported (detail: string): ImportedHashCheck {
  return { ok: false, code: 'password_hash_unsupported', detail }
}

function outOfBounds (detail: string): ImportedHashCheck {
  return { ok: false, code: 'password_hash_out_of_bounds', detail }
}

interface ScryptParams { logN: number, r: number, p: number, salt: Buffer, hash: Buffer }

/** `$scrypt$ln=<log2 N>,r=<r>,p=<p>$<salt>$<hash>` (passlib, RustCrypto, libpasta), base64 with or without padding. */
function parseScrypt (passwordHash: string): ScryptParams | ImportedHashCheck {
  const match = SCRYPT.exec(passwordHash)
  if (match === null) return unsupported(`not a scrypt PHC string; expected ${ACCEPTED}`)
  const params = new Map<string, number>()
  for (const pair of match[1]!.split(',')) {
    const [name, value, extra] = pair.split('=')
    if (name === undefined || value === undefined || extra !== undefined || !/^\d{1,10}$/.test(value) || params.has(name)) {
      return unsupported('the scrypt parameters must be ln=<log2 N>,r=<r>,p=<p>, each once')
    }
    params.set(name, Number(value))
  }
  const logN = params.get('ln')
  const r = params.get('r')
  const p = params.get('p')
  if (params.size !== 3 || logN === undefined || r === undefined || p === undefined) {
    return unsupported('the scrypt parameters must be ln=<log2 N>,r=<r>,p=<p>, each once')
  }
  if (logN < 1 || r < 1 || p < 1) return unsupported('the scrypt parameters must be at least 1')
  const salt = decodeB64(match[2]!)
  const hash = decodeB64(match[3]!)
  if (salt === undefined || hash === undefined || salt.length < 8 || hash.length < 16 || hash.length > 128) {
    return unsupported('the scrypt salt (at least 8 bytes) or hash (16 to 128 bytes) is not valid base64 of the right length')
  }
  const max = IMPORT_HASH_LIMITS
  if (logN > max.scryptMaxLogN || r > max.scryptMaxR || p > max.scryptMaxP) {
    return outOfBounds(`scrypt parameters over the import bounds (ln ≤ ${max.scryptMaxLogN}, i.e. N ≤ 2^${max.scryptMaxLogN}; r ≤ ${max.scryptMaxR}; p ≤ ${max.scryptMaxP}); ` +
      'note that ln is log2 of N (ln=14 for N=16384)')
  }
  return { logN, r, p, salt, hash }
}

/** Standard base64 (`.` taken for `+`, as passlib's variant writes it), padded or not. */
function decodeB64 (text: string): Buffer | undefined {
  const bare = text.replace(/=+$/, '').replace(/\./g, '+')
  if (bare.length % 4 === 1 || text.length - bare.length > 2) return undefined
  return Buffer.from(bare, 'base64')
}

async function scryptKey (password: string, params: ScryptParams): Promise<Buffer> {
  const N = 2 ** params.logN
  // Node refuses more than 32 MiB by default; the bounds cap this at 512 MiB (N = 2^17, r = 32).
  const maxmem = 128 * params.r * (N + params.p + 2) + 1024 * 1024
  return await new Promise<Buffer>((resolve, reject) => {
    scrypt(password, params.salt, params.hash.length, { N, r: params.r, p: params.p, maxmem }, (error, key) => {
      if (error !== null) reject(error)
      else resolve(key)
    })
  })
}

/**
 * Whether an imported hash is one this service can verify, with parameters
 * inside IMPORT_HASH_LIMITS. Only parses: no hashing, so a batch of hostile
 * hashes costs nothing.
 */
export function checkImportedHash (passwordHash: string): ImportedHashCheck {
  const max = IMPORT_HASH_LIMITS
  if (passwordHash.startsWith('$argon2')) {
    const match = ARGON2.exec(passwordHash)
    if (match === null) return unsupported('not an argon2 PHC string; expected $argon2id$v=19$m=<KiB>,t=<passes>,p=<lanes>$<salt>$<hash>')
    const [, scheme, v, m, t, p] = match
    if (v !== '19') return unsupported('only argon2 version 19 (v=19) is accepted')
    const [memory, time, lanes] = [Number(m), Number(t), Number(p)]
    if (time < 1 || lanes < 1 || memory < 8 * lanes) return unsupported('the argon2 parameters are not valid (t ≥ 1, p ≥ 1, m ≥ 8·p)')
    if (memory > max.argon2MemoryKib || time > max.argon2TimeCost || lanes > max.argon2Parallelism) {
      return outOfBounds(`argon2 parameters over the import bounds (m ≤ ${max.argon2MemoryKib} KiB, t ≤ ${max.argon2TimeCost}, p ≤ ${max.argon2Parallelism})`)
    }
    return { ok: true, scheme: scheme as ImportedHashScheme }
  }
  if (passwordHash.startsWith('$2')) {
    const match = BCRYPT.exec(passwordHash)
    if (match === null) return unsupported('not a bcrypt hash; expected $2a$, $2b$ or $2y$, a two-digit cost and 53 characters')
    const cost = Number(match[1])
    if (cost < max.bcryptMinCost) return unsupported(`the bcrypt cost must be at least ${max.bcryptMinCost}`)
    if (cost > max.bcryptMaxCost) return outOfBounds(`the bcrypt cost is over the import bound (${max.bcryptMaxCost})`)
    return { ok: true, scheme: 'bcrypt' }
  }
  if (passwordHash.startsWith('$scrypt$')) {
    const parsed = parseScrypt(passwordHash)
    return 'ok' in parsed ? parsed : { ok: true, scheme: 'scrypt' }
  }
  return unsupported(`unknown hash format; expected ${ACCEPTED}`)
}

declare module 'fastify' {
  interface FastifyInstance {
    passwords: PasswordHasher
  }
}
