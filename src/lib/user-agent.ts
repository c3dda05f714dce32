import { UAParser } from 'ua-parser-js'

/**
 * A person's name for the device behind a User-Agent, for lists of sessions:
 * "Firefox 133 on Windows", "Mobile Safari 17 on iOS", or, for a program the
 * parser does not know, its first product token ("curl/8.5.0"). Browsers
 * freeze the operating system's version in the header (Windows 11 says 10,
 * every macOS says 10.15.7), so only its name is shown. Null when nothing is
 * recognisable.
 */
export function deviceOf (userAgent: string | null): string | null {
  if (userAgent === null || userAgent.trim() === '') return null
  const { browser, os } = new UAParser(userAgent).getResult()
  const browserName = browser.name !== undefined ? [browser.name, browser.major].filter(Boolean).join(' ') : undefined
  if (browserName !== undefined && os.name !== undefined) return `${browserName} on ${os.name}`
  if (browserName !== undefined) return browserName
  if (os.name !== undefined) return `Unknown browser on ${os.name}`
  return /^[A-Za-z][\w.-]{0,40}\/[\w.-]{1,20}/.exec(userAgent)?.[0] ?? null
}

/** As much of a User-Agent as sessions keep. */
export const USER_AGENT_MAX_LENGTH = 512

/**
 * A sign-in event's `user_agent` (ASVS 16.3.1: each success and failure with
 * its client): the first 512 characters of the header, or nothing when none
 * was sent. The session row keeps it too, but only until a day after the
 * session ends; the event log keeps it for as long as it keeps the event.
 */
export function userAgentData (userAgent: string | null): { user_agent?: string } {
  return userAgent === null || userAgent === '' ? {} : { user_agent: userAgent.slice(0, USER_AGENT_MAX_LENGTH) }
}
