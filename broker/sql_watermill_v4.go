package broker

import (
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermillSQLv4 runs the SQL broker on watermill-sql v4 over database/sql
// (wsql4.BeginnerFromStdSQL): its subscriber delivers in a *wsql4.StdSQLTx wrapping the
// *sql.Tx that the effectively-once middleware joins. Its pgx adapter is not used: no *sql.Tx
// can join a pgx.Tx.
type watermillSQLv4 struct {
	db      wsql4.Beginner
	schema  sqlSchemaV4
	offsets wsql4.DefaultPostgreSQLOffsetsAdapter
	timings sqlSubscriberTimings
}

func newWatermillSQLv4(db *sql.DB, batchSize int, tables sqlTables, timings sqlSubscriberTimings) watermillSQLv4 {
	return watermillSQLv4{
		db: wsql4.BeginnerFromStdSQL(db),
		schema: sqlSchemaV4{wsql4.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: tables.messages,
			SubscribeBatchSize:        batchSize,
		}},
		offsets: wsql4.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: tables.offsets},
		timings: timings,
	}
}

func (w watermillSQLv4) declareQueries(topic, group string) ([]sqlQuery, error) {
	queries, err := w.schema.SchemaInitializingQueries(wsql4.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return nil, err
	}
	offsets, err := w.offsets.SchemaInitializingQueries(wsql4.OffsetsSchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return nil, err
	}
	queries = append(queries, offsets...)
	if group != "" {
		start, err := w.offsets.BeforeSubscribingQueries(wsql4.BeforeSubscribingQueriesParams{Topic: topic, ConsumerGroup: group})
		if err != nil {
			return nil, err
		}
		queries = append(queries, start...)
	}
	return toSQLQueries(queries), nil
}

// newPublisher: v4's Publish runs its INSERT with the first message's context (v3 with
// context.Background), so a message whose context has ended is not published: Publish
// returns the error.
func (w watermillSQLv4) newPublisher(logger watermill.LoggerAdapter) (message.Publisher, error) {
	return wsql4.NewPublisher(w.db, wsql4.PublisherConfig{SchemaAdapter: w.schema}, logger)
}

func (w watermillSQLv4) newSubscriber(group string, backoff sqlBackoff, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	ackDeadline := w.timings.ackDeadline
	return wsql4.NewSubscriber(w.db, wsql4.SubscriberConfig{
		ConsumerGroup:  group,
		AckDeadline:    &ackDeadline,
		PollInterval:   w.timings.poll,
		ResendInterval: w.timings.resend,
		RetryInterval:  w.timings.retry,
		BackoffManager: backoff,
		SchemaAdapter:  w.schema,
		OffsetsAdapter: declaredOffsetsV4{w.offsets},
	}, logger)
}

func (watermillSQLv4) errSubscriberClosed() error { return wsql4.ErrSubscriberClosed }

// sqlSchemaV4 is watermill-sql v4's PostgreSQL schema with the broker's messages table
// (createMessagesTable). The broker declares tables under an advisory lock of its own, so
// v4's schema-initialisation lock is not added.
type sqlSchemaV4 struct {
	wsql4.DefaultPostgreSQLSchema
}

func (s sqlSchemaV4) SchemaInitializingQueries(params wsql4.SchemaInitializingQueriesParams) ([]wsql4.Query, error) {
	return []wsql4.Query{{Query: createMessagesTable(s.MessagesTable(params.Topic))}}, nil
}

// declaredOffsetsV4 is watermill-sql v4's offsets adapter without its Subscribe-time queries
// (see the top of sql_watermill.go).
type declaredOffsetsV4 struct {
	wsql4.DefaultPostgreSQLOffsetsAdapter
}

func (declaredOffsetsV4) BeforeSubscribingQueries(wsql4.BeforeSubscribingQueriesParams) ([]wsql4.Query, error) {
	return nil, nil
}
