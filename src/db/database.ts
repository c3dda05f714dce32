/**
 * The database: its tables and the values they hold (schema.ts), how a
 * handle is opened on SQLite or PostgreSQL (connect.ts), and transactions
 * that are retried or rolled back to a savepoint (transactions.ts).
 */
export * from './schema.ts'
export * from './connect.ts'
export * from './transactions.ts'
