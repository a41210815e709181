// Package pgtx holds the PostgreSQL plumbing every other package of watermill-once stands on:
// opening a *sql.DB through pgx's database/sql driver, carrying a *sql.Tx in a context,
// running a function in a transaction with a bounded retry of serialization failures and
// deadlocks, classifying PostgreSQL errors by SQLSTATE, and validating and quoting the
// identifiers that come from configuration.
//
// # Why database/sql and not pgxpool
//
// Watermill's SQL publisher and subscriber speak database/sql. Using pgx through its stdlib
// driver keeps the transaction a plain *sql.Tx, so one transaction can be shared by the dedupe
// claim, the handler's own writes and a watermill-sql publisher bound to that transaction.
//
// # Guarantees and limits
//
// RunInTx retries the whole function only for SQLSTATE 40001 (serialization_failure) and
// 40P01 (deadlock_detected), which PostgreSQL guarantees left nothing committed. It never
// retries a failed COMMIT whose outcome is unknown (a connection lost during COMMIT): that error
// is returned, and the caller must treat the work as possibly committed, which is exactly what a
// dedupe key makes safe. Retry is the same loop for callers that begin and end their
// transactions themselves; it is the module's only one. The waits between attempts end as soon
// as the context ends.
//
// # Lazy BEGIN and deferred statements
//
// A pool from Open holds back the BEGIN of every transaction and sends it in the same network
// write as the transaction's first statement: a transaction of n statements costs n+1 round
// trips (the COMMIT) instead of n+2. It works below pgx, on the wire protocol, so the transaction
// is still a plain *sql.Tx of pgx's stdlib driver. The held-back BEGIN is placed so that the
// statement never runs outside the transaction: if BEGIN fails, PostgreSQL skips the statement
// and its error is reported for it. What changes: an error of BEGIN itself surfaces at the first
// statement instead of at BeginTx, and now() is the time that statement arrived. Statements whose
// text starts with DeferredPrefix, sent without arguments inside a transaction, are held back the
// same way and travel with the next statement (see DeferredPrefix). PoolConfig.DisableLazyBegin
// turns both off; a *sql.DB opened otherwise does not have them (the statements then simply cost
// their round trips). PoolConfig.RoundTrips counts round trips, to check such claims. The same
// connections can refuse a COMMIT or ROLLBACK while the library lends a transaction to user
// code, and every later statement of that attempt (WireGuardOpen, WireGuards,
// CodeAttemptGuard).
//
// Identifiers are validated against a conservative pattern and then quoted; no configuration
// string reaches SQL unquoted.
package pgtx
