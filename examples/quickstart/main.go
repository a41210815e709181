// Command quickstart is the smallest complete use of watermill-once: one event is delivered
// three times over Watermill's SQL pub/sub and its effect is applied once.
//
//	go run ./examples/quickstart
//
// It needs only PostgreSQL: DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded
// one it starts for the run (not as root; see internal/embeddedpg).
// It ends with one JSON line of what it measured.
//
// This file is the pattern; setup.go is the scaffolding (database, tables, pub/sub, waiting).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
	// PostgreSQL with watermill-once's tables (schema "wmonce") and the business table
	// quickstart_credits, and Watermill's SQL pub/sub on the same database.
	e, err := setUp(ctx, logger)
	if err != nil {
		return err
	}
	defer e.close()

	// The effectively-once middleware around an ordinary handler.
	mw, err := once.New(e.db, once.Config{}, logger)
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
	router.AddConsumerHandler(consumer, topic, e.sub, func(msg *message.Message) error {
		tx, _ := pgtx.TxFromContext(msg.Context()) // the middleware's transaction
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO quickstart_credits (event_id, paise) VALUES ($1, 2400)`, msg.UUID)
		return err
	})
	router.AddMiddleware(stack...)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	// The same event, three times: a producer retry, a redelivery, a redrive.
	eventID := "e-" + watermill.NewShortUUID()
	for range copies {
		if err := e.pub.Publish(topic, message.NewMessage(eventID, []byte(`{"payment_id":"pay_42","paise":120000}`))); err != nil {
			return err
		}
	}
	// Wait until the middleware has seen every copy (applied or absorbed), then count the effect.
	if err := waitUntil(30*time.Second, func() bool { c := mw.Counters(consumer); return c.Fresh+c.Duplicates >= copies }); err != nil {
		return fmt.Errorf("%w: %+v", err, mw.Counters(consumer))
	}
	applied, err := e.credits(ctx, eventID)
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
