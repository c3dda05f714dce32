import { randomBytes } from 'node:crypto'
import { mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import type { Config } from '../config.ts'
import { parseKey } from '../lib/key-ring.ts'

/**
 * The embedded default's MFA_ENCRYPTION_KEY: on SQLite with no key set, the
 * first start writes a key into `<database file>.mfa-key` (mode 0600), and
 * every later start reads it, so authenticator apps work out of the box
 * (docs/mfa.md). Kept beside the database, not in it, so a copy of the
 * database alone still opens nothing. Not for PostgreSQL, where every
 * instance must be given the same key, nor for an in-memory database,
 * which a restart forgets anyway. A key that is set wins over the file.
 */
export class KeyFileError extends Error {}

/** The key file of a SQLite database file; undefined for PostgreSQL and in-memory SQLite. */
export function keyFilePathOf (databaseUrl: string): string | undefined {
  if (!databaseUrl.startsWith('sqlite:')) return undefined
  const file = databaseUrl.slice('sqlite:'.length)
  return file === '' || file === ':memory:' ? undefined : resolve(`${file}.mfa-key`)
}

/** The key in `path`, or undefined when there is no such file; a KeyFileError when it holds something else. */
export function readKeyFile (path: string): Buffer | undefined {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new KeyFileError(`cannot read the key file ${path}: ${(error as Error).message}`)
  }
  const key = parseKey(text.trim())
  if (key === undefined) throw new KeyFileError(`the key file ${path} does not hold a key (32 bytes as base64 or 64 hex digits); restore it, or set MFA_ENCRYPTION_KEY`)
  if ((statSync(path).mode & 0o077) !== 0) throw new KeyFileError(`the key file ${path} can be read by others than its owner; chmod 600 it`)
  return key
}

export interface EmbeddedKey {
  config: Config
  /** The key file read, or written by this start. */
  file?: string
  generated?: boolean
}

/** `config` with the key file's key as its ring, when the embedded default applies; the file is made when there is none. */
export function withEmbeddedKey (config: Config, options: { generate: boolean }): EmbeddedKey {
  const file = keyFilePathOf(config.databaseUrl)
  if (file === undefined || config.mfaKeyRing.length > 0) return { config }
  let key = readKeyFile(file)
  let generated = false
  if (key === undefined) {
    if (!options.generate) return { config }
    mkdirSync(dirname(file), { recursive: true })
    try {
      writeFileSync(file, `${randomBytes(32).toString('base64')}\n`, { mode: 0o600, flag: 'wx' })
      generated = true
    } catch (error) {
      // Another process made it first: read theirs.
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw new KeyFileError(`cannot write the key file ${file}: ${(error as Error).message}`)
    }
    key = readKeyFile(file)!
  }
  return { config: Object.freeze({ ...config, mfaKeyRing: [key], mfaEncryptionKey: key }), file, generated }
}
