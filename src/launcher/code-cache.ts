import { mkdirSync, readFileSync, renameSync, statSync, unlinkSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { basename, dirname, join } from 'node:path'
import vm from 'node:vm'
import { crc32 } from 'node:zlib'

/**
 * Where a start's compiled code came from:
 * - `used`: V8 took the code kept by an earlier start (or by `npm run build`);
 * - `missing`: there was none for this bundle and this Node.js, so V8 compiled the bundle;
 * - `rejected`: V8 refused the one kept (a damaged file, or other V8 flags);
 * - `off`: NODE_DISABLE_COMPILE_CACHE is set.
 */
export type CodeCacheState = 'used' | 'missing' | 'rejected' | 'off'

export interface CodeCache {
  readonly state: CodeCacheState
  /** The file the compiled code is kept in; undefined when off. */
  readonly file: string | undefined
  /**
   * Keeps the code V8 has compiled so far, functions compiled since the load
   * included, for the next start; only where nothing usable was there.
   * Written to a temporary name and renamed, so instances starting together
   * never read half a file. Throws where the directory cannot be written.
   */
  save (): boolean
}

export interface LoadedBundle<T> {
  exports: T
  codeCache: CodeCache
}

// The function Node wraps every CommonJS module in: the build writes the bundle inside it (scripts/build.js).
const WRAPPER_START = '(function (exports, require, module, __filename, __dirname) { '

/**
 * Runs a CommonJS bundle the way `require` would, with the code V8 compiled
 * for it at an earlier start. Node 20 keeps no such cache for application
 * code, and Node 22's own (module.enableCompileCache) writes it only once the
 * process exits, which a server rarely does. Compiling the 2.5 MB bundle took
 * about 100 ms of a 480 ms start here; reading the compiled code back, 35 ms.
 *
 * The cache lives in `code-cache/` beside the bundle (NODE_COMPILE_CACHE moves
 * it, NODE_DISABLE_COMPILE_CACHE turns it off), never in a shared temporary
 * directory: whoever can write the file chooses the code that runs.
 */
export function loadBundle<T> (bundle: string, env: NodeJS.ProcessEnv = process.env): LoadedBundle<T> {
  // The build refuses a bundle with a character beyond Latin-1, so this is the exact text, read without UTF-8 decoding.
  const source = readFileSync(bundle, 'latin1')
  if (!source.startsWith(WRAPPER_START)) throw new Error(`${bundle} is not a bundle written by scripts/build.js (it does not start with Node's module function); run npm run build`)
  const file = env.NODE_DISABLE_COMPILE_CACHE !== undefined && env.NODE_DISABLE_COMPILE_CACHE !== '' ? undefined : cacheFileFor(bundle, env)
  let kept: Buffer | undefined
  if (file !== undefined) {
    try {
      kept = readFileSync(file)
    } catch {
      // none yet
    }
  }
  const cachedData = kept !== undefined ? checkedData(kept) : undefined
  const script = new vm.Script(source, {
    filename: bundle,
    // No importModuleDynamically: the bundle imports packages through the launcher (src/lib/import-package.ts).
    ...(cachedData !== undefined ? { cachedData } : {})
  })
  const state: CodeCacheState = file === undefined
    ? 'off'
    : kept === undefined ? 'missing' : cachedData === undefined || script.cachedDataRejected === true ? 'rejected' : 'used'
  const run = script.runInThisContext() as (exports: unknown, require: NodeJS.Require, module: unknown, filename: string, dirname: string) => void
  const module = { exports: {} as T }
  run.call(module.exports, module.exports, createRequire(bundle), module, bundle, dirname(bundle))
  return {
    exports: module.exports,
    codeCache: {
      state,
      file,
      save () {
        if (file === undefined || state === 'used') return false
        mkdirSync(dirname(file), { recursive: true })
        const temporary = `${file}.${process.pid}.tmp`
        try {
          const data = script.createCachedData()
          const checksum = Buffer.alloc(CHECKSUM_BYTES)
          checksum.writeUInt32LE(crc32(data))
          writeFileSync(temporary, Buffer.concat([checksum, data]))
          renameSync(temporary, file)
        } catch (error) {
          try { unlinkSync(temporary) } catch {}
          throw error
        }
        return true
      }
    }
  }
}

const CHECKSUM_BYTES = 4

/**
 * The data V8 wrote, if the file still holds it as written: V8 checks its
 * data's header and length, not every byte, and running compiled code with a
 * flipped bit is not a risk to take for a faster start.
 */
function checkedData (kept: Buffer): Buffer | undefined {
  if (kept.length <= CHECKSUM_BYTES) return undefined
  const data = kept.subarray(CHECKSUM_BYTES)
  return kept.readUInt32LE(0) === crc32(data) ? data : undefined
}

/**
 * One file per bundle build and V8 version: V8 checks its own version, flags
 * and the source's length, not the source itself, so the bundle's size and
 * modification time name the build it was compiled from.
 */
function cacheFileFor (bundle: string, env: NodeJS.ProcessEnv): string {
  const { size, mtimeMs } = statSync(bundle)
  const dir = env.NODE_COMPILE_CACHE !== undefined && env.NODE_COMPILE_CACHE !== ''
    ? join(env.NODE_COMPILE_CACHE, 'gatehouse')
    : join(dirname(bundle), 'code-cache')
  const v8 = process.versions.v8.replace(/[^\w.-]/g, '_')
  return join(dir, `${basename(bundle)}-${size}-${Math.trunc(mtimeMs)}-v8-${v8}-${process.arch}.bin`)
}
