import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { waitFor } from './polling.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/**
 * The service as production runs it: its own process (src/server.ts) with
 * only this environment, its stderr echoed with a prefix. The crash tests
 * kill it without warning and start it again on the same database. With
 * `stdout` its log lines are handed over as they come.
 */
export function startService (env: Record<string, string>, options: { stdout?: (chunk: string) => void } = {}): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    stdio: ['ignore', options.stdout !== undefined ? 'pipe' : 'ignore', 'pipe']
  })
  if (options.stdout !== undefined) child.stdout!.setEncoding('utf8').on('data', options.stdout)
  child.stderr!.setEncoding('utf8').on('data', (d: string) => { process.stderr.write(`[service] ${d}`) })
  return child
}

/** Until `${base}/readyz` answers 200 (30 s at most, or `timeoutMs`). */
export async function waitReady (base: string, timeoutMs = 30_000): Promise<void> {
  await waitFor('the service to be ready', async () => {
    try {
      return (await fetch(`${base}/readyz`)).ok
    } catch {
      return false
    }
  }, timeoutMs)
}
