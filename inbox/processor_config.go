package inbox

import (
	"cmp"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of ProcessorConfig (its field docs state them).
const (
	defaultProcessorWorkers   = 4
	defaultProcessorBatchSize = 16
	defaultTxBatchSize        = 1
	defaultLease              = 30 * time.Second
	defaultReapInterval       = time.Second
	defaultPollInterval       = time.Second
	defaultMaxAttempts        = 10
	defaultBackoff            = time.Second
	defaultMaxBackoff         = 5 * time.Minute
	defaultShutdownGrace      = 10 * time.Second
	defaultIsolation          = sql.LevelReadCommitted
)

// maxProcessorWorkers bounds ProcessorConfig.Workers.
const maxProcessorWorkers = 1024

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Schema holds the inbox and outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Consumer whose rows this processor works: the ReceiverConfig.Consumer. Required.
	Consumer string

	// Workers process rows concurrently, each in its own transactions. Default 4, at most
	// 1024; the pool needs Workers connections plus three.
	Workers int
	// BatchSize is the most rows a worker claims at once. Default 16, at
	// most MaxBatchSize. Without lease renewal the whole claimed batch must be
	// processed within Lease.
	BatchSize int
	// TxBatchSize > 1 processes that many claimed rows in one transaction and completes them
	// with one statement. If any handler in the batch fails, or a lease was lost, the whole
	// transaction is rolled back and its rows are processed again one per transaction, so
	// handlers must not mind running more than once without effect (their database writes are
	// rolled back; effects outside the database are not). Default 1.
	TxBatchSize int

	// Lease is how long a claim stays valid without renewal. After it, another worker may
	// take the row, and the first worker can no longer complete it. Default 30s.
	Lease time.Duration
	// RenewInterval is how often a worker extends the leases it still holds. Default Lease/3.
	// Negative: never renew (fixed leases: a claim must finish within Lease).
	RenewInterval time.Duration
	// HandlerTimeout bounds one processing transaction (one row, or one TxBatchSize batch).
	// Past it the handler's context is cancelled, its transaction rolled back, the attempt
	// counted as failed, and lease renewal stops so the row can be re-claimed even if the
	// handler ignores its context. Default Lease.
	HandlerTimeout time.Duration
	// ReapInterval is how often expired leases are taken back. Default 1s.
	ReapInterval time.Duration
	// PollInterval is the fallback wait of an idle worker; LISTEN/NOTIFY wakes it earlier when
	// rows arrive. Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: idle workers then only poll. LISTEN is also off
	// when the *sql.DB does not use pgx's stdlib driver.
	DisableListen bool

	// MaxAttempts parks a row as FAILED after this many attempts. Default 10.
	MaxAttempts int
	// Backoff is the delay after the first failed attempt; it doubles per attempt up to
	// MaxBackoff, and each delay is drawn between half and all of that value (jitter).
	// Defaults 1s and 5m.
	Backoff    time.Duration
	MaxBackoff time.Duration

	// ShutdownGrace is how long Close lets running handlers finish before it cancels them and
	// releases their rows. Default 10s; negative: cancel at once.
	ShutdownGrace time.Duration

	// OutputTopic receives the messages the handler returns (through the outbox, in the
	// handler's transaction). Empty: returning messages is a permanent error.
	OutputTopic string
	// Outbox stores returned messages. Default: a Writer on Schema with OutboxSource.
	Outbox *outbox.Writer
	// OutboxSource is the default Outbox's outbox.Config.Source: the service whose relay forwards
	// these messages when services share one schema (see outbox, Sources). Set it, or pass the
	// service's own Writer as Outbox, wherever the service's relay has a Source: rows of another
	// source are never forwarded by it. Setting both is an error.
	OutboxSource string
	// TxOptions of the processing transactions. Default READ COMMITTED: handlers of different
	// rows run at once, so read-modify-write handlers must compute in SQL, lock, or share an
	// ordering key (docs/inbox.md, Isolation). ReadOnly or an unknown level is refused.
	TxOptions *sql.TxOptions
	// TracerProvider traces every attempt (docs/inbox.md, Tracing), and is the default
	// Outbox's. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *ProcessorConfig) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.Workers = cmp.Or(c.Workers, defaultProcessorWorkers)
	c.BatchSize = cmp.Or(c.BatchSize, defaultProcessorBatchSize)
	c.TxBatchSize = cmp.Or(c.TxBatchSize, defaultTxBatchSize)
	c.Lease = cmp.Or(c.Lease, defaultLease)
	c.RenewInterval = cmp.Or(c.RenewInterval, c.Lease/3)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, c.Lease)
	c.ReapInterval = cmp.Or(c.ReapInterval, defaultReapInterval)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, defaultMaxAttempts)
	c.Backoff = cmp.Or(c.Backoff, defaultBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, defaultMaxBackoff)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, defaultShutdownGrace)
	c.TxOptions = cmp.Or(c.TxOptions, &sql.TxOptions{Isolation: defaultIsolation})
}

// Validate reports what to fix in a configuration.
func (c ProcessorConfig) Validate() error {
	return errors.Join(
		pgtx.ValidateIdentifier("schema", c.Schema),
		validateConsumer(c.Consumer),
		setup.Between("Workers", c.Workers, 1, maxProcessorWorkers),
		setup.Between("BatchSize", c.BatchSize, 1, MaxBatchSize),
		refuse(c.TxBatchSize < 1 || c.TxBatchSize > c.BatchSize, "TxBatchSize must be between 1 and BatchSize (%d), got %d", c.BatchSize, c.TxBatchSize),
		setup.AtLeast("Lease", c.Lease, 10*time.Millisecond),
		refuse(c.RenewInterval >= c.Lease, "RenewInterval (%s) must be shorter than Lease (%s), or negative to disable renewal", c.RenewInterval, c.Lease),
		setup.NotNegative("HandlerTimeout", c.HandlerTimeout),
		setup.NotNegative("ReapInterval", c.ReapInterval),
		setup.NotNegative("PollInterval", c.PollInterval),
		setup.AtLeast("MaxAttempts", c.MaxAttempts, 1),
		setup.NotNegative("Backoff", c.Backoff),
		setup.AtLeast("MaxBackoff", c.MaxBackoff, c.Backoff),
		refuse(c.Outbox != nil && c.OutboxSource != "", "set OutboxSource or Outbox, not both: give the Writer its Source (outbox.Config.Source)"),
		checkOutputTopic(c.OutputTopic),
		pgtx.CheckTxOptions("TxOptions", c.TxOptions),
	)
}

// refuse returns the error format says when bad holds, else nil: a check of a Config that no
// setup range check expresses.
func refuse(bad bool, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// checkOutputTopic checks ProcessorConfig.OutputTopic ("": none, returning messages is an error
// at run time).
func checkOutputTopic(topic string) error {
	if topic == "" {
		return nil
	}
	if err := outbox.DefaultValidateTopic(topic); err != nil {
		return fmt.Errorf("OutputTopic: %w", err)
	}
	return nil
}
