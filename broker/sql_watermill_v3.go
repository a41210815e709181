package broker

import (
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermillSQLv3 runs the SQL broker on watermill-sql v3.
type watermillSQLv3 struct {
	db      *sql.DB
	schema  sqlSchemaV3
	offsets wsql.DefaultPostgreSQLOffsetsAdapter
	timings sqlSubscriberTimings
}

func newWatermillSQLv3(db *sql.DB, batchSize int, tables sqlTables, timings sqlSubscriberTimings) watermillSQLv3 {
	return watermillSQLv3{
		db: db,
		schema: sqlSchemaV3{wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: tables.messages,
			SubscribeBatchSize:        batchSize,
		}},
		offsets: wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: tables.offsets},
		timings: timings,
	}
}

func (w watermillSQLv3) declareQueries(topic, group string) ([]sqlQuery, error) {
	queries := append(w.schema.SchemaInitializingQueries(topic), w.offsets.SchemaInitializingQueries(topic)...)
	if group != "" {
		queries = append(queries, w.offsets.BeforeSubscribingQueries(topic, group)...)
	}
	return toSQLQueries(queries), nil
}

func (w watermillSQLv3) newPublisher(logger watermill.LoggerAdapter) (message.Publisher, error) {
	return wsql.NewPublisher(w.db, wsql.PublisherConfig{SchemaAdapter: w.schema}, logger)
}

func (w watermillSQLv3) newSubscriber(group string, backoff sqlBackoff, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	ackDeadline := w.timings.ackDeadline
	return wsql.NewSubscriber(w.db, wsql.SubscriberConfig{
		ConsumerGroup:  group,
		AckDeadline:    &ackDeadline,
		PollInterval:   w.timings.poll,
		ResendInterval: w.timings.resend,
		RetryInterval:  w.timings.retry,
		BackoffManager: backoff,
		SchemaAdapter:  w.schema,
		OffsetsAdapter: declaredOffsetsV3{w.offsets},
	}, logger)
}

func (watermillSQLv3) errSubscriberClosed() error { return wsql.ErrSubscriberClosed }

// sqlSchemaV3 is watermill-sql v3's PostgreSQL schema with the broker's messages table
// (createMessagesTable).
type sqlSchemaV3 struct {
	wsql.DefaultPostgreSQLSchema
}

func (s sqlSchemaV3) SchemaInitializingQueries(topic string) []wsql.Query {
	return []wsql.Query{{Query: createMessagesTable(s.MessagesTable(topic))}}
}

// declaredOffsetsV3 is watermill-sql v3's offsets adapter without its Subscribe-time queries
// (see the top of sql_watermill.go).
type declaredOffsetsV3 struct {
	wsql.DefaultPostgreSQLOffsetsAdapter
}

func (declaredOffsetsV3) BeforeSubscribingQueries(topic, consumerGroup string) []wsql.Query {
	return nil
}
