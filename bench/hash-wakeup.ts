/**
 * What queueing a password hash costs the event loop (issue 20): a CPU
 * profile of the server during sign-ins put up to half of the main thread's
 * wall time inside @node-rs/argon2's `verify()`, the call that only queues the
 * hash on libuv's thread pool. Is that work on the main thread, or time off
 * the CPU?
 *
 * For each kind of call, N times: the calling thread's on-CPU time and its
 * time waiting in the run queue across the synchronous part of the call
 * alone (`/proc/thread-self/schedstat`, Linux, nanoseconds), and how many
 * calls lost the CPU right there. A pool task of about no work
 * (`pbkdf2`, 1 iteration) and one of about a hash's length (100,000
 * iterations) tell the argon2-specific part from the wake-up of any busy
 * pool thread.
 *
 *   npx tsx bench/hash-wakeup.ts [N]
 */
import { pbkdf2 } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { hash, verify } from '@node-rs/argon2'
import { defaultConfig } from '../src/config.ts'

const config = defaultConfig()
const options = { memoryCost: config.argon2MemoryKib, timeCost: config.argon2TimeCost, parallelism: config.argon2Parallelism, algorithm: 2 as const }
const N = Number(process.argv[2] ?? 200)

/** [on-CPU ns, run-queue wait ns, time slices] of the calling thread. */
function schedstat (): number[] {
  return readFileSync('/proc/thread-self/schedstat', 'utf8').trim().split(' ').map(Number)
}

async function measure (name: string, call: () => Promise<unknown>, count = N): Promise<void> {
  let onCpuNs = 0
  let waitNs = 0
  let lost = 0
  for (let i = 0; i < count; i++) {
    const before = schedstat()
    const pending = call()
    const after = schedstat()
    onCpuNs += after[0]! - before[0]!
    waitNs += after[1]! - before[1]!
    if (after[1]! > before[1]!) lost++
    await pending
  }
  process.stdout.write(`${name.padEnd(40)} on CPU ${(onCpuNs / count / 1000).toFixed(1).padStart(7)} µs  run queue ${(waitNs / count / 1000).toFixed(1).padStart(8)} µs  lost the CPU in ${lost} of ${count} calls\n`)
}

const pbkdf2Task = (iterations: number) => async (): Promise<void> => {
  await new Promise<void>((resolve, reject) => { pbkdf2('password', 'salt', iterations, 32, 'sha256', error => { if (error !== null) reject(error); else resolve() }) })
}

const stored = await hash('correct horse battery staple', options)
process.stdout.write(`load average ${loadavg().map(n => n.toFixed(2)).join(' ')}; per call, the synchronous part only (schedstat reads included, ~2 × 8 µs)\n`)
await measure('nothing (an async no-op)', async () => {})
await measure('pbkdf2, 1 iteration (pool, no work)', pbkdf2Task(1))
await measure('pbkdf2, 100,000 iterations (pool)', pbkdf2Task(100_000), Math.min(N, 60))
await measure('argon2id verify (@node-rs/argon2)', async () => await verify(stored, 'correct horse battery staple'))
