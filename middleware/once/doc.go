// Package once makes a Watermill router handler effectively-once on PostgreSQL: a
// message may be delivered many times, its effect is applied once.
//
// # The guarantee
//
// For every delivered message, Middleware runs ONE transaction:
//
//  1. claim the message's key for the consumer: INSERT INTO processed_messages ... ON CONFLICT
//     DO NOTHING. No row inserted means a copy was already applied: the transaction ends, the
//     message is acked, the duplicate is counted and logged (summarised at info level, see
//     DuplicateLogInterval);
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
// The transaction is REPEATABLE READ by default (Config.TxOptions): handlers run concurrently
// (Kafka partitions, RabbitMQ workers, instances of the consumer), and a handler that writes back
// a value computed from what it read would otherwise overwrite the updates of handlers that
// committed in between. Such a lost update fails with 40001 and the transaction runs again, up to
// Config.TxRetry.MaxAttempts (10) times. REPEATABLE READ does not prevent write skew.
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
// Messages in flight at the same time share transactions (Config.GroupCommit): a message that
// finds one of GroupCommitConfig.Workers transactions free runs at once in a transaction of its
// own, exactly as described above; messages that find every one busy are claimed together and
// handled one after another in ONE transaction, committed together, and then each is acked. The
// guarantee per message is the same. What it asks of handlers: touch only the database, through
// the transaction, and be short. A grouped handler may run again because a neighbour in its
// group failed (the group is rolled back and run again without the failed message), so an effect
// outside the database can repeat even when its own message succeeds; and a slow handler delays
// its whole group. Set GroupCommit.Disabled for a transaction per message. Messages from
// watermill-sql's subscriber run in the subscriber's transaction and are not grouped.
//
// # Messages from watermill-sql's subscriber
//
// watermill-sql's subscriber (version 3, or version 4 over database/sql) delivers each message
// inside its own REPEATABLE READ transaction and commits it, with the consumer offset, when the
// message is acked. When the middleware finds that transaction in the message context, it works
// inside it (unless Config.DisableSubscriberTxReuse is set): offset, claim and effects become
// one commit, whichever of pgtx.TxFromContext and watermill-sql's own sql.TxFromContext the
// handler writes through. Version 4's pgx adapter (sql.BeginnerFromPgx) delivers in a pgx.Tx that
// no *sql.Tx can join: such messages are refused (pgtx.ErrUnsupportedSubscriberTx, counted in
// Counters.Refused, nacked, never applied) unless DisableSubscriberTxReuse says the handler
// writes only through pgtx.TxFromContext. Each
// attempt runs in a SAVEPOINT that is rolled back on failure, because the subscriber re-delivers
// a nacked message in the same transaction without rolling back. An attempt guard makes the
// subscriber's COMMIT fail if it commits while an attempt is still running, which it does when
// its AckDeadline passes: half an attempt never persists. The attempt's state (open, closed,
// doomed) is a transaction-local setting that a rolled-back savepoint reverts with the attempt,
// and one guard row per transaction has a deferred trigger check it at COMMIT. In this mode the handler runs under REPEATABLE READ, and a
// serialization failure (40001) of its statements cannot be re-run in place: rolling back to the
// savepoint keeps the snapshot, so a nacked copy re-sent in the same transaction would fail
// again until AckDeadline. Instead the attempt is undone, the transaction is doomed (the attempt
// state says so, and the guard fails its COMMIT) and the message is acked into it: the
// subscriber's commit fails, its offset does not move, and it delivers the message again in a
// new transaction with a fresh snapshot. Later messages of the same batch are acked into the
// doomed transaction without running and are redelivered the same way. Each such message counts
// in Counters.TxRetries; watermill-sql logs the failed commit at error level, with the attempt
// guard's message. A subscriber transaction whose connection is gone (a terminated backend, a
// network failure) is settled the same way: the message is acked into it without effect, so
// that the subscriber's own statements fail and it reads the message again in a new
// transaction at once, instead of re-sending it into the dead one until AckDeadline.
//
// Round trips per message, on a pool from pgtx.Open (lazy BEGIN): in a transaction of our own,
// the claim (carrying BEGIN), the handler's statements and COMMIT; an at-least-once handler pays
// all but the claim. In the subscriber's transaction, one besides the handler's: the savepoint
// and the claim, conditional on opening the attempt, go in one (arguments quoted by pgx, simple
// protocol), and the release travels with the transaction's next statement, which therefore
// cannot run without it.
// A duplicate costs one more, to compare its payload with the applied copy's.
//
// A copy whose claim fails with a serialization failure (40001) is settled differently: under
// REPEATABLE READ that failure of INSERT ... ON CONFLICT DO NOTHING means a claim for the key
// was committed after the subscriber's snapshot (e.g. the same event arrived at once on a topic
// and its redrive topic, consumed under one consumer name). Retrying it in place would meet the
// same invisible row until AckDeadline, since rolling back to a savepoint keeps the snapshot, so
// the copy is settled at once as a duplicate: acked, logged and counted in Counters.Duplicates like
// any other, once the committed claim has been read on a separate connection (its payload
// compared with the applied copy's). If that claim cannot be read (an SSI failure under
// SERIALIZABLE proves nothing; the pool may have no connection to spare), the transaction is
// given up as for a handler's serialization failure above, and the message redelivered.
//
// # A handler that ends its transaction
//
// The transaction belongs to the middleware: a handler must not call Commit or Rollback on it.
// Repository code that does is stopped by the attempt guard: from the claim until the
// middleware's own COMMIT, any other COMMIT of the transaction is refused (on a pool from
// pgtx.Open by the connection itself, at no cost to the server; on other pools and in
// watermill-sql's subscriber transaction by the server, migrations 010 and 011), so it is rolled
// back whole and nothing of it is applied, neither the claim nor an effect nor an output. The
// middleware notices (database/sql marks the transaction done, or its guard statements are
// refused: SQLSTATE WM002, pgtx.CodeAttemptGuard) and
// fails that delivery alone with the permanent wmonce.ErrHandlerEndedTx, logged at error level
// and counted in Counters.HandlerEndedTx: the Stack parks it with a reason saying the handler
// ended the transaction. In a group, the handler that did it is found right after it returns
// and the rest of the group runs again without it. On watermill-sql's subscriber path the
// subscriber's transaction is gone with it, so the parked message is delivered once more in a new
// transaction; that copy is acked without running the handler (the middleware remembers the
// parked copy; after a restart it may be parked a second time, never applied). Transaction
// control sent as SQL text (tx.Exec("COMMIT"), also END, ROLLBACK, ABORT) is refused the same
// way and fails the delivery with wmonce.ErrHandlerEndedTx; on a pool from pgtx.Open the
// connection then refuses every later statement of the attempt. On other pools the server is
// outside any transaction afterwards: the library sends nothing more (migration 017's
// attempt_check and attempt_close fail there), but statements the handler itself sends after
// it run in autocommit. Never send it.
//
// # A handler that acks its message
//
// The ack belongs to the middleware too. The handler gets a message of its own: the delivery's
// UUID, metadata and payload, with the handler's context, and its own Ack and Nack. A handler
// that called msg.Ack() on the delivery would let the broker forget the message before its
// effect committed (lost if the attempt then failed), and inside watermill-sql's subscriber
// transaction the ack would commit that transaction under the handler. Such a call is ignored,
// counted in Counters.HandlerAcked and logged once per consumer (at error level, marked WARNING);
// the router acks the delivery after the COMMIT, or nacks it after a failure, on every path.
// The hooks called before the handler (Config.Key, Config.OccurredAt) get a view of the delivery
// whose Ack and Nack reach nobody either.
//
// # When the router closes
//
// Router.Close cancels every in-flight message context at once. The middleware gives the
// handler a context detached from that cancellation for Config.ShutdownGrace (default 5s), so a
// handler that is nearly done commits rather than being rolled back and redone; after the
// grace the transaction is cancelled and rolled back and the message is redelivered later. The
// ack of a message committed during shutdown may no longer reach the broker; its redelivery is
// then a no-op. Correctness holds either way; the grace only saves work. Deadlines from an outer
// Timeout middleware apply at once.
//
// The grace does not reach watermill-sql's subscriber transaction: the subscriber begins it with
// the subscription context, which Router.Close cancels, and database/sql then rolls it back at
// once. A handler running in it is cut short (its statements fail with sql.ErrTxDone), nothing
// of the attempt commits, and the message is redelivered. Use Config.DisableSubscriberTxReuse
// where finishing during shutdown matters more than one commit for offset and effects.
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
// Never combine with Watermill's InstantAck (acks before the commit) or its in-memory
// Deduplicator (records the key before the handler succeeds, so a failed message's redelivery
// is dropped).
//
// The handler must use the transaction for its writes, not the *sql.DB: a second connection
// taken while the transaction holds one can exhaust the pool and deadlock.
//
// # Operations on the claims
//
// This package owns processed_messages and processed_messages_daily; other packages (retention,
// admin, the CLI) go through these functions rather than holding SQL on them: LookupClaim (was
// this key applied, and when), Stats (claims per consumer and the newest), ClaimHistory (claims
// per time bucket), ClaimConsumers, CountClaims, PruneClaims and PruneDailyClaims (delete
// claims applied before a time, in batches of short transactions), and MaintainDays (drop
// expired day partitions, create days ahead). A deleted claim no longer deduplicates: the
// callers decide when that is safe (package retention).
//
// # Tracing
//
// With an OpenTelemetry SDK installed (Config.TracerProvider, else the global provider), each
// delivery is a consumer span "once process", the child of the W3C trace context the message
// carries in its metadata ("traceparent", "tracestate", stamped by outbox.Writer or any
// propagating publisher), so it continues the producer's trace across the broker; a span of
// another trace already in the message's context (a tracing middleware in front) is linked. It
// carries wmonce.consumer, wmonce.dedupe_key, wmonce.path (the transaction the delivery
// ran in: own_tx, also for a lone message under group commit; group_commit when it ran in a
// group; subscriber_tx), wmonce.duplicate and wmonce.fingerprint_mismatch; the claim, the duplicate
// verdict and the COMMIT are events, the handler and the outbox store child spans, and the
// messages the handler returns are stamped with the delivery's trace. A redelivered copy is a
// span of the same trace marked duplicate.
//
// Where it stops: on the subscriber-transaction path the COMMIT is the subscriber's, after the
// ack; the span ends when the attempt's savepoint is released and says so in an event, and a
// failed subscriber COMMIT shows up only as the redelivery's span. With group commit a
// delivery's span also covers its wait for a lane. The library depends on the OpenTelemetry
// API only: without an SDK every span is a no-op.
package once
