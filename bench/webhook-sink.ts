/**
 * The webhook receiver of bench/webhooks.ts, in a process of its own so its
 * work is not counted against the load generator. Answers every POST 200,
 * verifies nothing (the tests verify signatures), and remembers per
 * webhook-id when it arrived and when its event occurred.
 *
 *   GET  /stats?since=<ms>   {count, unique, first, last, latencies: [ms…]} of deliveries received after `since`
 *   POST anything else       a delivery
 *
 * Listens on 127.0.0.1:$PORT.
 */
import { createServer } from 'node:http'

interface Arrival { id: string, receivedAt: number, latencyMs: number }
const arrivals: Arrival[] = []

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url?.startsWith('/stats') === true) {
    const since = Number(new URL(req.url, 'http://x').searchParams.get('since') ?? 0)
    const picked = arrivals.filter(a => a.receivedAt >= since)
    const body = JSON.stringify({
      count: picked.length,
      unique: new Set(picked.map(a => a.id)).size,
      first: picked[0]?.receivedAt ?? null,
      last: picked.at(-1)?.receivedAt ?? null,
      latencies: picked.map(a => a.latencyMs)
    })
    res.writeHead(200, { 'content-type': 'application/json' }).end(body)
    return
  }
  const chunks: Buffer[] = []
  req.on('data', (c: Buffer) => chunks.push(c))
  req.on('end', () => {
    const receivedAt = Date.now()
    let occurredAt = receivedAt
    try {
      occurredAt = Date.parse((JSON.parse(Buffer.concat(chunks).toString('utf8')) as { occurred_at: string }).occurred_at)
    } catch {}
    arrivals.push({ id: String(req.headers['webhook-id']), receivedAt, latencyMs: receivedAt - occurredAt })
    res.writeHead(200).end()
  })
})
server.keepAliveTimeout = 60_000
server.listen(Number(process.env.PORT), '127.0.0.1')
process.on('SIGTERM', () => { server.close(); process.exit(0) })
