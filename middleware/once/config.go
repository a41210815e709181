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
	"github.com/wmonce/watermill-once/internal/lend"
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

	// Outbox stores the messages the handler returns. Default: a Writer on Schema with
	// OutboxSource.
	Outbox *outbox.Writer
	// OutboxSource is the default Outbox's outbox.Config.Source: the service whose relay forwards
	// these messages when services share one schema (see outbox, Sources). Set it, or pass the
	// service's own Writer as Outbox, wherever the service's relay has a Source: rows of another
	// source are never forwarded by it. Setting both is an error.
	OutboxSource string
	// OutputTopic receives returned messages when the router handler has no publish topic
	// (AddConsumerHandler). When both are set, OutputTopic wins.
	OutputTopic string

	// TxOptions for the transaction the middleware opens. Default: isolation REPEATABLE READ,
	// under which a handler that reads a row and writes back a value computed from it loses no
	// update of a concurrent handler: the write fails with a serialization failure and TxRetry
	// runs the whole transaction again. It does not stop write skew (use SERIALIZABLE or SELECT
	// ... FOR UPDATE). Handlers whose writes do not depend on what they read may set READ
	// COMMITTED to skip retries on contended rows (docs/middleware.md, What a handler runs
	// under). Not used in watermill-sql's subscriber transaction. ReadOnly, or a level PostgreSQL
	// does not have, is refused at construction (pgtx.CheckTxOptions).
	TxOptions *sql.TxOptions
	// TxRetry bounds re-running the whole transaction (claim, handler, outbox) after a
	// serialization failure or deadlock; the handler runs again each time, so effects outside
	// the database would repeat. Default 10 attempts, with RetryPolicy's
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
	// redelivered later. A negative value aborts at once. Default 5s; keep it below the router's
	// CloseTimeout. A deadline set by an outer Timeout middleware is always honoured at once. It
	// does not reach watermill-sql's subscriber transaction, which Router.Close rolls back at once
	// whatever the grace; set DisableSubscriberTxReuse to let such handlers finish within it.
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
	// defaultIsolation is the isolation level of Config.TxOptions when unset: REPEATABLE READ,
	// under which a handler's read-modify-write loses no update (see Config.TxOptions).
	defaultIsolation = sql.LevelRepeatableRead
	// defaultTxRetryAttempts is Config.TxRetry.MaxAttempts when unset. With eight handlers
	// updating one row under REPEATABLE READ, three attempts left about 5% of the messages to
	// the Stack's Retry (BenchmarkIsolationInterleaved); ten left none.
	defaultTxRetryAttempts = 10
	// defaultShutdownGrace is Config.ShutdownGrace when unset.
	defaultShutdownGrace = 5 * time.Second
)

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	lend.KeyDefaults(&c.Key, &c.MaxKeyLength)
	if c.TxOptions == nil {
		c.TxOptions = &sql.TxOptions{Isolation: defaultIsolation}
	}
	c.TxRetry.MaxAttempts = cmp.Or(c.TxRetry.MaxAttempts, defaultTxRetryAttempts)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, defaultShutdownGrace)
	if !c.GroupCommit.Disabled {
		c.GroupCommit.setDefaults()
	}
	lend.AgeGuardDefaults(&c.OccurredAt, &c.Now)
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

// GroupCommitConfig configures group commit, which is on by default: messages that find every
// one of Workers transactions busy wait, and the next transaction to free up claims them with one
// statement, runs their handlers one after another and commits them together; then each is
// acked. A message that finds a transaction free runs at once in one of its own, so with up to
// Workers messages in flight it costs nothing. A grouped handler may run again because a
// neighbour failed (the group is rolled back and runs again without it), so it must touch only
// the database, through the transaction, and be short; a handler that cannot sets Disabled. See
// the package doc (Group commit) and docs/middleware.md; measured figures are in
// docs/performance.md.
type GroupCommitConfig struct {
	// Disabled turns group commit off: every message runs in a transaction of its own, one
	// commit per message, as with one message in flight.
	Disabled bool
	// TxBatchSize caps the messages of one transaction. Default 100, at most 10,000.
	TxBatchSize int
	// Workers is how many transactions (lanes) run at once, each holding one connection; beyond
	// that, messages are grouped. Default 2: fewer lanes make bigger
	// groups (fewer commits); more help when handlers are slow.
	Workers int
	// Linger makes every message wait for company before its group runs, even when a lane is
	// free. Default 0: a message runs at once when a lane is free, and a group is whatever arrived
	// while every lane was busy, so a lone message is never delayed.
	Linger time.Duration
}

// Defaults and limits of GroupCommitConfig.
const (
	defaultGroupCommitTxBatchSize = 100
	defaultGroupCommitWorkers     = 2
	maxGroupCommitTxBatchSize     = 10000
)

func (c *GroupCommitConfig) setDefaults() {
	c.TxBatchSize = cmp.Or(c.TxBatchSize, defaultGroupCommitTxBatchSize)
	c.Workers = cmp.Or(c.Workers, defaultGroupCommitWorkers)
}

func (c GroupCommitConfig) validate() error {
	if c.Disabled {
		return nil
	}
	return errors.Join(
		setup.Between("GroupCommit.TxBatchSize", c.TxBatchSize, 1, maxGroupCommitTxBatchSize),
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
// the outbox's ValidateTopic refuses, a UUID or metadata that is not valid UTF-8 text. Such errors
// are permanent: every retry would return the same message.
var ErrUnstorableOutput = errors.New("once: handler output cannot be stored")
