/*
 * A time as a person reads it in a mail or on a page: "4 December 2026,
 * 18:55 UTC". Written out by hand rather than with Intl.DateTimeFormat, whose
 * punctuation ("4 December 2026 at 18:55") changes with the ICU data the Node
 * build ships, so a mail would read differently on Node 20, 22 and 24.
 */

const MONTHS = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December']

/** A stored instant (ISO 8601 or a Date) in words, to the minute, in UTC; text that is not a time comes back as it was. */
export function humanTime (value: string | Date): string {
  const date = value instanceof Date ? value : new Date(value)
  if (Number.isNaN(date.getTime())) return String(value)
  const hh = String(date.getUTCHours()).padStart(2, '0')
  const mm = String(date.getUTCMinutes()).padStart(2, '0')
  return `${date.getUTCDate()} ${MONTHS[date.getUTCMonth()]!} ${date.getUTCFullYear()}, ${hh}:${mm} UTC`
}
