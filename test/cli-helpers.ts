import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import type { FastifyTypeBox } from '../src/lib/http.ts'

export const BIN = fileURLToPath(new URL('../bin/gatehouse.js', import.meta.url))

export interface CliResult { code: number | null, stdout: string, stderr: string }

/** Variables a developer's shell may have set that would change what the CLI talks to. */
const CLEARED = ['GATEHOUSE_URL', 'GATEHOUSE_API_KEY', 'DATABASE_URL', 'DATABASE_SCHEMA', 'SERVICE_DATABASE_URL', 'GATEHOUSE_ADMIN_API_KEY', 'GATEHOUSE_ADMIN_USERNAME', 'GATEHOUSE_ADMIN_PASSWORD', 'PORT', 'HOST']

/**
 * Runs `node bin/gatehouse.js ...args` as a real process (asynchronously: the
 * service under test runs in this process and must keep answering).
 */
export async function runCli (args: string[], { env = {}, input }: { env?: Record<string, string>, input?: string } = {}): Promise<CliResult> {
  const base: NodeJS.ProcessEnv = { ...process.env }
  for (const name of CLEARED) delete base[name]
  const child = spawn(process.execPath, [BIN, ...args], { env: { ...base, ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d })
  child.stdin.end(input ?? '')
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on('error', reject)
    child.on('close', resolve)
  })
  return { code, stdout, stderr }
}

/** Listens on a free loopback port; returns the base URL the CLI takes as GATEHOUSE_URL. */
export async function listen (app: FastifyTypeBox): Promise<string> {
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  if (address === null || typeof address === 'string') throw new Error('no port')
  return `http://127.0.0.1:${address.port}${app.config.basePath}`
}

/** script(1) from util-linux, which runs a command on a pseudo-terminal; undefined where it is missing. */
export const SCRIPT = ['/usr/bin/script', '/bin/script'].find(existsSync)

/** What to type on the terminal (`type`, e.g. "yes\r") once the output shows `after`. */
export interface TerminalAnswer { after: string, type: string }

/**
 * Runs the CLI on a pseudo-terminal `columns` wide, as someone at a terminal
 * would (stdout and stderr are both the terminal, so `output` holds both;
 * line ends are the terminal's \r\n). COLUMNS is unset, so the width is the
 * terminal's own. `answers` are typed in order, each once its prompt shows.
 */
export async function runCliOnTerminal (args: string[], { env = {}, columns, answers = [] }: { env?: Record<string, string>, columns: number, answers?: TerminalAnswer[] }): Promise<{ code: number | null, output: string }> {
  const base: NodeJS.ProcessEnv = { ...process.env }
  for (const name of [...CLEARED, 'COLUMNS', 'LINES']) delete base[name]
  const command = [process.execPath, BIN, ...args].map(a => `'${a.replaceAll("'", "'\\''")}'`).join(' ')
  const child = spawn(SCRIPT!, ['-qec', `stty cols ${columns} rows 40 && exec ${command}`, '/dev/null'], { env: { ...base, ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
  let output = ''
  const pending = [...answers]
  const answer = (): void => {
    // Each answer is typed once its prompt has been shown; script(1) passes what it reads to the terminal.
    while (pending.length > 0 && output.includes(pending[0]!.after)) child.stdin.write(pending.shift()!.type)
  }
  child.stdout.setEncoding('utf8').on('data', (d: string) => { output += d; answer() })
  child.stderr.setEncoding('utf8').on('data', (d: string) => { output += d; answer() })
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on('error', reject)
    child.on('close', resolve)
  })
  return { code, output }
}
