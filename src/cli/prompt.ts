import { createInterface } from 'node:readline/promises'
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
    const prompt = openHiddenPrompt()
    try {
      const first = await prompt.ask('Password: ')
      if (first === '') throw new CliError('the password is empty')
      if (confirm && await prompt.ask('Repeat the password: ') !== first) throw new CliError('the passwords do not match')
      return first
    } finally {
      prompt.close()
    }
  }
  return undefined
}

/**
 * Asks on the terminal before a change that is hard to take back; `yes`
 * (the command's `--yes`) answers for a script. Not on a terminal and without
 * `--yes`, the command stops with a usage error: nothing has been changed.
 * Only the answer "yes" goes on.
 */
export async function confirmOnTerminal (question: string, { yes, what }: { yes: boolean | undefined, what: string }): Promise<void> {
  if (yes === true) return
  if (process.stdin.isTTY !== true) {
    throw new UsageError(`${what} needs a confirmation: run on a terminal to be asked, or add --yes. Nothing was changed.`)
  }
  const lines = createInterface({ input: process.stdin, output: process.stderr })
  const cancel = new AbortController()
  lines.on('SIGINT', () => { cancel.abort() })
  try {
    const answer = await lines.question(`${question} Type "yes" to go on: `, { signal: cancel.signal })
    if (answer.trim().toLowerCase() !== 'yes') throw new CliError('not confirmed; nothing was changed')
  } catch (error) {
    if (cancel.signal.aborted) throw new CliError('cancelled', 130)
    throw error
  } finally {
    lines.close()
  }
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

/** What a hidden prompt needs from its input: a terminal it can switch to raw mode (no echo, no line editing). */
export interface TerminalInput extends NodeJS.ReadableStream {
  setRawMode: (mode: boolean) => unknown
}

export interface HiddenPrompt {
  /** Writes the question and resolves with the next line typed; Ctrl-C rejects (exit code 130). */
  ask: (question: string) => Promise<string>
  /** Gives the terminal back as it was. */
  close: () => void
}

/**
 * Questions on the terminal with echo off for the whole exchange. Raw mode is
 * on before the first question is written, so nothing typed once a prompt shows
 * can echo, and it stays on between questions, so an answer typed ahead of the
 * next question is neither echoed nor lost. Raw mode also means no line
 * editing by the terminal: Backspace and Ctrl-U are handled here.
 */
export function openHiddenPrompt (input: TerminalInput = process.stdin, output: NodeJS.WritableStream = process.stderr): HiddenPrompt {
  const answers: string[] = []
  let line = ''
  let cancelled = false
  let waiting: { resolve: (answer: string) => void, reject: (error: Error) => void } | undefined

  const settle = (): void => {
    if (waiting === undefined) return
    const { resolve, reject } = waiting
    if (answers.length > 0) {
      waiting = undefined
      output.write('\n')
      resolve(answers.shift()!)
    } else if (cancelled) {
      waiting = undefined
      output.write('\n')
      reject(new CliError('cancelled', 130))
    }
  }
  const onData = (chunk: string): void => {
    for (const char of chunk) {
      if (cancelled) break
      if (char === '\r' || char === '\n' || char === '\u0004') {
        answers.push(line)
        line = ''
      } else if (char === '\u0003') cancelled = true
      else if (char === '\u007f' || char === '\b') line = [...line].slice(0, -1).join('')
      else if (char === '\u0015') line = ''
      else if (char >= ' ') line += char
    }
    settle()
  }

  input.setRawMode(true)
  input.setEncoding('utf8')
  input.on('data', onData)
  input.resume()
  return {
    ask: async (question) => await new Promise<string>((resolve, reject) => {
      if (waiting !== undefined) throw new Error('one question at a time')
      output.write(question)
      waiting = { resolve, reject }
      settle()
    }),
    close: () => {
      input.off('data', onData)
      input.setRawMode(false)
      input.pause()
    }
  }
}
