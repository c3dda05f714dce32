/**
 * The two ways a test waits for something that happens on its own time (a
 * delivery, a notice, a restart): both poll with a deadline, never sleep a
 * guessed time, and fail with what was awaited. Deadlines are generous: they
 * only decide how long a failing test takes, not how long a passing one does.
 */

/** Polls `check` every 20 ms until it holds; fails after `timeoutMs` naming `what`. */
export async function waitFor (what: string, check: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 20))
  }
}

/**
 * Repeats `attempt` every 100 ms until it passes or `withinMs` has gone by;
 * then its last failure, so the assertion that kept failing is the one
 * reported (reconnecting, say, takes a moment).
 */
export async function eventually (withinMs: number, attempt: () => Promise<void>): Promise<void> {
  const deadline = Date.now() + withinMs
  for (;;) {
    try {
      await attempt()
      return
    } catch (error) {
      if (Date.now() > deadline) throw error
      await new Promise(resolve => setTimeout(resolve, 100))
    }
  }
}
