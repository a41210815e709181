package once

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
	"go.opentelemetry.io/otel/trace"
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
	// checked by wmonce.CheckName (text PostgreSQL can store, at most 255 bytes): Config.Consumer
	// at construction, a handler name at the first message.
	Consumer string

	// Key returns each message's dedupe key. Default KeyFromUUID.
	Key wmonce.KeyFunc
	// MaxKeyLength refuses longer keys (in bytes) as invalid. Default wmonce.DefaultMaxKeyLength
	// (255), at most wmonce.MaxKeyLengthLimit (1024).
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
		wmonce.CheckMaxKeyLength(c.MaxKeyLength),
		c.GroupCommit.validate(),
		setup.NotNegative("MaxMessageAge", c.MaxMessageAge),
		setup.NotNegative("TxRetry.MaxAttempts", c.TxRetry.MaxAttempts),
		pgtx.CheckTxOptions("TxOptions", c.TxOptions),
	}
	if c.Outbox != nil && c.OutboxSource != "" {
		errs = append(errs, errors.New("set OutboxSource or Outbox, not both: give the Writer its Source (outbox.Config.Source)"))
	}
	if c.Consumer != "" {
		if err := wmonce.CheckName("Consumer", c.Consumer); err != nil {
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

// GroupCommitConfig configures group commit, which is on by default: when messages arrive faster
// than Workers transactions can take them (several Kafka partitions, several subscriptions, many handlers), those that find
// every transaction busy are claimed with one statement, handled one after another in ONE
// transaction and committed together, then each is acked. Commits, not handlers, are what a
// PostgreSQL consumer waits on; sharing them raises throughput when many messages are in flight.
//
// It is adaptive: a message that finds a lane (one of Workers transactions) free and nobody
// waiting runs at once, in the caller's goroutine, in a transaction of its own, exactly as without
// group commit; so with one message in flight, or up to Workers, it costs nothing. Only messages
// that arrive while every lane is busy wait, and the next lane to free up takes all of them (up to
// TxBatchSize) as one group.
//
// The guarantee is the same as per-message transactions: each message is acked only after the
// commit that holds its claim, effects and outputs. A message whose handler fails is isolated:
// the group's transaction is rolled back, the failed message is nacked alone, and the others are
// run again in a new transaction (their handlers run twice, the first run leaving no trace). A
// handler that fails with a serialization failure or deadlock is not at fault: the whole group
// runs again, up to TxRetry's attempts, as a per-message transaction would. Messages from
// watermill-sql's subscriber keep using the subscriber's transaction and are not grouped.
//
// What it asks of handlers: that they touch only the database, through the transaction, and
// are short. A handler of a grouped message runs in a goroutine of the group, may run again
// because a neighbour failed (so an effect outside the database, such as an HTTP call or an
// in-memory counter, can repeat even when its own message succeeds: without group commit it
// repeats only when the message's own transaction is retried), and delays every message of its
// group while it runs. A handler that cannot meet that sets Disabled, and every message runs in
// a transaction of its own.
//
// Measured figures are in docs/performance.md; run
// BENCH_IN_FLIGHT=n go test -run '^$' -bench HandlerPathsInterleaved -benchtime 1x ./middleware/once/
// to compare on your machine.
type GroupCommitConfig struct {
	// Disabled turns group commit off: every message runs in a transaction of its own, one
	// commit per message, as with one message in flight.
	Disabled bool
	// TxBatchSize caps the messages of one transaction. Default DefaultGroupCommitTxBatchSize
	// (100), at most MaxGroupCommitTxBatchSize.
	TxBatchSize int
	// Workers is how many transactions (lanes) run at once, each holding one connection; beyond
	// that, messages are grouped. Default DefaultGroupCommitWorkers (2): fewer lanes make bigger
	// groups (fewer commits); more help when handlers are slow.
	Workers int
	// Linger makes every message wait for company before its group runs, even when a lane is
	// free. Default 0: a message runs at once when a lane is free, and a group is whatever arrived
	// while every lane was busy, so a lone message is never delayed.
	Linger time.Duration
}

// Defaults and limits of GroupCommitConfig.
const (
	DefaultGroupCommitTxBatchSize = 100
	DefaultGroupCommitWorkers     = 2
	MaxGroupCommitTxBatchSize     = 10000
)

func (c *GroupCommitConfig) setDefaults() {
	c.TxBatchSize = cmp.Or(c.TxBatchSize, DefaultGroupCommitTxBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultGroupCommitWorkers)
}

func (c GroupCommitConfig) validate() error {
	if c.Disabled {
		return nil
	}
	return errors.Join(
		setup.Between("GroupCommit.TxBatchSize", c.TxBatchSize, 1, MaxGroupCommitTxBatchSize),
		setup.AtLeast("GroupCommit.Workers", c.Workers, 1),
		setup.NotNegative("GroupCommit.Linger", c.Linger),
	)
}

// ErrNoConsumer is returned for a message whose consumer name cannot be determined: no
// Config.Consumer and no handler name in the message context (the middleware runs outside a
// router handler).
var ErrNoConsumer = errors.New("once: no consumer name: set Config.Consumer, or run the middleware inside a Watermill router handler")

// ErrUnstorableOutput is wrapped (with outbox.ErrInvalidMessage, which says why) when the
// handler returns a message the outbox can never store: an empty or over-long UUID, a topic
// the outbox's ValidateTopic refuses, a UUID or metadata that is not valid UTF-8 text. Such errors are permanent: every retry would return the same message.
var ErrUnstorableOutput = errors.New("once: handler output cannot be stored")
