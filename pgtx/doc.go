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
// dedupe key makes safe.
//
// Identifiers are validated against a conservative pattern and then quoted; no configuration
// string reaches SQL unquoted.
package pgtx
