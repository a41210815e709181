package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is the quickstart's scaffolding: the database and Watermill's SQL pub/sub on it.
type env struct {
	db     *sql.DB
	pub    message.Publisher
	sub    message.Subscriber
	stopDB func() error // stops an embedded PostgreSQL, if one was started
}

// setUp opens DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded one
// (announced), applies watermill-once's migrations, creates the business table and Watermill's
// SQL publisher and subscriber.
func setUp(ctx context.Context, logger watermill.LoggerAdapter) (e *env, err error) {
	databaseURL, stopDB, err := embeddedpg.DatabaseURL(ctx, embeddedpg.Options{Out: os.Stdout})
	if err != nil {
		return nil, err
	}
	e = &env{stopDB: stopDB}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.db, err = pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{}); err != nil {
		return e, err
	}
	m, err := migrate.New(e.db, migrate.Config{}, logger)
	if err != nil {
		return e, err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return e, err
	}
	if _, err := e.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS quickstart_credits (
		id bigserial PRIMARY KEY, event_id text NOT NULL, paise bigint NOT NULL)`); err != nil {
		return e, err
	}

	schemaAdapter := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1}
	if e.pub, err = wsql.NewPublisher(e.db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger); err != nil {
		return e, err
	}
	e.sub, err = wsql.NewSubscriber(e.db, wsql.SubscriberConfig{
		ConsumerGroup:    consumer,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     50 * time.Millisecond,
	}, logger)
	return e, err
}

func (e *env) close() {
	if e.db != nil {
		_ = e.db.Close()
	}
	_ = e.stopDB()
}

// credits counts the business rows written for eventID.
func (e *env) credits(ctx context.Context, eventID string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM quickstart_credits WHERE event_id = $1`, eventID).Scan(&n)
	return n, err
}

// waitUntil checks cond every 20ms (it reads in-memory counters: no query) until it holds or
// timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
	}
	return nil
}
