// Command quickstart is the smallest complete use of watermill-once: one event is delivered
// three times over Watermill's SQL pub/sub and its effect is applied once.
//
//	go run ./examples/quickstart
//
// It needs only PostgreSQL: DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded
// one it starts for the run (not as root; see internal/embeddedpg).
// It ends with one JSON line of what it measured.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/once"
	"github.com/wmonce/watermill-once/pgtx"
)

const (
	topic    = "quickstart_payments"
	consumer = "quickstart_rewards"
	copies   = 3
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	logger := watermill.NewStdLogger(false, false)
	// DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded one (announced).
	databaseURL, stopDB, err := embeddedpg.DatabaseURL(ctx, embeddedpg.Options{Out: os.Stdout})
	if err != nil {
		return err
	}
	defer func() { _ = stopDB() }()
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{})
	if err != nil {
		return err
	}
	defer db.Close()

	// 1. Tables: watermill-once's (schema "wmonce") and the business table.
	m, err := migrate.New(db, migrate.Config{}, logger)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS quickstart_credits (
		id bigserial PRIMARY KEY, event_id text NOT NULL, paise bigint NOT NULL)`); err != nil {
		return err
	}

	// 2. Watermill's SQL pub/sub on the same database.
	schemaAdapter := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    consumer,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     50 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}

	// 3. The effectively-once middleware around an ordinary handler.
	mw, err := once.New(db, once.Config{}, logger)
	if err != nil {
		return err
	}
	stack, err := once.Stack(once.StackConfig{Middleware: mw, Logger: logger})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddConsumerHandler(consumer, topic, sub, func(msg *message.Message) error {
		tx, _ := pgtx.TxFromContext(msg.Context()) // the middleware's transaction
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO quickstart_credits (event_id, paise) VALUES ($1, 2400)`, msg.UUID)
		return err
	})
	router.AddMiddleware(stack...)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	// 4. The same event, three times: a producer retry, a redelivery, a redrive.
	eventID := "e-" + watermill.NewShortUUID()
	for range copies {
		if err := pub.Publish(topic, message.NewMessage(eventID, []byte(`{"payment_id":"pay_42","paise":120000}`))); err != nil {
			return err
		}
	}
	// Wait until the middleware has seen every copy (applied or absorbed).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c := mw.Counters(consumer); c.Fresh+c.Duplicates >= copies {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %+v after 30s", mw.Counters(consumer))
		}
	}

	applied, err := count(ctx, db, eventID)
	if err != nil {
		return err
	}
	c := mw.Counters(consumer)
	fmt.Printf("event %s: %d copies delivered, handler applied it %d time(s), %d duplicate(s) absorbed\n",
		eventID, c.Fresh+c.Duplicates, applied, c.Duplicates)
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"deliveries": c.Fresh + c.Duplicates,
		"applied":    applied,
		"duplicates": c.Duplicates,
	})
}

func count(ctx context.Context, db *sql.DB, eventID string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM quickstart_credits WHERE event_id = $1`, eventID).Scan(&n)
	return n, err
}
