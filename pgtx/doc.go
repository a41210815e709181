// Package pgtx holds the PostgreSQL plumbing every other package of watermill-once stands on:
// opening a *sql.DB through pgx's database/sql driver (so the transaction is a plain *sql.Tx
// that watermill-sql accepts), carrying a *sql.Tx in a context, running a function in a
// transaction with a bounded retry of serialization failures and deadlocks, classifying
// PostgreSQL errors by SQLSTATE, and validating and quoting the identifiers that come from
// configuration (no configuration string reaches SQL unquoted).
//
// # Guarantees and limits
//
// RunInTx and Retry (its loop, for callers that begin and end their transactions themselves)
// run a transaction again only after SQLSTATE 40001 or 40P01, which PostgreSQL guarantees left
// nothing committed, and never after a COMMIT whose outcome is unknown (a connection lost
// during COMMIT): that error is returned, and the caller must treat the work as possibly
// committed, which is what a dedupe key makes safe. Their waits end with the context.
//
// A pool from Open sends each transaction's BEGIN with its first statement (lazy BEGIN: one
// round trip less per transaction). The statement never runs outside the transaction: if BEGIN
// fails, PostgreSQL skips it and reports BEGIN's error for it. What changes: an error of BEGIN
// surfaces at the first statement instead of at BeginTx, and now() is the time that statement
// arrived. PoolConfig.DisableLazyBegin turns it off.
package pgtx
