package main

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// runRewards consumes "payments" effectively-once and emits "cashback", until ctx ends. db comes
// from pgtx.Open; subscriber and publisher are any Watermill ones (broker.New builds them for
// Kafka, RabbitMQ or SQL from the environment).
func runRewards(ctx context.Context, db *sql.DB, subscriber message.Subscriber, publisher message.Publisher, logger watermill.LoggerAdapter) error {
	// watermill-once's tables in schema "wmonce" (or print the SQL: `wmonce migrate print`).
	m, err := migrate.New(db, migrate.Config{}, logger)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return err
	}

	// Consumer = handler name, key = message UUID. The Stack retries transient errors, each
	// attempt in a new transaction, and parks permanent ones (no usable key, wmonce.Permanent,
	// a panic) in the outbox for topic once.DefaultPoisonTopic, so they never block a partition.
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
	router.AddMiddleware(stack...)
	router.AddHandler("rewards", "payments", subscriber, "cashback", publisher,
		func(msg *message.Message) ([]*message.Message, error) {
			var payment struct {
				PaymentID string `json:"payment_id"`
				Paise     int64  `json:"paise"`
			}
			if err := json.Unmarshal(msg.Payload, &payment); err != nil {
				return nil, wmonce.Permanent(err) // parked at once, never retried
			}
			cashback := payment.Paise / 50
			tx, _ := pgtx.TxFromContext(msg.Context()) // the middleware's transaction
			if _, err := tx.ExecContext(msg.Context(), // cashback_credits is the application's table
				`INSERT INTO cashback_credits (payment_id, paise) VALUES ($1, $2)`, payment.PaymentID, cashback); err != nil {
				return nil, err
			}
			// Returned messages go to the outbox in the same transaction; the router's publisher
			// never sees them.
			event, err := json.Marshal(map[string]any{"payment_id": payment.PaymentID, "paise": cashback})
			if err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), event)}, nil
		})

	// The relay forwards the outbox (cashback events and parked messages) to the broker after
	// each commit: at least once, original UUIDs, per-key commit order.
	relay, err := outbox.NewRelay(db, publisher, outbox.RelayConfig{}, logger)
	if err != nil {
		return err
	}
	defer relay.Close()
	go func() { _ = relay.Run(ctx) }() // retries database and broker failures itself
	return router.Run(ctx)
}
