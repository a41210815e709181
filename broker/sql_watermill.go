package broker

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/testsignal"
)

// The watermill-sql major versions the SQL broker runs on (SQLConfig.WatermillSQL).
//
// Versions 3 and 4 create the same tables and run the same SELECT, INSERT and offset queries
// against them; what differs is their Go API: v4's adapter methods take params structs and
// return errors, its constructors take a Beginner or ContextExecutor instead of a *sql.DB,
// and its subscriber puts a Tx interface (a *StdSQLTx over database/sql) in the message
// context instead of a *sql.Tx. Everything the broker adds on top (tables and offsets declared
// before the first publish, wake-ups, a new transaction when the old one cannot commit) is
// written once against watermillSQL, which each version implements in a few lines
// (sql_watermill_v3.go, sql_watermill_v4.go). The subscriber's transaction is found through
// pgtx.SubscriberTxFromContext, which knows both versions.
//
// Both versions' offsets adapters (declaredOffsetsV3, declaredOffsetsV4) are watermill-sql's
// without the queries its subscriber runs in a transaction of its own at every Subscribe:
// subscriber.Subscribe has run the same ones through Declare already. That transaction needs
// a pool connection inside Subscribe, while the members of one group already subscribed each
// hold one (waiting for the group's offset row lock, or delivering a batch nobody reads until
// Subscribe returns): a program that subscribes as many members of a group as the pool has
// connections before reading any of them deadlocked until AckDeadline, again for every further
// member. Watermill's TestPubSub found it (TestConcurrentSubscribe: 50 members, one pool).

// watermillSQL is one watermill-sql major version, configured with the broker's tables.
type watermillSQL interface {
	// declareQueries returns the queries that create topic's tables and, for a group, the
	// group's starting offset: what watermill-sql's subscriber runs at Subscribe.
	declareQueries(topic, group string) ([]sqlQuery, error)
	newPublisher(logger watermill.LoggerAdapter) (message.Publisher, error)
	// newSubscriber returns watermill-sql's subscriber for group, waiting between queries as
	// backoff says (nil: watermill-sql's default backoff). It does not run the group's
	// starting-offset queries at Subscribe: declare has.
	newSubscriber(group string, backoff sqlBackoff, logger watermill.LoggerAdapter) (message.Subscriber, error)
	// errSubscriberClosed is the version's ErrSubscriberClosed.
	errSubscriberClosed() error
}

// sqlQuery has the fields of watermill-sql's Query, in both versions: either converts to it.
type sqlQuery struct {
	Query string
	Args  []any
}

// toSQLQueries converts either version's queries.
func toSQLQueries[Q ~struct {
	Query string
	Args  []any
}](queries []Q) []sqlQuery {
	out := make([]sqlQuery, len(queries))
	for i, q := range queries {
		out[i] = sqlQuery(q)
	}
	return out
}

// sqlBackoff is watermill-sql's BackoffManager, the same method in both versions.
type sqlBackoff interface {
	HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration
}

// defaultSQLBackoff is watermill-sql's own backoff: poll after an empty query, retry after an
// error (5 polls). v3's DefaultBackoffManager is the same code as v4's, so v4's serves both.
func defaultSQLBackoff(poll time.Duration) sqlBackoff {
	return wsql4.NewDefaultBackoffManager(poll, sqlRetryInterval(poll))
}

// sqlRetryInterval is the wait after a failed query: watermill-sql's RetryInterval.
func sqlRetryInterval(poll time.Duration) time.Duration { return poll * 5 }

// sqlTables names a broker's tables for watermill-sql's adapters.
type sqlTables struct {
	messages, offsets func(topic string) string
}

// sqlSubscriberTimings are the subscriber settings both versions take from SQLConfig.
type sqlSubscriberTimings struct {
	ackDeadline, poll, resend, retry time.Duration
}

// newWatermillSQL returns the version config.WatermillSQL names; its subscriptions report each
// batch they commit on committed.
func newWatermillSQL(db *sql.DB, config SQLConfig, tables sqlTables, committed *testsignal.Signal[string]) (watermillSQL, error) {
	timings := sqlSubscriberTimings{
		ackDeadline: config.AckDeadline,
		poll:        config.PollInterval,
		resend:      config.NackDelay,
		retry:       sqlRetryInterval(config.PollInterval),
	}
	var wm watermillSQL
	switch config.WatermillSQL {
	case 3:
		wm = newWatermillSQLv3(db, config.BatchSize, tables, timings)
	case 4:
		wm = newWatermillSQLv4(db, config.BatchSize, tables, timings)
	default:
		return nil, fmt.Errorf("broker: SQL.WatermillSQL (%s) must be 3 or 4, got %d", EnvSQLWatermill, config.WatermillSQL)
	}
	return signalledSQL{watermillSQL: wm, timings: timings, committed: committed}, nil
}

// signalledSQL is a watermill-sql version whose subscribers report each batch they commit to the
// tests (brokerTestSignals.SQLBatchCommit).
type signalledSQL struct {
	watermillSQL
	timings   sqlSubscriberTimings
	committed *testsignal.Signal[string]
}

func (w signalledSQL) newSubscriber(group string, backoff sqlBackoff, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	if backoff == nil { // what watermill-sql would use
		backoff = defaultSQLBackoff(w.timings.poll)
	}
	return w.watermillSQL.newSubscriber(group, batchSignal{next: backoff, group: group, committed: w.committed}, logger)
}

// batchSignal is next with a test signal: watermill-sql calls HandleError after each query, once
// the query's transaction has ended. A query that acked rows (noMsg false) without an error ended
// it with COMMIT (which may have failed).
type batchSignal struct {
	next      sqlBackoff
	group     string
	committed *testsignal.Signal[string]
}

func (b batchSignal) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if !noMsg && err == nil {
		b.committed.Signal(b.group)
	}
	return b.next.HandleError(logger, noMsg, err)
}

// createMessagesTable is watermill-sql's PostgreSQL messages table (the same in v3 and v4)
// with two column types changed: uuid is TEXT (producer ids longer than 36 characters survive,
// as in the outbox) and payload is BYTEA (payloads need not be JSON). Queries and ordering are
// watermill-sql's own.
func createMessagesTable(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
	"offset"       BIGSERIAL,
	uuid           TEXT      NOT NULL,
	created_at     TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	payload        BYTEA     DEFAULT NULL,
	metadata       JSON      DEFAULT NULL,
	transaction_id xid8      NOT NULL,
	PRIMARY KEY (transaction_id, "offset")
)`
}
