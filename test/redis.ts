/**
 * The Redis the tests may use: only the one TEST_REDIS_URL names, database
 * number included (CI gives the tests a database of their own), never
 * whatever happens to answer on 127.0.0.1:6379. The tests write keys under
 * gatehouse's own prefix in that database and never flush it. Set but unreachable is a failure, as for TEST_DATABASE_URL;
 * unset, the tests that need Redis are skipped with NO_REDIS as the reason.
 */
export const TEST_REDIS_URL: string | undefined = process.env.TEST_REDIS_URL !== '' ? process.env.TEST_REDIS_URL : undefined

export const NO_REDIS = 'TEST_REDIS_URL is unset; set it to a Redis database the tests may use, e.g. redis://127.0.0.1:6379/15 (CI does)'

/** TEST_REDIS_URL with its host and port replaced, e.g. by a proxy's in front of it: same database, same credentials. */
export function testRedisUrlVia (host: string, port: number): string {
  const url = new URL(TEST_REDIS_URL!)
  url.hostname = host
  url.port = String(port)
  return url.toString()
}

/** TEST_REDIS_URL's host and port, to put a proxy in front of it. */
export function testRedisAddress (): { host: string, port: number } {
  const url = new URL(TEST_REDIS_URL!)
  return { host: url.hostname, port: url.port === '' ? 6379 : Number(url.port) }
}
