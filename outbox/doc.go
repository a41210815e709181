// Package outbox stores messages in PostgreSQL inside the transaction that produced them and
// forwards them to a broker after that transaction commits. docs/outbox-relay.md explains each
// rule below at length, with measurements.
//
// # Writer: what is in the caller's transaction
//
// Writer.PublishTx stores messages in the caller's transaction (Writer.Publisher finds it in
// each message's context, inside an effectively-once handler; Writer.DBPublisher and
// Writer.ParkingPublisher commit each call on their own). A stored message is visible to the
// relay if and only if its transaction commits; nothing is sent to a broker from inside it. It
// is stored byte for byte or refused (ErrInvalidMessage): UUIDs and metadata must be text, the
// payload may be any bytes. Correlation, causation and occurred_at metadata and W3C trace
// context are stamped unless the producer set them. Rows are watermill-sql v3 topic rows whose
// payloads are Watermill forwarder envelopes, plus the columns Debezium reads (outbox/cdc).
//
// # Relay: at least once, in this order
//
// The Relay publishes every committed row at least once, with the UUID and metadata it was
// stored with. It records its position after publishing, so a crash republishes at most one
// batch: consumers deduplicate (the effectively-once middleware does). The broker hop stays
// at-least-once. Rows go out in rounds: each round publishes the rows of the transactions that
// committed since the previous round's snapshot, in insertion order (the outbox "offset").
// Hence, for A committing before B, A's rows go out in B's round or earlier, and within a round
// before B's if A inserted first. Producers that serialise on a lock and write their outbox rows
// after taking it (as the middleware's handlers do) are published in commit order; producers
// that insert before taking the lock get insertion order, and transactions that share no lock
// no commit order within a round. A long transaction elsewhere does not delay a row. With
// PublishLanes > 1 the order holds per LaneKey.
//
// When the broker fails for a topic, the topic is held: its rows wait, in order, in
// outbox_held and are retried with backoff while every other topic goes on (order across
// topics is not kept meanwhile). A row refused for good (RelayConfig.IsPermanent), or that
// cannot be decoded, is set aside in outbox_rejected and the relay goes on, later rows of its
// key too, until an operator republishes it (wmonce outbox republish) at the end of the outbox.
// Every hold and rejection is logged at error level and counted: nothing is dropped silently.
//
// # Parking
//
// Writer.ParkingPublisher, the poison queue's publisher, stores any message: Parkable encodes
// and marks what the outbox or a broker cannot carry as it is, so that a refused message is
// parked (durable before the router acks it) rather than nacked forever; RecoverParked gives
// back the original UUID, metadata and payload.
//
// # Delayed delivery
//
// A message whose metadata carries a delivery time (MetadataDelayedUntil, as set by Watermill's
// components/delay or Writer.PublishTxAt) is stored in the producer's transaction like any
// other and published not before that time, by the relay's clock. A delay is a time, not a
// place in line: a delayed message holds back nothing, not even later messages of its own key;
// give a message that must follow it the same delay or a later one. Rows due at the same time
// go out in the order they were stored.
//
// # Pausing, sources, retention
//
// PauseRelay stops every instance of a relay name from publishing until ResumeRelay; rows keep
// being stored and go out in order afterwards. Services that share a schema each stamp their
// rows with Config.Source and forward only their own (RelayConfig.Source). Prune deletes only
// rows every relay of their source has forwarded.
//
// # Positions after a restore
//
// A relay's position is made of transaction ids, which a logical copy (pg_dump/pg_restore, a
// logical-replication move) does not keep. A position recorded on another cluster is detected:
// the relay then forwards nothing and logs at ERROR, and Prune refuses (ErrPositionsMoved),
// until `wmonce rebase` rebases every position, republishing every row not provably forwarded.
// Nothing unforwarded is lost; rows already forwarded may go out again, which consumers absorb.
// A restore into a cluster whose counter is higher needs nothing (docs/operations.md, Backup,
// restore and moving a database).
//
// # Waking up
//
// The active relay LISTENs on its schema's channel, and while it is idle every Writer
// transaction notifies it at commit, so it wakes when rows become visible; PollInterval is only
// the fallback. A busy relay costs the Writers nothing.
//
// # Tracing
//
// The Writer stores under an "outbox store" span and stamps W3C trace context; the Relay
// publishes each stamped message under an "outbox relay publish" producer span linked to it, so
// the consumer continues the producer's trace. Where it stops: the relay's reads and position
// updates are not traced, and messages stored without trace context are relayed untraced.
package outbox
