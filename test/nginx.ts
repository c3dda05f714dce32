import { spawn, type ChildProcess } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

/** Debian's nginx. Tests that need it skip without it; CI installs the package (.ci/run). */
export const NGINX = '/usr/sbin/nginx'

export interface Nginx { proc: ChildProcess, exited: Promise<void> }

/**
 * A whole nginx.conf for one nginx process in the foreground, with every file
 * it writes (pid, logs, temp paths) inside `dir`, so it needs no system paths
 * and leaves nothing behind; `http` is the inside of the `http { }` block.
 */
export function nginxConf (dir: string, http: string, options: { masterProcess?: boolean } = {}): string {
  const path = (name: string): string => JSON.stringify(join(dir, name))
  // With its master process, nginx takes a changed configuration by a reload (SIGHUP); without, it cannot.
  return `${process.getuid?.() === 0 ? 'user root;\n' : ''}daemon off;
${options.masterProcess === true ? '' : 'master_process off;\n'}worker_processes 1;
pid ${path('nginx.pid')};
error_log ${path('error.log')} notice;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path ${path('client_body')};
  proxy_temp_path ${path('proxy')};
  fastcgi_temp_path ${path('fastcgi')};
  uwsgi_temp_path ${path('uwsgi')};
  scgi_temp_path ${path('scgi')};
${http}
}
`
}

/** The last lines of nginx's error log in `dir`, for failure messages. */
export async function errorLog (dir: string): Promise<string> {
  try {
    return (await readFile(join(dir, 'error.log'), 'utf8')).trimEnd().split('\n').slice(-20).join('\n')
  } catch {
    return '(no error.log)'
  }
}

/** Starts nginx in the foreground from `dir`/nginx.conf and waits until `${base}/auth/healthz` answers 200 through it. */
export async function startNginx (dir: string, base: string): Promise<Nginx> {
  const conf = join(dir, 'nginx.conf')
  const proc = spawn(NGINX, ['-p', `${dir}/`, '-c', conf, '-e', join(dir, 'error.log')], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  proc.stderr!.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
  const exited = new Promise<void>(resolve => {
    proc.once('exit', () => resolve())
    proc.once('error', () => resolve())
  })
  const deadline = Date.now() + 15_000
  while (Date.now() < deadline) {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      throw new Error(`nginx exited (${proc.exitCode ?? proc.signalCode}) before it answered:\n${stderr}\n${await errorLog(dir)}`)
    }
    try {
      const res = await fetch(`${base}/auth/healthz`)
      await res.arrayBuffer()
      if (res.status === 200) return { proc, exited }
    } catch {
      // not listening yet
    }
    await sleep(50)
  }
  proc.kill('SIGKILL')
  throw new Error(`nginx did not answer ${base}/auth/healthz within 15 s:\n${stderr}\n${await errorLog(dir)}`)
}

export async function stopNginx (nginx: Nginx): Promise<void> {
  if (nginx.proc.exitCode !== null || nginx.proc.signalCode !== null) return
  nginx.proc.kill('SIGTERM')
  if (await Promise.race([nginx.exited.then(() => 'exited'), sleep(5_000, 'timeout', { ref: false })]) === 'timeout') {
    nginx.proc.kill('SIGKILL')
    await nginx.exited
  }
}
