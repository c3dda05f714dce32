import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { TestContext } from 'node:test'
import { chromium, type BrowserContext, type Page } from 'playwright-core'

/** Debian's Chromium; Playwright's own browser download is not reachable from here. */
export const CHROMIUM = '/usr/bin/chromium'

/**
 * Skips the test, and says so, where the browser tests do not run: without
 * Chromium, or with TEST_BROWSER=off (CI runs them on its first Node only,
 * .ci/run: the page is the same page whichever Node serves it).
 */
export function browserSkipped (t: TestContext): boolean {
  if (process.env.TEST_BROWSER === 'off') {
    t.skip('TEST_BROWSER=off')
    return true
  }
  if (!existsSync(CHROMIUM)) {
    t.skip(`${CHROMIUM} is missing; install Debian's chromium package to run this test (CI does)`)
    return true
  }
  return false
}

export interface Browser { context: BrowserContext, page: Page, close: () => Promise<void> }

/**
 * Headless Chromium in a fresh profile, with the flags this machine needs
 * (no sandbox as root; no background networking, whose connections the
 * closed network refuses). Playwright refuses --user-data-dir in `args`,
 * hence a persistent context on a temp dir, removed again by `close`.
 */
export async function launchChromium (): Promise<Browser> {
  const profile = await mkdtemp(join(tmpdir(), 'gatehouse-chromium-'))
  let context: BrowserContext
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update']
    })
  } catch (error) {
    await rm(profile, { recursive: true, force: true })
    throw error
  }
  context.setDefaultTimeout(15_000)
  const page = context.pages()[0] ?? await context.newPage()
  return {
    context,
    page,
    close: async () => {
      await context.close()
      await rm(profile, { recursive: true, force: true })
    }
  }
}
