/**
 * What went wrong between gatehouse and PostgreSQL, as opposed to what
 * PostgreSQL refused: no connection could be had, the one in use went away,
 * or a statement got no answer in time.
 *
 * node-postgres reports these as plain Errors that differ only in their text
 * ('timeout expired', 'Connection terminated unexpectedly', 'timeout exceeded
 * when trying to connect', …), which changes between its releases and between
 * pg and pg-pool. So they are told apart where they happen, in our driver's
 * seams (db/database.ts): whatever the pool's or a pipelined client's connect
 * rejects with, a failure on a connection whose socket has gone, and our own
 * query deadline, each becomes this error, with the driver's as its cause.
 * The server's own refusals (pg's DatabaseError, with a SQLSTATE code) pass
 * through unchanged and are mapped by their code (errors.ts).
 */
export type ConnectionFailureKind =
  /** No connection: opening one failed or timed out (refused, reset, no answer), or none came free in the pool in time, or the pool is closed. */
  | 'connect'
  /** The connection a statement ran on failed or ended before it was answered. */
  | 'connection_lost'
  /** The statement was not answered within DATABASE_QUERY_TIMEOUT_MS; its connection is given up. */
  | 'query_timeout'

export class DatabaseConnectionError extends Error {
  readonly kind: ConnectionFailureKind

  constructor (kind: ConnectionFailureKind, cause?: unknown) {
    super(MESSAGES[kind], { cause })
    this.name = 'DatabaseConnectionError'
    this.kind = kind
  }
}

const MESSAGES: Record<ConnectionFailureKind, string> = {
  connect: 'could not get a connection to the database',
  connection_lost: 'the connection to the database failed during a statement',
  query_timeout: 'the database did not answer the statement in time (DATABASE_QUERY_TIMEOUT_MS)'
}
