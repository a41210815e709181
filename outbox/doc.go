// Package outbox stores messages in PostgreSQL inside the transaction that produced them and
// forwards them to a broker after that transaction commits.
//
// Writer.PublishTx writes into a caller's *sql.Tx (the transactional twin of a publisher);
// Writer.Publisher is a message.Publisher that finds the transaction in each message's context,
// for code inside an effectively-once handler; Writer.DBPublisher commits each call on its own.
// Relay reads committed rows in commit order and publishes them to any Watermill publisher.
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
//     payloads may be any bytes.
//   - The relay publishes every committed message at least once, with its original UUID and
//     metadata, in commit order. It records its position after publishing, so after a crash it
//     publishes the last batch again: consumers deduplicate (package middleware does).
//   - Correlation (correlation_id), causation (causation_id: the consumed message's UUID) and
//     the time the event occurred (occurred_at) are stamped on every stored message unless the
//     producer set them.
//
// The relay only sees rows older than the oldest transaction still running on the server, so a
// long-running transaction anywhere on the database delays forwarding (never reorders or loses).
package outbox
