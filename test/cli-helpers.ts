import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import type { FastifyTypeBox } from '../src/app.ts'

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
