import { createRequire } from 'node:module'
import type { Config } from '../config.ts'
import { AppError } from '../errors.ts'

export interface PasswordPolicy { minLength: number, maxLength: number }

export function passwordPolicyOf (config: Pick<Config, 'passwordMinLength' | 'passwordMaxLength'>): PasswordPolicy {
  return { minLength: config.passwordMinLength, maxLength: config.passwordMaxLength }
}

/**
 * The bundled list of common passwords (zxcvbn-ts, about 49,000 entries, some
 * 18,000 of them 8 characters or longer), compared ignoring case. Loaded once,
 * offline: no password ever leaves the process.
 */
let common: Set<string> | undefined
/** Built by the first password checked (a few MiB, and tens of milliseconds start-up would otherwise pay). */
function commonPasswords (): Set<string> {
  if (common === undefined) {
    const { dictionary } = createRequire(import.meta.url)('@zxcvbn-ts/language-common') as typeof import('@zxcvbn-ts/language-common')
    common = new Set((dictionary['passwords-common'] as string[]).map(p => p.toLowerCase()))
  }
  return common
}

function violation (code: 'password_too_short' | 'password_too_long' | 'password_contains_username' | 'password_too_common', detail: string, field: string, why: string): AppError {
  return new AppError(code, 422, detail, { errors: [{ in: 'body', pointer: field, detail: why }] })
}

/**
 * OWASP ASVS 5.0 §6.2: a length range, no composition rules, no common
 * passwords, and no password containing the username. The password is taken
 * exactly as given (no trimming or normalization).
 */
export function checkPasswordPolicy (password: string, username: string, policy: PasswordPolicy, field = '/password'): void {
  const broken = passwordViolation(password, username, policy, field)
  if (broken !== undefined) throw broken
}

/**
 * The first rule of checkPasswordPolicy the password breaks, or undefined.
 * Without a username (a change that leaves it as stored), that rule is not
 * checked here; the service checks it against the stored one.
 */
export function passwordViolation (password: string, username: string | undefined, policy: PasswordPolicy, field = '/password'): AppError | undefined {
  const length = [...password].length
  if (length < policy.minLength) {
    return violation('password_too_short', `The password must have at least ${policy.minLength} characters.`, field, `is shorter than ${policy.minLength} characters`)
  }
  if (length > policy.maxLength) {
    return violation('password_too_long', `The password must have at most ${policy.maxLength} characters.`, field, `is longer than ${policy.maxLength} characters`)
  }
  if (username !== undefined && username !== '' && password.toLowerCase().includes(username.toLowerCase())) {
    return violation('password_contains_username', 'The password must not contain the username.', field, 'contains the username')
  }
  if (commonPasswords().has(password.toLowerCase())) {
    return violation('password_too_common', 'That password is on a list of commonly used passwords; choose another.', field, 'is a commonly used password')
  }
  return undefined
}
