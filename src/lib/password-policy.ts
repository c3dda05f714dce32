import { createRequire } from 'node:module'
import type { Config } from '../config.ts'
import { AppError } from '../errors.ts'

export interface PasswordPolicy {
  minLength: number
  maxLength: number
  /** Lower-cased words tied to the service (PASSWORD_CONTEXT_WORDS), refused inside a password. */
  contextWords: readonly string[]
}

export function passwordPolicyOf (config: Pick<Config, 'passwordMinLength' | 'passwordMaxLength' | 'passwordContextWords'>): PasswordPolicy {
  return { minLength: config.passwordMinLength, maxLength: config.passwordMaxLength, contextWords: config.passwordContextWords.map(w => w.toLowerCase()) }
}

/**
 * Whose password it is: what an attacker who knows the account would try
 * first. A field left out is not checked here (a change that keeps a stored
 * username or address is checked against the stored one by its service).
 */
export interface PasswordOwner {
  username?: string | undefined
  /** Every address the account has or is about to have; null and undefined ones are skipped. */
  emails?: ReadonlyArray<string | null | undefined>
}

/**
 * A whole local part (or username) this short is still checked; pieces of a
 * local part need this many characters, or they would rule out unrelated
 * passwords ("ada" in "Canada"). A one- or two-character username ("jo")
 * would otherwise refuse every password holding those letters anywhere.
 */
const LOCAL_PART_MIN = 3
const USERNAME_MIN = LOCAL_PART_MIN
const LOCAL_PART_PIECE_MIN = 4

/**
 * The words of an address an attacker would try: its local part, and that
 * part's pieces between dots, dashes, underscores and plus signs
 * (ada.lovelace@… gives ada.lovelace and lovelace). Lower-cased.
 */
export function emailWords (email: string): string[] {
  const at = email.lastIndexOf('@')
  const local = (at === -1 ? email : email.slice(0, at)).toLowerCase()
  const words = new Set<string>()
  if ([...local].length >= LOCAL_PART_MIN) words.add(local)
  for (const piece of local.split(/[.\-_+]+/)) {
    if ([...piece].length >= LOCAL_PART_PIECE_MIN) words.add(piece)
  }
  return [...words]
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

type PasswordRule = 'password_too_short' | 'password_too_long' | 'password_contains_username' | 'password_contains_email' | 'password_contains_context_word' | 'password_too_common'

function violation (code: PasswordRule, detail: string, field: string, why: string): AppError {
  return new AppError(code, 422, detail, { errors: [{ in: 'body', pointer: field, detail: why }] })
}

/**
 * OWASP ASVS 5.0 §6.1.2, §6.2: a length range, no composition rules, no
 * common passwords, and none of the context words: the username, the
 * e-mail's local part, and the service's own names. The password is taken
 * exactly as given (no trimming or normalization); words are compared
 * ignoring case.
 */
export function checkPasswordPolicy (password: string, owner: PasswordOwner, policy: PasswordPolicy, field = '/password'): void {
  const broken = passwordViolation(password, owner, policy, field)
  if (broken !== undefined) throw broken
}

/** The first rule of checkPasswordPolicy the password breaks, or undefined. */
export function passwordViolation (password: string, owner: PasswordOwner, policy: PasswordPolicy, field = '/password'): AppError | undefined {
  const length = [...password].length
  if (length < policy.minLength) {
    return violation('password_too_short', `The password must have at least ${policy.minLength} characters.`, field, `is shorter than ${policy.minLength} characters`)
  }
  if (length > policy.maxLength) {
    return violation('password_too_long', `The password must have at most ${policy.maxLength} characters.`, field, `is longer than ${policy.maxLength} characters`)
  }
  const lower = password.toLowerCase()
  const { username } = owner
  if (username !== undefined && [...username].length >= USERNAME_MIN && lower.includes(username.toLowerCase())) {
    return violation('password_contains_username', 'The password must not contain the username.', field, 'contains the username')
  }
  for (const email of owner.emails ?? []) {
    if (email == null) continue
    if (emailWords(email).some(word => lower.includes(word))) {
      return violation('password_contains_email', 'The password must not contain the name part of the e-mail address.', field, 'contains the e-mail address\'s name part')
    }
  }
  const word = policy.contextWords.find(w => lower.includes(w))
  if (word !== undefined) {
    return violation('password_contains_context_word', `The password must not contain "${word}": names tied to this service are among the first an attacker tries.`, field, `contains "${word}"`)
  }
  if (commonPasswords().has(lower)) {
    return violation('password_too_common', 'That password is on a list of commonly used passwords; choose another.', field, 'is a commonly used password')
  }
  return undefined
}
