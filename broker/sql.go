package broker

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// sqlBroker is Watermill's SQL Pub/Sub with every table in one configured schema.
type sqlBroker struct {
	db      *sql.DB
	config  SQLConfig
	schema  wsql.SchemaAdapter
	offsets wsql.DefaultPostgreSQLOffsetsAdapter
	lockKey int64
	// notifier wakes subscriptions when rows are inserted (see sql_wake.go).
	notifier *sqlNotifier
}

func newSQLBroker(db *sql.DB, config SQLConfig, logger watermill.LoggerAdapter) *sqlBroker {
	s := &sqlBroker{db: db, config: config, lockKey: worker.LockKey("broker", config.Schema)}
	s.schema = sqlSchemaAdapter{
		DefaultPostgreSQLSchema: wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: s.MessagesTable,
			SubscribeBatchSize:        config.BatchSize,
		},
	}
	s.offsets = wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: s.OffsetsTable}
	s.notifier = newSQLNotifier(db, config.NotifyChannel(), logger)
	return s
}

// MessagesTable returns the quoted, schema-qualified table that holds a topic's messages.
// Topics are validated by ValidateTopic before they get here; quoting keeps '-', '$', ':' and
// '.' (allowed in topic names) from reaching SQL unquoted.
func (s *sqlBroker) MessagesTable(topic string) string {
	return pgtx.QualifiedName(s.config.Schema, "watermill_"+topic)
}

// OffsetsTable returns the quoted, schema-qualified table of a topic's consumer group offsets.
func (s *sqlBroker) OffsetsTable(topic string) string {
	return pgtx.QualifiedName(s.config.Schema, "watermill_offsets_"+topic)
}

// sqlSchemaAdapter is watermill-sql's PostgreSQL schema with two column types changed: uuid is
// TEXT (producer ids longer than 36 characters survive, as in the outbox) and payload is BYTEA
// (payloads need not be JSON). Queries and ordering are watermill-sql's own.
type sqlSchemaAdapter struct {
	wsql.DefaultPostgreSQLSchema
}

func (s sqlSchemaAdapter) SchemaInitializingQueries(topic string) []wsql.Query {
	return []wsql.Query{{Query: `CREATE TABLE IF NOT EXISTS ` + s.MessagesTable(topic) + ` (
	"offset"       BIGSERIAL,
	uuid           TEXT      NOT NULL,
	created_at     TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	payload        BYTEA     DEFAULT NULL,
	metadata       JSON      DEFAULT NULL,
	transaction_id xid8      NOT NULL,
	PRIMARY KEY (transaction_id, "offset")
)`}}
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
		queries := append(s.schema.SchemaInitializingQueries(topic), s.offsets.SchemaInitializingQueries(topic)...)
		if group != "" {
			queries = append(queries, s.offsets.BeforeSubscribingQueries(topic, group)...)
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

func (s *sqlBroker) newPublisher(logger watermill.LoggerAdapter) (*wsql.Publisher, error) {
	// Tables are declared by the Broker before the first publish to a topic; watermill-sql's
	// own AutoInitializeSchema would race between processes.
	return wsql.NewPublisher(s.db, wsql.PublisherConfig{SchemaAdapter: s.schema}, logger)
}

// declaredOffsets is the offsets adapter of watermill-sql's subscriber, without the queries it
// runs in a transaction of its own at every Subscribe: subscriber.Subscribe has run the same
// ones through Declare already. That transaction needs a pool connection inside Subscribe, while
// the members of one group already subscribed each hold one (waiting for the group's offset
// row lock, or delivering a batch nobody reads until Subscribe returns): a program that
// subscribes as many members of a group as the pool has connections before reading any of
// them deadlocked until AckDeadline, again for every further member. Watermill's TestPubSub
// found it (TestConcurrentSubscribe: 50 members, one pool).
type declaredOffsets struct {
	wsql.DefaultPostgreSQLOffsetsAdapter
}

func (declaredOffsets) BeforeSubscribingQueries(topic, consumerGroup string) []wsql.Query {
	return nil
}
