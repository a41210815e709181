// Package inbox splits receiving a message from processing it: a Receiver stores every
// delivered message in a PostgreSQL table and acks it as soon as the row is committed; a
// Processor works through the table with a plain Watermill handler, on its own schedule, with
// its own retries, parking and per-key order. Ops gives operators replay, skip, inspection and
// statistics; it is also how retention, admin, metrics and the CLI reach the inbox tables, which
// only this package writes (Consumers, Stats and AllStats, PruneFinished).
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
// The table comes from migration 002 (package migrate).
//
// # Why an inbox
//
// With the effectively-once middleware the broker waits for the handler: a slow handler holds
// its message, and the partition or queue behind it, for its whole run (against visibility
// timeouts and Kafka's max.poll.interval.ms); a poison message blocks its partition until it is
// parked; retries follow the broker's schedule. With the inbox the broker only waits for one
// INSERT; what happens next is decided here.
//
// # Receiving
//
// Each message becomes one row keyed by (consumer, message key). The key comes from a
// wmonce.KeyFunc (default: the Watermill UUID), under the middleware's rules: an empty,
// over-long or non-text key is refused with a permanent error, as is metadata PostgreSQL text
// cannot hold faithfully (see Parking refused messages). The row is inserted with ON CONFLICT
// DO NOTHING: the unique key is the dedupe record, and a copy of a message already in the
// inbox, finished or not, inserts nothing and is acked.
//
// ReceiverConfig.MaxMessageAge is the age guard of the effectively-once middleware, for the
// inbox: a copy whose key is no longer in the inbox (retention deleted its row) and whose event
// occurred longer ago than the limit could be applied a second time. A store-first receiver
// refuses it by parking it: the copy is stored as a FAILED row that names
// wmonce.ErrTooOld, acked, counted (ReceiverCounters.TooOld) and logged as an ALERT, and it
// is processed only if an operator replays it.
//
// Concurrent Handle calls are group-committed: a writer takes every row waiting for it (up to
// BatchSize), inserts them with one INSERT ... SELECT FROM unnest(...) in one implicit
// transaction, and answers every waiting call after the commit (or with the error, and the
// router nacks). A writer does not wait for a batch to fill: a lone message is written at once,
// and under load the next batch gathers while the previous one commits. Watermill's Kafka and
// AMQP subscribers deliver one message at a time per partition or subscription, so batches
// form only where several partitions, subscriptions or handlers deliver at once. Each batch
// that stored something sends one NOTIFY (a NOTIFY takes a lock at commit that serialises
// committing transactions, hence once per batch, not per row). StoreTx is the transactional
// twin for code that stores messages inside its own transaction.
//
// # Parking refused messages
//
// A refused message is never stored in the inbox and never acked by Handle: without more, the
// router nacks it, the broker redelivers it forever, and the partition or queue behind it
// stops. Put Watermill's poison queue in front of the receiver, writing through
// outbox.Writer.ParkingPublisher:
//
//	writer, _ := outbox.NewWriter(outbox.Config{})
//	poison, _ := middleware.PoisonQueueWithFilter(writer.ParkingPublisher(db), "rewards.parked", wmonce.IsPermanent)
//	router.AddConsumerHandler("rewards-inbox", "payments", subscriber, receiver.Handle).AddMiddleware(poison)
//
// A refused message is then stored in the outbox for the poison topic, committed, and only
// then acked; the relay forwards it there, and the messages behind it flow on. Refusals are
// counted (ReceiverCounters.Refused); the poison topic is where a person looks at them.
//
// ParkingPublisher parks every message, including those refused precisely because the outbox
// could not store them as they are either: no UUID (a record from a producer that is not
// Watermill), a UUID or metadata that is not valid UTF-8 text, a metadata key a broker refuses
// (Watermill's _watermill_message_uuid, RabbitMQ's CC and BCC). outbox.Parkable encodes such
// parts and marks the copy;
// outbox.RecoverParked turns a parked copy read from the poison topic back into the original
// UUID, metadata and payload, byte for byte, plus the reason_poisoned, topic_poisoned,
// handler_poisoned and subscriber_poisoned metadata of the poison queue. Do not park through
// outbox.Writer.DBPublisher: it stores byte for byte or refuses, so the messages that most need
// parking would fail to park and be nacked forever. The poison queue is Watermill's, so nothing
// of ours can refuse it at construction (once.Stack does refuse DBPublisher); instead its
// refusal of a poisoned message wraps outbox.ErrNotParking and names ParkingPublisher (the router
// logs it at each nack), and the Receiver logs a warning, once, when a message it refused is
// delivered again: nothing parked it. Transient errors (the database is down) are not permanent:
// they are nacked and redelivered, never parked.
//
// # Processing
//
// Workers claim due PENDING rows with UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP
// LOCKED LIMIT n): concurrent workers and processor instances never wait for each other. A
// claim marks the rows IN_PROGRESS with a random claim token and a lease, and counts an
// attempt. Every later change to the row (DONE, failed attempt, release) is conditional on
// that token, so a worker that lost its lease, and whose row was taken back and claimed again,
// changes nothing: its completion matches no row, its transaction (handler effects included)
// is rolled back, and the conflict is counted (ProcessorCounters.LeaseConflicts).
//
// Each row runs in one transaction: the handler gets it in its message context
// (pgtx.TxFromContext; outbox.Writer.Publisher joins it), messages it returns are stored in the
// outbox (ProcessorConfig.OutputTopic), and the row moves to DONE, all committed together.
// DeliveryFromContext tells the handler which row and attempt it runs. The message is the
// handler's own (the Receiver acked the delivery when it stored the row): a msg.Ack() or
// msg.Nack() in it changes nothing, and is counted (ProcessorCounters.HandlerAcked) and logged
// once as a warning, as in the effectively-once middleware.
//
// A failed attempt (error, panic, HandlerTimeout) is rolled back and recorded with its error;
// the row is due again after Backoff doubling per attempt up to MaxBackoff, drawn between
// half and all of that value. After MaxAttempts, or at once for a wmonce.Permanent error,
// the row is parked as FAILED, the error kept, until an operator replays or skips it.
//
// Leases are renewed every RenewInterval while the handler runs, for at most HandlerTimeout,
// so long handlers keep their rows while a stuck one lets go. The processor takes back expired
// leases every ReapInterval: the row returns to PENDING with the lost attempt counted (so a
// message that kills its worker is parked after MaxAttempts, not retried forever), or to
// FAILED if that was the last attempt.
//
// Finished rows leave the indexes only when VACUUM runs, so a claim that started at the
// oldest id would walk past every row finished since, and draining a backlog would cost time
// quadratic in its size. Claims start above a floor (the smallest id the last claim took) and
// look from the beginning every 100ms (or ten times as long as the last such look took, if
// that is longer, up to a second) and whenever nothing is found above it: a row that becomes claimable below
// the floor (a retry falling due, a key unblocked, a replay) waits at most that much longer.
//
// An attempt that ends its own database connection or process (a terminated backend, SIGKILL,
// an out-of-memory kill) counts toward MaxAttempts: the claim counted it, and nothing gives it
// back, so a message that crashes its worker every time is parked as FAILED, not retried
// forever. A lost connection cannot be told apart from one the message caused, so a database
// restart also costs each row in work one attempt. A row whose last attempt ended that way runs
// alone (never in a TxBatchSize batch, after giving back the rest of its claim), so what its
// neighbours lose to it is the one attempt they shared with it: every row of the claim whose
// leases ran out with it, whether or not its handler had started. They are not parked with it.
// Any further attempt a neighbour loses is its own: its handler failed, outran HandlerTimeout,
// or its lease ran out (mind a short Lease without renewal on a loaded machine).
//
// TxBatchSize > 1 runs several claimed rows in one transaction and completes them with one
// statement; if any of them fails, the whole batch is rolled back and re-run one row per
// transaction. No savepoints are used: a savepoint per row would cost two round trips each,
// and more than 64 subtransactions in one transaction overflow PostgreSQL's per-backend cache
// and slow down every snapshot on the server.
//
// # Order
//
// Rows with an ordering key (ReceiverConfig.OrderingKey) are processed one at a time per key,
// in received order (the row id): a row is eligible only when no older row of its key is
// PENDING, IN_PROGRESS or FAILED. A failing row holds back its own key while it is retried, and
// a FAILED row parks its key until Ops.UnparkKey (replay) or Ops.SkipKey; other keys go on.
// Received order is the broker's order for messages delivered one after another (one partition,
// one queue); messages of one key delivered concurrently have no order to keep. Rows without
// an ordering key are processed in parallel, roughly oldest first.
//
// # Delayed messages and pausing
//
// A message whose metadata carries a delivery time (outbox.MetadataDelayedUntil, Watermill's
// "_watermill_delayed_until" from components/delay) is stored at once and acked, and its first
// attempt waits until that time: the Receiver stores it with next_attempt_at at its due time,
// and processors claim it from then on, within their PollInterval (as a retry's backoff). A
// value that is not a time is refused for good (wmonce.ErrMalformedMetadata). Per-key order
// holds across a delay: a delayed row with an ordering key holds back the later rows of its key
// until it is processed (unlike the outbox relay, whose delayed messages hold back nothing;
// see package outbox, Delayed delivery). Ops.Replay of a row makes it due at once.
//
// Ops.Pause (wmonce pause -consumer, the admin page) pauses a consumer: a row in inbox_paused
// that every claim statement of its processors probes, so that from the moment it commits no
// processor of the consumer, in any process, claims a row (attempts running then finish; rows
// a lease batch claimed before are still processed). The Receiver keeps storing and acking
// messages. Ops.Resume undoes it and notifies the processors, which claim at once where they
// LISTEN. Stats.PausedAt shows it.
//
// # Waking up
//
// A processor keeps one connection LISTENing on the schema's channel; the receiver's NOTIFY
// wakes idle workers at once. Workers also poll every PollInterval, which covers a lost
// connection, a NOTIFY that arrived before LISTEN, and a *sql.DB whose driver is not pgx's
// stdlib (then LISTEN is off).
//
// # Shutdown
//
// Close (or cancelling Run's context) stops claiming and releases at once the claimed rows no
// worker has started. Running handlers get ShutdownGrace to finish and commit; then their
// contexts are cancelled and their transactions rolled back. Every row still claimed is
// released: back to PENDING, due at once, the attempt not counted.
//
// # Guarantees and limits
//
//   - A message acked by the receiver is in the inbox, as durable as its commit. After the ack
//     the inbox row is the only copy: a failover that loses recent commits loses messages the
//     broker has already forgotten (use synchronous replication if that matters).
//   - Each row's handler effects in PostgreSQL, its outbox messages and its DONE commit
//     together: applied once, even when the broker delivered copies or a lease was lost.
//   - Effects outside the database (HTTP calls, e-mails) are at-least-once: a lost lease or a
//     crash before commit runs the handler again. Derive an idempotency key from the Delivery.
//   - Messages the handler emits reach their broker at least once, through the outbox relay.
//   - Nothing is dropped silently: unusable messages are refused (never acked by Handle; parked
//     on a poison topic by a poison queue, see Parking refused messages), failing ones parked
//     as FAILED. Parked messages and rows need a person: alert on ReceiverCounters.Refused,
//     Stats.Failed and Stats.OldestPendingAge.
//   - DONE rows are the dedupe records. PruneFinished removes old ones; keep them longer
//     than any redelivery can come (broker retention, DLQ redrives, offset resets), and set
//     ReceiverConfig.MaxMessageAge a little below that window so that a later copy is parked
//     instead of applied again.
//
// # Costs
//
// Per message: one inserted row (four index entries), two row updates (claim, completion; each
// a new row version, since status is indexed) and a later delete, against the middleware's one
// claim insert. A processor holds Workers connections plus up to three (LISTEN, lease upkeep,
// releases). Dead-letter handling (alerts,
// replay, skip) is yours: Ops provides the tools.
//
// # Tracing
//
// The Receiver is not traced, but it keeps each message's metadata, trace context included.
// The Processor (ProcessorConfig.TracerProvider, else the global provider) runs every attempt
// under a consumer span "inbox process", the child of the trace context the message carries, with
// wmonce.consumer, wmonce.dedupe_key (the message id) and wmonce.attempt; the handler and the
// outbox store are child spans, messages the handler returns carry the attempt's trace, and
// the COMMIT is an event (a TxBatchSize batch's spans end after the batch's
// COMMIT, or say it did not happen). A failed attempt ends its span with the error; the next
// attempt is a new span of the same trace. Where it stops: the claim and the recording of a
// failed attempt (its own statement, after the handler's span ended) are not traced.
package inbox
