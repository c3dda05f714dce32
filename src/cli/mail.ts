import type { Command } from 'commander'
import { CliError, printJson, printLine, UsageError } from './output.ts'

/**
 * `gatehouse mail test ADDRESS`: the deployment's SMTP settings (SMTP_URL,
 * MAIL_FROM, PUBLIC_URL, SMTP_REQUIRE_TLS, from the environment as `serve`
 * reads them) send one test message at once, and the server's answer is
 * printed; a refusal or a server that cannot be reached exits 1 with the
 * reason. Nothing is written to the database.
 */
export function registerMail (program: Command): void {
  const mail = program.command('mail').description('check outgoing mail with the settings in the environment (docs/email.md)')
  mail.command('test')
    .description('send a test message to ADDRESS now, with SMTP_URL and MAIL_FROM, and print the SMTP server\'s answer')
    .argument('<address>', 'where the test message goes')
    .option('--json', 'print JSON')
    .action(async (address: string, options: { json?: boolean }) => {
      if (!/^[^\s@]+@[^\s@]+$/.test(address) || address.length > 254) throw new UsageError(`${address} is not an e-mail address`)
      const { ConfigError, loadConfig } = await import('../config.ts')
      let config
      try {
        config = loadConfig()
      } catch (error) {
        if (error instanceof ConfigError) throw new UsageError(error.message)
        throw error
      }
      if (config.smtpUrl === undefined) throw new UsageError('SMTP_URL is not set: this deployment sends no mail (docs/email.md#without-smtp)')
      const { createTransport, MailTestError, sendTestMessage } = await import('../mail/mail.worker.ts')
      const transport = await createTransport(config)
      try {
        const answer = await sendTestMessage(transport, config, address)
        if (options.json === true) printJson({ sent: true, to: address, answer })
        else printLine(`The SMTP server took the test message for ${address}: ${answer}`)
      } catch (error) {
        if (!(error instanceof MailTestError)) throw error
        if (options.json === true) printJson({ sent: false, to: address, error: error.message })
        throw new CliError(`the test message was not sent: ${error.message}`)
      } finally {
        transport.close()
      }
    })
}
