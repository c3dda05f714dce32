import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import Mustache from 'mustache'
import { ConfigError } from '../config.ts'
import { humanTime } from '../lib/human-time.ts'

/**
 * Mail templates (docs/email.md#templates): each message is three Mustache
 * files of one name, `<name>.subject`, `<name>.txt` and `<name>.html`, in
 * src/mail/assets/mail-templates/ (copied to dist/assets/ by the build). A
 * file of the same name in MAIL_TEMPLATES_DIR replaces the built-in one. In
 * the HTML part `{{value}}` is HTML-escaped (`{{{value}}}` is not, and is for
 * nothing a person typed; values go in double-quoted attributes); the subject
 * and the text part are plain text, not escaped, and the subject is one line.
 */
export const TEMPLATE_PARTS = ['subject', 'txt', 'html'] as const
type Part = typeof TEMPLATE_PARTS[number]

const BUILT_IN_DIR = fileURLToPath(new URL('./assets/mail-templates/', import.meta.url))

function namesIn (dir: string): string[] {
  const names = new Set<string>()
  for (const file of readdirSync(dir)) {
    const match = /^([a-z][a-z0-9_]*)\.(subject|txt|html)$/.exec(file)
    if (match !== null) names.add(match[1]!)
  }
  return [...names].sort()
}

/** The messages gatehouse can send: one name per built-in template. */
export const TEMPLATE_NAMES: ReadonlySet<string> = new Set(namesIn(BUILT_IN_DIR))

export interface RenderedMail { subject: string, text: string, html: string }

/** A template that is missing or does not parse: a configuration mistake, reported as one at start. */
export class TemplateError extends ConfigError {}

const plain = (value: unknown): string => String(value)
const HTML_ENTITIES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }
/** The five characters that matter in text and in quoted attributes; Mustache's own also encodes `/` and `=`, which mangles links for no gain. */
const html = (value: unknown): string => String(value).replace(/[&<>"']/g, c => HTML_ENTITIES[c]!)

/** The values that hold an instant: a template shows them in words, with the ISO 8601 form beside them as `<name>_iso`. */
const TIME_VALUES = ['at', 'expires_at'] as const

/**
 * A message's values as its templates get them: "4 December 2026, 18:55 UTC"
 * for each instant, as the pages write times, rather than the stored ISO text.
 */
export function withReadableTimes (data: Record<string, unknown>): Record<string, unknown> {
  const view = { ...data }
  for (const name of TIME_VALUES) {
    const value = data[name]
    if (typeof value !== 'string') continue
    view[name] = humanTime(value)
    view[`${name}_iso`] = value
  }
  return view
}

/** The templates of one deployment, read once at start-up, overrides first. */
export class MailTemplates {
  readonly #templates = new Map<string, Record<Part, string>>()
  /** The files of MAIL_TEMPLATES_DIR that replace a built-in one. */
  readonly overridden: string[] = []
  /** Files of MAIL_TEMPLATES_DIR that match no template (a typo in a name), for a warning at start-up. */
  readonly unused: string[] = []

  constructor (overrideDir: string | undefined) {
    const overrides = new Set<string>()
    if (overrideDir !== undefined) {
      if (!existsSync(overrideDir)) throw new TemplateError(`MAIL_TEMPLATES_DIR ${overrideDir} does not exist`)
      for (const file of readdirSync(overrideDir)) {
        const match = /^([a-z][a-z0-9_]*)\.(subject|txt|html)$/.exec(file)
        if (match !== null && TEMPLATE_NAMES.has(match[1]!)) {
          overrides.add(file)
          this.overridden.push(file)
        } else if (!file.startsWith('.')) {
          this.unused.push(file)
        }
      }
    }
    for (const name of TEMPLATE_NAMES) {
      const parts = {} as Record<Part, string>
      for (const part of TEMPLATE_PARTS) {
        const file = `${name}.${part}`
        const path = overrides.has(file) ? join(overrideDir!, file) : join(BUILT_IN_DIR, file)
        if (!existsSync(path)) throw new TemplateError(`the mail template ${file} is missing`)
        const source = readFileSync(path, 'utf8')
        try {
          // Parsed now, so a broken override stops the start rather than a message later.
          Mustache.parse(source)
        } catch (error) {
          throw new TemplateError(`the mail template ${path} does not parse: ${(error as Error).message}`)
        }
        parts[part] = source
      }
      this.#templates.set(name, parts)
    }
  }

  render (name: string, view: Record<string, unknown>): RenderedMail {
    const parts = this.#templates.get(name)
    if (parts === undefined) throw new TemplateError(`there is no mail template ${name}`)
    return {
      // One line: a value with a line break must not start a header of its own.
      subject: Mustache.render(parts.subject, view, {}, { escape: plain }).replace(/\s+/g, ' ').trim(),
      text: Mustache.render(parts.txt, view, {}, { escape: plain }),
      html: Mustache.render(parts.html, view, {}, { escape: html })
    }
  }
}
