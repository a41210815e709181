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
	DefaultSQLSchema           = "wmonce_broker"
	DefaultWatermillSQL        = 4
	DefaultSQLPollInterval     = 100 * time.Millisecond
	DefaultSQLIdlePollInterval = 3 * time.Second
	DefaultSQLBatchSize        = 64
	DefaultSQLAckDeadline      = 30 * time.Second
)

// maxSQLBatchSize bounds SQLConfig.BatchSize.
const maxSQLBatchSize = 1000

// SQLConfig configures Watermill's SQL Pub/Sub.
type SQLConfig struct {
	// WatermillSQL is the major version of watermill-sql the SQL broker runs on: 3
	// (github.com/ThreeDotsLabs/watermill-sql/v3) or 4 (.../v4, over database/sql). Both read
	// and write the same topic and offsets tables with the same queries, so publishers and
	// subscribers of either version share a schema and a consumer group moves from one to the
	// other where it stopped. It decides which watermill-sql TxFromContext finds the
	// subscriber's transaction in a message context (pgtx.SubscriberTxFromContext finds
	// either). Env BROKER_SQL_WATERMILL ("3" or "4"); default DefaultWatermillSQL (4), the
	// version Watermill's examples use.
	WatermillSQL int
	// Schema holds the topic tables (watermill_<topic>, watermill_offsets_<topic>); created if
	// missing. Env BROKER_SQL_SCHEMA; default DefaultSQLSchema ("wmonce_broker").
	Schema string
	// PollInterval is the wait after a query that found nothing when wake-ups are off
	// (DisableListen, a pool whose driver is not pgx) or the LISTEN connection is down; it also
	// caps the re-check backoff (at most 1s) while a notified row is hidden by an older open
	// transaction. Default DefaultSQLPollInterval (100ms).
	PollInterval time.Duration
	// IdlePollInterval is the wait after a query that found nothing while wake-ups work: a
	// subscription queries again when a row is inserted into its topic table (LISTEN/NOTIFY,
	// see NotifyChannel), or after IdlePollInterval if none was. An idle subscription costs one
	// BEGIN/SELECT/COMMIT (and a liveness ping of the pool connection) per IdlePollInterval.
	// Default DefaultSQLIdlePollInterval (3s).
	IdlePollInterval time.Duration
	// DisableListen turns wake-ups off: no LISTEN connection, subscriptions poll every
	// PollInterval (watermill-sql's behaviour). The topic tables get their notify trigger
	// anyway, so other processes sharing the schema can use wake-ups. Each insert into a topic
	// table notifies (one pg_notify per statement, delivered at commit); PostgreSQL serialises
	// the commits of notifying transactions on one server-wide lock, which costs throughput
	// only at thousands of publishing commits per second.
	DisableListen bool
	// BatchSize is how many rows the subscriber reads per transaction. The effectively-once
	// middleware applies each of them in a savepoint of that transaction, so a crash rolls
	// the whole batch back (nothing is lost or half-applied) and a larger batch only means more
	// redone work after a crash. A subscription applies its rows one after another and commits
	// once per batch, so the batch bounds its rate under load: at 1,000 events/s a batch of 64
	// cut the consumer's queueing and PostgreSQL's CPU per message against 10 (docs/performance.md).
	// Above 64 the savepoints that wrote overflow PostgreSQL's per-backend cache of 64
	// subtransactions, and every snapshot taken while that transaction runs must then read
	// pg_subtrans. Default DefaultSQLBatchSize (64).
	BatchSize int
	// AckDeadline nacks a message whose handler has not finished in time; keep it above your
	// slowest handler. A nacked message is re-sent in the subscription's transaction until
	// then, unless that transaction can no longer commit (a lost connection): then the batch
	// is read again at once in a new one (see the package documentation). Default
	// DefaultSQLAckDeadline (30s).
	AckDeadline time.Duration
	// NackDelay is the wait before a nacked message is delivered again (in the subscription's
	// transaction). Default DefaultNackDelay (100ms).
	NackDelay time.Duration
}

func (s *SQLConfig) setDefaults() {
	s.Schema = cmp.Or(s.Schema, DefaultSQLSchema)
	s.WatermillSQL = cmp.Or(s.WatermillSQL, DefaultWatermillSQL)
	s.PollInterval = cmp.Or(s.PollInterval, DefaultSQLPollInterval)
	s.IdlePollInterval = cmp.Or(s.IdlePollInterval, DefaultSQLIdlePollInterval)
	s.BatchSize = cmp.Or(s.BatchSize, DefaultSQLBatchSize)
	s.AckDeadline = cmp.Or(s.AckDeadline, DefaultSQLAckDeadline)
	s.NackDelay = cmp.Or(s.NackDelay, DefaultNackDelay)
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
