// Package outbox stores messages in PostgreSQL inside the transaction that produced them and
// forwards them to a broker after that transaction commits.
//
// Writer.PublishTx writes into a caller's *sql.Tx (the transactional twin of a publisher);
// Writer.Publisher is a message.Publisher that finds the transaction in each message's context,
// for code inside an effectively-once handler; Writer.DBPublisher commits each call on its own,
// and Writer.ParkingPublisher does so for the poison queue, parking any refused message
// (Parkable, RecoverParked).
// Relay reads committed rows and publishes them to any Watermill publisher, in the order
// described under Order.
//
// # Table layout
//
// The outbox is a watermill-sql v3 PostgreSQL topic table ("offset", uuid, created_at, payload,
// metadata, transaction_id) whose payloads are envelopes in the format of Watermill's
// components/forwarder, and outbox_offsets follows watermill-sql's offsets layout. Watermill's own
// forwarder can therefore read it too; Relay is the faster, batched equivalent.
//
// # Guarantees
//
//   - A stored message is visible to the relay if and only if its transaction commits.
//   - Writer stores a message byte for byte or refuses it (ErrInvalidMessage): metadata and
//     UUIDs must be valid UTF-8 text without NUL, since they are stored as JSON and text;
//     payloads may be any bytes. ParkingPublisher stores any message: Parkable encodes and
//     marks what cannot be stored as it is, and RecoverParked restores it.
//   - The relay publishes every committed message at least once, with its original UUID and
//     metadata, in the order described under Order. It records its position after publishing,
//     so after a crash it publishes the last batch again: consumers deduplicate (package
//     middleware does).
//   - Correlation (correlation_id), causation (causation_id: the consumed message's UUID) and
//     the time the event occurred (occurred_at) are stamped on every stored message unless the
//     producer set them; ParkingPublisher stores parked messages as they were received.
//
// # Order
//
// The relay works in rounds. A round takes a snapshot and publishes the rows of every
// transaction that committed since the previous round's snapshot (visible in the new one, not in
// the old one), in the order the rows were inserted: the outbox "offset", drawn from its
// sequence by each INSERT. A round larger than RelayConfig.BatchSize is published over several
// batches before the next round begins. For two committed transactions A and B, A committing
// first:
//
//   - A is visible in every snapshot that shows B, so A's rows are published in B's round or an
//     earlier one, never a later one;
//   - within one round, A's rows come before B's if and only if A inserted its outbox rows
//     before B inserted its.
//
// So producers that serialise on a lock (the aggregate's row lock from SELECT ... FOR UPDATE or
// an UPDATE, or an advisory lock) and write their outbox rows after taking it are published in
// commit order: B cannot insert before A committed. The effectively-once middleware writes a
// handler's returned messages after the handler returns, hence after any lock the handler took.
// A producer that writes its outbox row before taking the lock that serialises it gets
// insertion order instead: if two such transactions land in one round, the one that inserted
// first is published first even when it committed second. Take the lock first, or take a
// transaction-level advisory lock on the ordering key (pg_advisory_xact_lock) right before
// writing to the outbox. Transactions that share no lock are published in an order that may
// differ from their commit order within a round; no snapshot records the order of commits
// between two snapshots. With PublishLanes > 1 the order above holds per LaneKey.
//
// The transaction id (pg_current_xact_id(), the outbox's transaction_id column) is assigned at
// a transaction's first write, not at its commit, so it is not used for order: a handler that
// claims its message first and commits last has the smaller id. Watermill's own SQL Pub/Sub
// (watermill-sql v3, PostgreSQL adapter), and Watermill's forwarder reading this table through
// it, order rows by exactly that (transaction_id, offset) and only show rows below the oldest
// running transaction: first-write order, not commit order, held back by any long transaction.
//
// A row is published in the first round after its transaction commits: a long-running
// transaction elsewhere on the server does not delay the relay (its own rows wait for its
// commit). If the outbox's sequence is given a CACHE above 1, offsets stop following insertion
// order across sessions; keep the default.
//
// # When the broker refuses
//
// The relay tells two kinds of publish failure apart (RelayConfig.IsPermanent; a cancelled
// context, a timeout and a lost connection are always transient):
//
//   - Transient (a topic that does not exist, a partition without a leader, a broker that does
//     not answer): the topic is held. Its rows are copied into outbox_held, in the relay's
//     order, and the relay's position moves on, so the rows of every other topic keep flowing;
//     every later row of the held topic is copied behind them. The held rows are published
//     from there, oldest first, with backoff (Backoff doubling up to MaxBackoff); when none is
//     left the topic is released and its rows are published directly again. So a failing topic
//     delays its own rows only, and keeps their order; the order between topics is not kept
//     while one is held (per-key order is the promise, and a key lives in one topic). Each hold
//     is logged at error level with the topic (and each failed retry of it), counted
//     (RelayCounters.Held, HeldTopics) and listed by Stats (RelayStats.Held), whose backlog
//     and lag include the held rows. A relay that takes over holds what its predecessor held.
//   - For good (an invalid topic name, a record too large, a metadata key the broker reserves):
//     the refused message alone is copied into outbox_rejected with the publisher's error,
//     logged at error level and counted (RelayCounters.Rejected), and the relay goes on. When a
//     call of several messages is refused for good, the relay publishes them again one at a
//     time to find which. A later row with the same ordering key goes on: the rejected row
//     cannot be delivered as it is, and waiting for it would stop its key for good. Fix the
//     cause, then RepublishRejected (wmonce outbox republish, or the admin page) stores the row
//     again at the end of the outbox, behind the rows of its key that went on meanwhile.
//
// A row that cannot be decoded (not an envelope: written by something other than the Writer)
// is rejected the same way.
//
// # Delayed delivery
//
// A message whose metadata carries a delivery time (MetadataDelayedUntil, Watermill's
// "_watermill_delayed_until", set by delay.Message(msg, delay.For(d)) from
// components/delay, or by Writer.PublishTxAt) is stored at once, in the producer's
// transaction, like any other, and published not before that time. When the relay reads a row
// that is not due yet, it copies it into outbox_delayed (with its topic and due time) and its
// position moves on; it publishes the row from there when it is due. It does not poll for it:
// it keeps a timer for the earliest due row (read from outbox_delayed when it starts leading,
// moved earlier by every row it sets aside) beside its PollInterval and wake-ups. The copy is
// safe from Prune, which may delete the original once the position has passed it. A relay
// that takes over publishes what its predecessor set aside.
//
// The order rule: a delivery time is a time, not a place in line. A delayed message holds back
// nothing, not even the later messages of its own partition key, which are published as if it
// were not there; when due, it is published after whatever was published before that moment.
// Give a message that must follow a delayed one the same delay, or a later one. (This is the
// rule of Watermill's delayed SQL Pub/Sub and of schedulers such as River's scheduled_at.)
// Rows due at the same time are published in the order they were stored. A due row of a topic
// the relay holds, or whose publish fails, joins the topic's held rows (When the broker
// refuses) and from then on keeps their order; a due row the broker refuses for good is
// rejected. The metadata travels on with the message, so the inbox Processor at the consumer
// honours it too (and finds it due). RelayStats.Delayed and NextDue show what waits, apart from
// Backlog and Lag: a row waiting for its time is not late. The due time is compared with the
// relay's clock; a time without a zone is refused by the Writer (RFC 3339 has one).
//
// # Pausing a relay
//
// PauseRelay (wmonce pause -relay, the admin page) stores a pause in outbox_offsets.paused_at
// for a relay name: from the moment it commits, no instance of that relay starts publishing
// anything (outbox rows, held rows, delayed rows); rows keep being stored and wait in order.
// The leading instance reads the pause with its position at every round, so it honours it
// within one PollInterval, and at once while it LISTENs: PauseRelay and ResumeRelay notify
// the relay channel. A paused relay keeps its lead (a standby does not take over to publish)
// and asks Writers for no notifications. ResumeRelay undoes it; the relay goes on from its
// position. RelayCounters.Paused and RelayStats.PausedAt show it.
//
// # Sources
//
// Services that share one database may share one schema: each stamps its rows with its name
// (Config.Source) and runs relays with the same RelayConfig.Source, which forward its rows only
// and pass over the others'. Without a Source, rows and relays have the source "" (every row
// written before migration 012 has it), so a single service needs nothing. A relay Name belongs
// to one source: two sources' relays with one name refuse to run (ErrRelaySource) rather than
// share a position. Prune deletes a row once the relays of its source have passed it, so a
// source with no relay keeps its rows, and each relay that passes over such rows logs an error
// naming the source. Give the middleware and the inbox processor the service's Writer
// (their Config.Outbox): a Writer they build themselves stores rows without a source.
//
// # Operations
//
// This package owns outbox, outbox_offsets, outbox_held, outbox_delayed and outbox_rejected;
// retention, admin, metrics and the CLI go through these functions rather than holding SQL on
// them: Status (each relay's backlog, lag, held topics, delayed rows and pause, and the
// rejected rows), Prune (delete old rows the relays of their source have published),
// ForgetRelay (remove a retired relay's position, held and delayed rows, refused while it runs;
// PauseRelay and ResumeRelay, and RepublishRejected (store the rows a relay set aside again;
// the CLI and the admin page list and group them). AdvanceSlotPosition and ForgetSlotPosition
// (with the registration outbox/cdc's connector makes) keep a position for an outbox read through a
// logical replication slot (Debezium, package outbox/cdc), so that Prune deletes what the slot
// has confirmed.
//
// # Backup and restore
//
// A position is made of transaction ids of the cluster that recorded it, which a logical copy
// (pg_dump/pg_restore, a logical-replication move) does not keep. Each position is therefore
// recorded with the outbox "offset" sequence's value (a row written later has a higher offset,
// whatever its transaction id) and the cluster's system identifier (migration 019).
// CheckPositions reports a position recorded on another cluster; the relay then forwards
// nothing and logs at ERROR until RebasePositions (`wmonce rebase`) rebases every position on
// this cluster, republishing every row not provably forwarded; Prune refuses meanwhile, and
// never counts a row written after a position was recorded as forwarded. A restore into a
// cluster whose counter is higher needs nothing: the relay records the new system identifier.
// See docs/operations.md, Backup, restore and moving a database.
//
// # Waking up
//
// The active relay LISTENs on the schema's channel ("wmonce_outbox_" + schema, hashed when
// longer than 63 bytes) on a connection of its own (so it uses two: one holds its leadership
// lock and reads, one listens) and starts a round when woken. When it finds nothing to publish
// it asks the Writers to wake it: the position read of its next round sets
// outbox_offsets.idle_until, and that round looks once more for rows that committed before the
// request. While a request stands, every statement a Writer runs also calls pg_notify on the
// channel; PostgreSQL delivers the notification when the transaction commits, exactly when its
// rows become visible, and folds identical notifications of one transaction into one. A round
// that publishes withdraws the request in its position update, so a busy relay costs the
// Writers nothing; an idle relay renews it every PollInterval, and one that stopped lets it
// lapse after 2×PollInterval+1s.
//
// A Writer decides whether to notify when it stores, so a transaction that stored its rows
// before the request and commits after the round that looked once more sends nothing. It was
// in progress at that round's snapshot, so the relay reads again after 2ms, then 4ms, 8ms,
// ... (at most PollInterval or 1s), until none of the transactions in progress at that
// snapshot still is (RelayCounters.Rechecks). On a quiet server that costs nothing; a long
// transaction elsewhere on the server costs at most two statements a second while it runs.
//
// RelayConfig.PollInterval (default 1s) is only the fallback: an idle relay sends two
// statements per PollInterval. It covers a LISTEN connection that died silently, rows
// inserted without the Writer, and LISTEN being off (RelayConfig.DisableListen, or a *sql.DB
// whose driver is not pgx's stdlib).
//
// The cost of a notification is on the producers: a transaction that notifies takes, at
// commit, a lock that serialises the commits of all notifying transactions on the server
// (including the inbox receiver's). That is why only the transactions that commit while a
// relay waits notify (BenchmarkWriterNotify: see docs/outbox-relay.md, "When the relay wakes").
//
// # Tracing
//
// Writer.PublishTx (Config.TracerProvider) stores messages under an "outbox store" span, the
// child of the caller's span, and stamps each message that carries no trace context yet with
// W3C trace context in its metadata ("traceparent", "tracestate": the keys of
// propagation.TraceContext, which Watermill tracing decorators that propagate over metadata
// read). Without a span in the caller's context nothing is stamped and no span started. The
// Relay (RelayConfig.TracerProvider) publishes each stamped message under an "outbox relay
// publish" span (kind producer), the child of and linked to the producing span, one per
// publish attempt (a failed attempt ends its span with the error) and set in the message's context for a tracing publisher
// decorator; the message's metadata keeps the producer's context, so the consumer's span
// continues that trace. Where it stops: the relay's reads and position updates are not
// traced, and messages stored without trace context are relayed untraced.
package outbox
