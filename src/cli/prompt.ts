import { CliError, UsageError } from './output.ts'

const MAX_STDIN_BYTES = 64 * 1024

export interface PasswordOptions {
  passwordStdin?: boolean
  passwordPrompt?: boolean
}

/**
 * The password for a command, never from argv: `--password-stdin` reads one
 * line from standard input, `--password-prompt` asks on the terminal without
 * echo. Without either, a required password is asked for on a terminal and
 * is a usage error otherwise; an optional one is left unset.
 */
export async function readPassword (options: PasswordOptions, { required, confirm }: { required: boolean, confirm: boolean }): Promise<string | undefined> {
  if (options.passwordStdin === true && options.passwordPrompt === true) {
    throw new UsageError('give --password-stdin or --password-prompt, not both')
  }
  if (options.passwordStdin === true) return await readPasswordFromStdin()
  if (options.passwordPrompt === true || required) {
    if (process.stdin.isTTY !== true) {
      throw new UsageError(options.passwordPrompt === true
        ? '--password-prompt needs a terminal; pipe the password in with --password-stdin'
        : 'a password is required: pipe it in with --password-stdin, or run on a terminal to be asked')
    }
    const first = await promptHidden('Password: ')
    if (first === '') throw new CliError('the password is empty')
    if (confirm && await promptHidden('Repeat the password: ') !== first) throw new CliError('the passwords do not match')
    return first
  }
  return undefined
}

/** All of standard input, less one trailing line break; it must be one non-empty line. */
export async function readPasswordFromStdin (): Promise<string> {
  if (process.stdin.isTTY === true) process.stderr.write('Password (then Enter and Ctrl-D): ')
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of process.stdin) {
    const buffer = chunk as Buffer
    size += buffer.length
    if (size > MAX_STDIN_BYTES) throw new CliError('standard input is too long for a password')
    chunks.push(buffer)
  }
  const password = Buffer.concat(chunks).toString('utf8').replace(/\r?\n$/, '')
  if (password === '') throw new UsageError('--password-stdin read an empty password')
  if (/[\r\n]/.test(password)) throw new UsageError('--password-stdin takes the password on a single line')
  return password
}

/** Reads a line from the terminal in raw mode, echoing nothing. Ctrl-C cancels (exit code 130). */
export async function promptHidden (question: string): Promise<string> {
  const stdin = process.stdin
  process.stderr.write(question)
  stdin.setRawMode(true)
  stdin.resume()
  stdin.setEncoding('utf8')
  try {
    return await new Promise<string>((resolve, reject) => {
      let value = ''
      const onData = (chunk: string): void => {
        for (const char of chunk) {
          if (char === '\r' || char === '\n' || char === '\u0004') {
            stdin.off('data', onData)
            resolve(value)
            return
          }
          if (char === '\u0003') {
            stdin.off('data', onData)
            reject(new CliError('cancelled', 130))
            return
          }
          if (char === '\u007f' || char === '\b') value = [...value].slice(0, -1).join('')
          else if (char === '\u0015') value = ''
          else if (char >= ' ') value += char
        }
      }
      stdin.on('data', onData)
    })
  } finally {
    stdin.setRawMode(false)
    stdin.pause()
    process.stderr.write('\n')
  }
}
