package broker

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// sqlBroker is Watermill's SQL Pub/Sub with every table in one configured schema, on the
// watermill-sql major version SQLConfig.WatermillSQL chooses.
type sqlBroker struct {
	db      *sql.DB
	config  SQLConfig
	wm      watermillSQL
	lockKey int64
	// notifier wakes subscriptions when rows are inserted (see sql_wake.go).
	notifier *sqlNotifier
	// moveDetected reports each time a subscription finds its topic table moved (a test
	// signal, sql_move_watch.go).
	moveDetected *testsignal.Signal[string]
}

// newSQLBroker returns the SQL broker; its subscriptions report each batch they commit on
// committed, and each time they find their topic table moved on moveDetected (test signals).
func newSQLBroker(db *sql.DB, config SQLConfig, logger watermill.LoggerAdapter, committed, moveDetected *testsignal.Signal[string]) (*sqlBroker, error) {
	s := &sqlBroker{db: db, config: config, lockKey: worker.LockKey("broker", config.Schema), moveDetected: moveDetected}
	wm, err := newWatermillSQL(db, config, sqlTables{messages: s.MessagesTable, offsets: s.OffsetsTable}, committed)
	if err != nil {
		return nil, err
	}
	s.wm = wm
	s.notifier = newSQLNotifier(db, config.NotifyChannel(), logger)
	return s, nil
}

// MessagesTable returns the quoted, schema-qualified table that holds a topic's messages.
// Topics are validated by validateTopic before they get here; quoting keeps '-', '$', ':' and
// '.' (allowed in topic names) from reaching SQL unquoted.
func (s *sqlBroker) MessagesTable(topic string) string {
	return pgtx.QualifiedName(s.config.Schema, "watermill_"+topic)
}

// OffsetsTable returns the quoted, schema-qualified table of a topic's consumer group offsets.
func (s *sqlBroker) OffsetsTable(topic string) string {
	return pgtx.QualifiedName(s.config.Schema, "watermill_offsets_"+topic)
}

// ensureSchema creates the broker schema and its notification trigger function. Concurrent
// processes serialise on an advisory lock: CREATE ... IF NOT EXISTS alone can still fail with a
// unique violation when two sessions race.
func (s *sqlBroker) ensureSchema(ctx context.Context) error {
	return s.ddl(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgtx.QuoteIdentifier(s.config.Schema)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.notifyFunctionQuery())
		return err
	})
}

// declare creates a topic's tables and, for a group, its starting offset (read from the first
// row), exactly as watermill-sql's subscriber would at Subscribe, but before anything is
// published; and the trigger that notifies subscribers of inserts, also on tables created by
// an earlier version.
func (s *sqlBroker) declare(ctx context.Context, topic, group string) error {
	return s.ddl(ctx, func(ctx context.Context, tx *sql.Tx) error {
		queries, err := s.wm.declareQueries(topic, group)
		if err != nil {
			return fmt.Errorf("declare topic %q: %w", topic, err)
		}
		for _, q := range queries {
			if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
				return fmt.Errorf("declare topic %q: %w", topic, err)
			}
		}
		if err := s.ensureNotifyTrigger(ctx, tx, topic); err != nil {
			return fmt.Errorf("declare topic %q: notify trigger: %w", topic, err)
		}
		return nil
	})
}

func (s *sqlBroker) ddl(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	err := pgtx.RunInTx(ctx, s.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, s.lockKey); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("broker: sql schema %q: %w", s.config.Schema, err)
	}
	return nil
}

func (s *sqlBroker) newPublisher(logger watermill.LoggerAdapter) (message.Publisher, error) {
	// Tables are declared by the Broker before the first publish to a topic; watermill-sql's
	// own AutoInitializeSchema would race between processes.
	return s.wm.newPublisher(logger)
}
