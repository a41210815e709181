package once

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Config configures the effectively-once middleware.
type Config struct {
	// Schema holds processed_messages and the outbox (see package migrate). Default
	// pgtx.DefaultSchema ("wmonce").
	Schema string

	// Consumer scopes dedupe keys: two consumers sharing the table never see each other's keys.
	// Default: the name of the router handler the message arrives at. Set it explicitly when one
	// logical consumer runs under several handler names, or never rename the handler: a new
	// consumer name starts with an empty history and re-applies redelivered messages. A name is
	// checked at construction: not blank, text PostgreSQL can store, at most 255 bytes: Config.Consumer
	// at construction, a handler name at the first message.
	Consumer string

	// Key returns each message's dedupe key. Default KeyFromUUID.
	Key wmonce.KeyFunc
	// MaxKeyLength refuses longer keys (in bytes) as invalid. Default 255, at most
	// 1024.
	MaxKeyLength int

	// RejectFingerprintMismatch turns a duplicate whose payload differs from the applied one
	// into a permanent error (parked by the Stack) instead of an acked, reported duplicate.
	RejectFingerprintMismatch bool

	// Outbox stores the messages the handler returns. Default: a Writer on Schema with OutboxSource.
	Outbox *outbox.Writer
	// OutboxSource is the default Outbox's outbox.Config.Source: the service whose relay forwards
	// these messages when services share one schema (see outbox, Sources). Set it, or pass the
	// service's own Writer as Outbox, wherever the service's relay has a Source: rows of another
	// source are never forwarded by it. Setting both is an error.
	OutboxSource string
	// OutputTopic receives returned messages when the router handler has no publish topic
	// (AddConsumerHandler). When both are set, OutputTopic wins.
	OutputTopic string

	// TxOptions for the transaction the middleware opens. Default: isolation DefaultIsolation
	// (REPEATABLE READ). Handlers run concurrently (Kafka: one per partition; RabbitMQ:
	// AMQPConfig.Workers per subscription; times the consumer instances of the group), and under
	// READ COMMITTED a handler that reads a row and writes back a value computed from it (read a
	// counter, add one, write it) silently loses the updates of handlers that commit in between.
	// Under REPEATABLE READ such a write fails with a serialization failure instead, and TxRetry
	// runs the whole transaction again on a fresh snapshot, so every update counts. REPEATABLE READ
	// does not stop write skew (two handlers each deciding on rows the other writes): use
	// SERIALIZABLE, or SELECT ... FOR UPDATE, for that. The claim itself needs no more than READ
	// COMMITTED (under REPEATABLE READ, a copy whose twin commits while it waits on the key costs
	// one retry): set it for handlers whose writes do not depend on what they read, to skip the
	// retries on contended rows. Not used for messages handled in watermill-sql's subscriber
	// transaction, which its PostgreSQL schemas begin at REPEATABLE READ.
	// ReadOnly, or a level PostgreSQL does not have, is refused at construction
	// (pgtx.CheckTxOptions).
	TxOptions *sql.TxOptions
	// TxRetry bounds re-running the whole transaction (claim, handler, outbox) after a
	// serialization failure or deadlock; the handler runs again each time, so effects outside
	// the database would repeat. Default DefaultTxRetryAttempts attempts, with RetryPolicy's
	// jittered backoff from 5ms: enough for eight handlers updating one row at once. When
	// they are spent the error goes to the Stack's Retry and then nacks the message, which
	// the broker redelivers.
	TxRetry pgtx.RetryPolicy

	// DisableSubscriberTxReuse opens a transaction of our own even when the message comes
	// from watermill-sql's subscriber. By default its transaction is reused (see the package doc).
	DisableSubscriberTxReuse bool

	// SenderMetadataKey names a metadata field that identifies the producer (e.g. "sender" or
	// "service"). Counters are then kept per consumer and sender, so metrics show who sends
	// duplicates. At most 100 senders per consumer are told apart; the rest count as "_other".
	SenderMetadataKey string

	// OccurredAt returns when the event occurred, as carried by the message. Default: the
	// "occurred_at" metadata (RFC 3339) that the outbox stamps. ok=false means the message
	// carries no time. It is called only when MaxMessageAge or PartitionByDay needs the time
	// (the inbox Receiver's rule too); then a malformed value is an error and the message is
	// refused (permanent, wrapping wmonce.ErrMalformedMetadata). Otherwise the metadata is not
	// read at all, whatever its format.
	OccurredAt func(msg *message.Message) (t time.Time, ok bool, err error)

	// MaxMessageAge is the age guard: a copy whose key is not (or no longer) claimed and whose
	// event occurred longer ago than this is refused (a permanent error, parked by the Stack) and
	// reported, instead of being applied: its key may have been deleted by retention after the
	// original was applied. Set it a little below the retention window. Zero disables the guard;
	// messages that carry no time are not checked.
	MaxMessageAge time.Duration

	// PartitionByDay claims keys in processed_messages_daily, partitioned by the UTC day the
	// event occurred (OccurredAt), so that retention drops whole partitions. Every message must
	// then carry its time; one that does not is refused. Missing partitions are created on demand.
	PartitionByDay bool

	// Now is the middleware's clock: the age guard's, and the one that stamps and ages the
	// minutes of duplicates_per_minute. Default time.Now.
	Now func() time.Time

	// GroupCommit groups messages in flight at the same time into one transaction; one message
	// in flight (or up to GroupCommit.Workers) still gets a transaction of its own. On by
	// default; set GroupCommit.Disabled to turn it off. See GroupCommitConfig for what it gains
	// and what it asks of handlers.
	GroupCommit GroupCommitConfig

	// ShutdownGrace is how long a handler already running may go on after the router closes
	// (Router.Close cancels every message context at once). Within it the transaction commits
	// normally; after it the transaction is cancelled and rolled back, and the message is
	// redelivered later. A negative value aborts at once. Default DefaultShutdownGrace (5s); keep it below the router's
	// CloseTimeout. A deadline set by an outer Timeout middleware is always honoured at once.
	//
	// It has no effect on messages handled in watermill-sql's subscriber transaction (the
	// default for messages from that subscriber): the subscriber begins that transaction with
	// its subscription context, which Router.Close cancels, and database/sql rolls a
	// transaction back as soon as its context is cancelled. The running attempt is then rolled
	// back whatever the grace (nothing of it commits, not even the offset) and the message is
	// redelivered when the consumer runs again. Set DisableSubscriberTxReuse to let such
	// handlers finish within the grace in a transaction of their own.
	ShutdownGrace time.Duration

	// TracerProvider traces every delivery: a consumer span per message, the child of the
	// trace context the message carries, with the claim, the duplicate verdict and the commit as
	// events and the handler and the outbox store as child spans (see the package doc, Tracing).
	// It is also the default Outbox's TracerProvider. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// StartCheck, when set, runs once in New with the configured Consumer ("" when it defaults
	// to the handler name) and MaxMessageAge: a check the service wants passed before it
	// consumes, such as the redelivery horizon against the key retention
	// (doctor.OnceStartCheck in ops/doctor). An error fails New.
	StartCheck func(ctx context.Context, consumer string, maxMessageAge time.Duration) error
}

// Defaults of Config.
const (
	// DefaultIsolation is the isolation level of Config.TxOptions when unset: REPEATABLE READ,
	// under which a handler's read-modify-write loses no update (see Config.TxOptions).
	DefaultIsolation = sql.LevelRepeatableRead
	// DefaultTxRetryAttempts is Config.TxRetry.MaxAttempts when unset. With eight handlers
	// updating one row under REPEATABLE READ, three attempts left about 5% of the messages to
	// the Stack's Retry (BenchmarkIsolationInterleaved); ten left none.
	DefaultTxRetryAttempts = 10
	// DefaultShutdownGrace is Config.ShutdownGrace when unset.
	DefaultShutdownGrace = 5 * time.Second
)

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	wmonce.SetKeyDefaults(&c.Key, &c.MaxKeyLength)
	if c.TxOptions == nil {
		c.TxOptions = &sql.TxOptions{Isolation: DefaultIsolation}
	}
	c.TxRetry.MaxAttempts = cmp.Or(c.TxRetry.MaxAttempts, DefaultTxRetryAttempts)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, DefaultShutdownGrace)
	if !c.GroupCommit.Disabled {
		c.GroupCommit.setDefaults()
	}
	wmonce.SetAgeGuardDefaults(&c.OccurredAt, &c.Now, outbox.MetadataOccurredAt)
}

// Validate reports what to fix in a configuration.
func (c Config) Validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.CheckMaxKeyLength(c.MaxKeyLength),
		c.GroupCommit.validate(),
		setup.NotNegative("MaxMessageAge", c.MaxMessageAge),
		setup.NotNegative("TxRetry.MaxAttempts", c.TxRetry.MaxAttempts),
		pgtx.CheckTxOptions("TxOptions", c.TxOptions),
	}
	if c.Outbox != nil && c.OutboxSource != "" {
		errs = append(errs, errors.New("set OutboxSource or Outbox, not both: give the Writer its Source (outbox.Config.Source)"))
	}
	if c.Consumer != "" {
		if err := setup.CheckName("Consumer", c.Consumer); err != nil {
			errs = append(errs, fmt.Errorf("%w; or leave Consumer empty to use the handler name", err))
		}
	}
	if c.OutputTopic != "" {
		if err := outbox.DefaultValidateTopic(c.OutputTopic); err != nil {
			errs = append(errs, fmt.Errorf("OutputTopic: %w", err))
		}
	}
	return errors.Join(errs...)
}
