// Package inbox splits receiving a message from processing it: a Receiver stores every
// delivered message in a PostgreSQL table and acks it as soon as the row is committed; a
// Processor works through the table with a plain Watermill handler, with its own retries,
// parking and per-key order. Ops gives operators replay, skip, pause, inspection and statistics;
// the inbox tables (migration 002) are written by this package only. How it works, options
// and examples: docs/inbox.md.
//
//	receiver, _ := inbox.NewReceiver(db, inbox.ReceiverConfig{Consumer: "rewards"}, logger)
//	router.AddConsumerHandler("rewards-inbox", "payments", subscriber, receiver.Handle)
//
//	processor, _ := inbox.NewProcessor(db, grantCashback, inbox.ProcessorConfig{
//		Consumer:    "rewards",
//		OutputTopic: "cashback-granted", // messages the handler returns go to the outbox
//	}, logger)
//	go processor.Run(ctx)
//
// # Guarantees and limits
//
//   - Receiving: the Receiver's transaction stores the message's row (keyed by consumer and
//     dedupe key, ON CONFLICT DO NOTHING: the row is the dedupe record) and nothing else; Handle
//     returns nil, so the router acks, only after that commit. A copy whose key is in the inbox
//     stores nothing and is acked. After the ack the row is the only copy of the message, as
//     durable as the commit (a failover that loses recent commits loses it).
//   - Refusals: a message whose key or metadata cannot be stored is refused with a permanent
//     error, never acked by Handle: put a poison queue writing through
//     outbox.Writer.ParkingPublisher in front of Handle, or it is redelivered forever.
//     ReceiverConfig.MaxMessageAge parks too-old copies of forgotten keys as FAILED rows.
//   - Processing: each row's handler effects in PostgreSQL, the messages it returns (stored in
//     the outbox) and the row's move to DONE commit in one transaction, which the Processor
//     commits, never the handler (one that ends it applies nothing and parks its row:
//     wmonce.ErrHandlerEndedTx). Applied once, even when the broker delivered copies or a lease
//     was lost: a claim holds the row with a token and a lease, every later change is fenced by
//     the token, so a worker that lost its lease changes nothing and its transaction is rolled
//     back.
//   - Retries and parking: a failed attempt (error, panic, HandlerTimeout) is rolled back and
//     retried after an exponential backoff with jitter; after MaxAttempts, or at once for a
//     wmonce.Permanent error, the row is parked as FAILED until Ops.Replay or Ops.Skip. An
//     attempt that kills its worker or its connection still counts (its lease runs out), so a
//     message that crashes its worker is parked, not retried forever.
//   - Order: rows with an ordering key run one at a time per key, in received order (the
//     broker's order for messages delivered one after another); a failing row holds back its
//     key only, a FAILED row parks its key until replayed or skipped. Delayed rows
//     (outbox.MetadataDelayedUntil) wait for their time and hold back their key meanwhile.
//     Rows without a key run in parallel.
//   - Where it stops: effects outside the database (HTTP calls, e-mails) are at-least-once (a
//     lost lease or a crash before commit runs the handler again: derive an idempotency key
//     from the Delivery), and returned messages reach their broker at least once, through the
//     outbox relay. Parked messages and rows need a person: alert on ReceiverCounters.Refused,
//     Stats.Failed and Stats.OldestPendingAge. DONE rows are the dedupe records: PruneFinished
//     must keep them longer than any redelivery can come.
package inbox
