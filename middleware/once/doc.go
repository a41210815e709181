// Package once makes a Watermill router handler effectively-once on PostgreSQL: a
// message may be delivered many times, its effect is applied once.
//
// # The guarantee
//
// For every delivered message, Middleware runs ONE transaction:
//
//  1. claim the message's key for the consumer: INSERT INTO processed_messages ... ON CONFLICT
//     DO NOTHING. No row inserted means a copy was already applied: the transaction ends, the
//     message is acked, the duplicate is counted and logged (summarised at info level, at most
//     one line a minute per consumer);
//  2. run the handler with the transaction in the message context (pgtx.TxFromContext);
//  3. store every message the handler returns (and every message it publishes through
//     outbox.Writer.Publisher) in the outbox table;
//  4. commit; only then does the router ack.
//
// A handler error or panic, an outbox failure or a failed commit rolls everything back and
// nacks: no claim is left behind, so the redelivery runs the handler again. Two copies delivered
// at the same moment serialise on the claim's unique key; the second waits for the first to
// commit and then skips. A crash before the commit loses nothing (the broker redelivers); a
// crash after the commit duplicates nothing (the key exists). Serialization failures and
// deadlocks re-run the whole transaction a bounded number of times.
//
// The transaction is REPEATABLE READ by default (Config.TxOptions), so that concurrent
// handlers' read-modify-writes lose no update; such a conflict re-runs the transaction, up to
// Config.TxRetry.MaxAttempts (10) times.
//
// # Where the guarantee stops
//
//   - Only writes made through the transaction are covered. An HTTP call, an e-mail, a write to
//     another database or a publish straight to a broker are not: give them an idempotency key
//     derived from the consumer, the message key and the step, or record an intent in the
//     transaction and send it from a worker.
//   - Messages leave through the outbox relay, which is at-least-once: downstream consumers must
//     deduplicate too (with this middleware).
//   - The dedupe key must be stable across copies (the producer's event id; by default the
//     Watermill UUID). Broker delivery ids change on redelivery and must never be used.
//   - Keys are kept as long as retention keeps them: a copy that arrives after its key was
//     deleted is applied again. Keep keys longer than any redelivery can take.
//   - Idempotent is not ordered: an older event arriving after a newer one is applied. Use
//     versioned writes where order matters.
//
// # Group commit, the default
//
// Messages in flight at the same time share transactions (Config.GroupCommit), with the same
// guarantee per message; a message that finds a transaction free runs in one of its own. A
// grouped handler may run again because a neighbour in its group failed, so it must touch only
// the database, through the transaction, and be short (GroupCommitConfig). Messages from
// watermill-sql's subscriber run in the subscriber's transaction and are not grouped.
//
// # Messages from watermill-sql's subscriber
//
// watermill-sql's subscriber (version 3, or version 4 over database/sql) delivers each message
// inside its own REPEATABLE READ transaction and commits it, with the consumer offset, on ack.
// The middleware works inside that transaction (unless Config.DisableSubscriberTxReuse is set):
// offset, claim and effects become one commit. Each attempt runs in a SAVEPOINT, guarded so
// that the subscriber's COMMIT fails while an attempt is still running. A transaction that
// cannot go on in place (a serialization failure under its snapshot, a lost connection) is
// doomed and the message acked into it, so that the subscriber delivers it again in a new
// one. Version 4's pgx adapter (sql.BeginnerFromPgx) delivers in a pgx.Tx no *sql.Tx can join:
// such messages are refused (pgtx.ErrUnsupportedSubscriberTx). Details, round trips and
// counters: docs/middleware.md.
//
// # The transaction and the ack belong to the middleware
//
// A handler must not call Commit or Rollback on its transaction, nor send COMMIT or ROLLBACK
// as SQL text: the attempt guard refuses it, nothing of the delivery is applied, and it fails
// with the permanent wmonce.ErrHandlerEndedTx (counted in Counters.HandlerEndedTx, parked by
// the Stack). The handler gets a message of its own: its Ack and Nack reach nobody (counted in
// Counters.HandlerAcked); the router acks after the COMMIT.
//
// # When the router closes
//
// Router.Close cancels every in-flight message context at once. A handler already running may
// finish and commit within Config.ShutdownGrace (default 5s); after it the transaction is rolled
// back and the message redelivered. The grace does not reach watermill-sql's subscriber
// transaction, which Router.Close rolls back at once.
//
// # Middleware order
//
// Use Stack, or add them in this order (first added is outermost):
//
//	Timeout -> Retry(ResetContextOnRetry) -> PoisonQueue -> Middleware -> CorrelationID -> Recoverer -> handler
//
// Stack's poison queue parks into the Middleware's outbox by default (DefaultPoisonTopic). In a
// chain of your own, give Watermill's PoisonQueueWithFilter outbox.Writer.ParkingPublisher:
// it parks any message, including the ones refused for their UUID or metadata.
//
// Never combine with Watermill's InstantAck or its in-memory Deduplicator (see Stack).
//
// The handler must use the transaction for its writes, not the *sql.DB: a second connection
// taken while the transaction holds one can exhaust the pool and deadlock.
//
// # Retention of the claims
//
// A claim deduplicates as long as it is kept. ops/retention's janitor deletes claims past their
// retention (PruneClaims) and drops expired day partitions (MaintainDays); a service with a
// scheduler of its own calls these itself. A deleted claim no longer deduplicates.
//
// # Tracing
//
// With an OpenTelemetry SDK installed (Config.TracerProvider, else the global provider), each
// delivery is a consumer span "once process", the child of the trace context the message
// carries, with the claim, the duplicate verdict and the COMMIT as events and the handler and
// the outbox store as child spans; attributes and limits: docs/middleware.md.
package once
