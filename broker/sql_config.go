package broker

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// The SQL broker's defaults (SQLConfig).
const (
	defaultSQLSchema           = "wmonce_broker"
	defaultWatermillSQL        = 4
	defaultSQLPollInterval     = 100 * time.Millisecond
	defaultSQLIdlePollInterval = 3 * time.Second
	defaultSQLBatchSize        = 64
	defaultSQLAckDeadline      = 30 * time.Second
)

// maxSQLBatchSize bounds SQLConfig.BatchSize.
const maxSQLBatchSize = 1000

// SQLConfig configures Watermill's SQL Pub/Sub.
type SQLConfig struct {
	// WatermillSQL is the watermill-sql major version, 3 or 4 (same tables: they share topics);
	// pgtx.SubscriberTxFromContext finds either's transaction. Env BROKER_SQL_WATERMILL; default 4.
	WatermillSQL int
	// Schema holds the topic tables, created if missing. Env BROKER_SQL_SCHEMA; default
	// "wmonce_broker".
	Schema string
	// PollInterval is the wait after an empty read without wake-ups (DisableListen, a driver
	// other than pgx, LISTEN down). Default 100ms.
	PollInterval time.Duration
	// IdlePollInterval is the wait after an empty read while wake-ups work (an insert wakes the
	// subscription first). Default 3s.
	IdlePollInterval time.Duration
	// DisableListen turns wake-ups off: subscriptions poll every PollInterval (docs/brokers.md,
	// "SQL wake-ups").
	DisableListen bool
	// BatchSize is how many rows a subscription reads and commits per transaction, each in a
	// savepoint (docs/performance.md). Default 64, at most 1000.
	BatchSize int
	// AckDeadline nacks a message whose handler has not finished in time: keep it above the
	// slowest handler. Default 30s.
	AckDeadline time.Duration
	// NackDelay is the wait before a nacked message is delivered again. Default 100ms.
	NackDelay time.Duration
}

func (s *SQLConfig) setDefaults() {
	s.Schema = cmp.Or(s.Schema, defaultSQLSchema)
	s.WatermillSQL = cmp.Or(s.WatermillSQL, defaultWatermillSQL)
	s.PollInterval = cmp.Or(s.PollInterval, defaultSQLPollInterval)
	s.IdlePollInterval = cmp.Or(s.IdlePollInterval, defaultSQLIdlePollInterval)
	s.BatchSize = cmp.Or(s.BatchSize, defaultSQLBatchSize)
	s.AckDeadline = cmp.Or(s.AckDeadline, defaultSQLAckDeadline)
	s.NackDelay = cmp.Or(s.NackDelay, defaultNackDelay)
}

func (s SQLConfig) validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("SQL broker schema ("+EnvSQLSchema+")", s.Schema),
		setup.Between("SQL.BatchSize", s.BatchSize, 1, maxSQLBatchSize),
	}
	if !slices.Contains([]int{3, 4}, s.WatermillSQL) {
		errs = append(errs, fmt.Errorf("SQL.WatermillSQL (%s) is the watermill-sql major version and must be 3 or 4, got %d", EnvSQLWatermill, s.WatermillSQL))
	}
	durations := []time.Duration{s.PollInterval, s.IdlePollInterval, s.AckDeadline, s.NackDelay}
	if slices.ContainsFunc(durations, func(d time.Duration) bool { return d < 0 }) {
		errs = append(errs, errors.New("SQL.PollInterval, IdlePollInterval, AckDeadline and NackDelay must be positive"))
	}
	return errors.Join(errs...)
}
