package broker

import (
	"cmp"
	"errors"
	"fmt"
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
	// WatermillSQL is the major version of watermill-sql the SQL broker runs on: 3 or 4 (over
	// database/sql). Both use the same tables and queries, so processes on either version share
	// topics and groups. It decides which watermill-sql TxFromContext finds the subscriber's
	// transaction (pgtx.SubscriberTxFromContext finds either). Env BROKER_SQL_WATERMILL ("3" or
	// "4"); default 4, the version Watermill's examples use.
	WatermillSQL int
	// Schema holds the topic tables (watermill_<topic>, watermill_offsets_<topic>); created if
	// missing. Env BROKER_SQL_SCHEMA; default "wmonce_broker".
	Schema string
	// PollInterval is the wait after a query that found nothing when wake-ups are off
	// (DisableListen, a pool whose driver is not pgx) or the LISTEN connection is down; it also
	// caps the re-check backoff (at most 1s) while a notified row is hidden by an older open
	// transaction. Default 100ms.
	PollInterval time.Duration
	// IdlePollInterval is the wait after a query that found nothing while wake-ups work: a
	// subscription queries again when a row is inserted into its topic table (LISTEN/NOTIFY,
	// see NotifyChannel), or after IdlePollInterval if none was. An idle subscription costs one
	// BEGIN/SELECT/COMMIT (and a liveness ping of the pool connection) per IdlePollInterval.
	// Default 3s.
	IdlePollInterval time.Duration
	// DisableListen turns wake-ups off: no LISTEN connection, subscriptions poll every
	// PollInterval (watermill-sql's behaviour). The topic tables keep their notify trigger, so
	// other processes sharing the schema still wake up (docs/brokers.md, "SQL wake-ups").
	DisableListen bool
	// BatchSize is how many rows the subscriber reads per transaction, applied one after
	// another in savepoints of it and committed together: a crash only redoes the batch. At
	// 1,000 events/s 64 cut the consumer's queueing and CPU per message against 10
	// (docs/performance.md); above 64 the savepoints overflow PostgreSQL's per-backend cache of
	// 64 subtransactions, and snapshots must read pg_subtrans. Default 64.
	BatchSize int
	// AckDeadline nacks a message whose handler has not finished in time; keep it above your
	// slowest handler. A nacked message is re-sent in the subscription's transaction until
	// then, unless that transaction can no longer commit (a lost connection): then the batch
	// is read again at once in a new one (docs/brokers.md). Default
	// 30s.
	AckDeadline time.Duration
	// NackDelay is the wait before a nacked message is delivered again (in the subscription's
	// transaction). Default 100ms.
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
	if s.WatermillSQL != 3 && s.WatermillSQL != 4 {
		errs = append(errs, fmt.Errorf("SQL.WatermillSQL (%s) is the watermill-sql major version and must be 3 or 4, got %d", EnvSQLWatermill, s.WatermillSQL))
	}
	if s.PollInterval < 0 || s.IdlePollInterval < 0 || s.AckDeadline < 0 || s.NackDelay < 0 {
		errs = append(errs, errors.New("SQL.PollInterval, IdlePollInterval, AckDeadline and NackDelay must be positive"))
	}
	return errors.Join(errs...)
}
