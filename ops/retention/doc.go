// Package retention deletes what watermill-once no longer needs: expired dedupe claims,
// finished inbox rows and relayed outbox rows, in batches of short transactions, run by one
// instance at a time. It also says when a retention window is too short to be safe.
//
// # Why retention is a correctness setting
//
// A claim (a row of processed_messages) or a finished inbox row is what recognises a
// redelivered copy. Delete it, and a copy arriving afterwards is applied again. The window must
// therefore be longer than the longest time a copy can arrive after its original: the broker's
// retention for a consumer-group offset reset, the age of the oldest message a dead-letter
// redrive may send, the reach of a replay tool. Declare that horizon per consumer
// (Policy.RedeliveryHorizon) and NewJanitor logs an error-level warning for every window
// shorter than it (also returned by Janitor.Warnings and exported as the
// wmonce_retention_warnings gauge).
//
// The middleware's age guard closes the remaining gap: with once.Config.MaxMessageAge
// set a little below Keep, a copy whose event occurred longer ago than that and whose key is
// unknown is refused and logged instead of applied. Claims are kept by processed_at, which is
// never earlier than the event's occurred_at (barring clock skew between producer and
// database), so every copy young enough to pass the guard still finds its claim.
//
// # Use
//
//	j, err := retention.NewJanitor(db, retention.Config{
//		Default:   retention.Policy{Keep: 7 * 24 * time.Hour, RedeliveryHorizon: 3 * 24 * time.Hour},
//		Consumers: map[string]retention.Policy{"ledger": {Keep: 30 * 24 * time.Hour}},
//	}, logger)
//	go j.Run(ctx) // on every instance: one of them works at a time
//	defer j.Close()
//
// One instance works at a time (Run); RunOnce is one round on demand beside it. Purge deletes
// one consumer's claims before a given time; outbox.ForgetRelay removes a retired relay's
// position.
//
// Retention decides when rows go, never how: every delete is an operation of the package that
// owns the table (once.PruneClaims and once.MaintainDays, inbox.PruneFinished,
// outbox.Prune, httpidem.Prune), so what "expired", "finished" and "forwarded" mean is
// defined once, beside the code that writes those rows.
//
// # What a round deletes
//
//   - processed_messages: each consumer's claims older than its Keep, through the
//     (consumer, processed_at) index of migration 005. Consumers not listed in
//     Config.Consumers get Config.Default.
//   - processed_messages_daily (once.Config.PartitionByDay): whole days, dropped with
//     DETACH PARTITION CONCURRENTLY, once the day ended longer ago than the longest Keep of
//     all consumers. The table is shared, so a day can only go when no consumer needs it; a
//     consumer with a shorter window keeps its claims longer there, which is safe. The day of a
//     claim is the UTC day its event occurred, carried by the message (occurred_at, stamped by
//     the outbox), so a copy always meets its original in the same partition. Once the table
//     has a partition, the janitor also creates PartitionsAhead days ahead.
//   - inbox: DONE and SKIPPED rows finished longer ago than the consumer's window (its Policy
//     when listed, InboxKeep otherwise). PENDING, IN_PROGRESS and FAILED rows are never
//     deleted; rows an operator is replaying at that moment are skipped.
//   - outbox: rows older than OutboxKeep that every relay named in outbox_offsets has
//     forwarded. With no relay row at all, nothing is deleted. A relay name that no longer
//     runs holds cleanup back for good: remove it with outbox.ForgetRelay after stopping
//     every instance of it. A relay added later starts from the rows still there. An outbox
//     read by Debezium counts as read by a relay whose position follows the connector's
//     replication slot (outboxops.AdvanceSlotPosition): each round first moves every registered
//     slot position up to what its slot has confirmed (CDCSlots only names slots whose
//     positions must be registered).
//   - http_idempotency_keys, only with HTTPKeysKeep set.
//   - outbox_rejected, only with OutboxRejectedKeep set (rejected_at older than it).
//   - intents, only SENT ones and only with SentIntentsKeep set (sent_at older than it).
//
// Every cut-off is computed by the database clock. Each batch is one statement of at most
// BatchSize rows in a transaction of its own; a round loops until a batch comes back short.
// Without their Keep set, outbox_rejected and intents are never touched.
//
// # Sizing
//
// Rows kept = message rate x window, per consumer; a claim takes about 268 bytes (247 in a day
// partition) with UUID keys, longer keys add their length twice. docs/operations.md has the
// measurement (BenchmarkClaimSize) and an example.
package retention
