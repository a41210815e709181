package once_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// One event delivered three times is applied once; the handler's output lands in the outbox in
// the same transaction instead of going to the router's publisher.
func ExampleMiddleware() {
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 4})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	schema := pgtest.NewName("example") // a throw-away schema; normally pgtx.DefaultSchema
	m, _ := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.Exec(`DROP SCHEMA ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) }()
	credits := pgtx.QualifiedName(schema, "cashback_credits")
	_, _ = db.Exec(`CREATE TABLE ` + credits + ` (payment_id text PRIMARY KEY, paise bigint NOT NULL)`)

	mw, err := once.New(db, once.Config{
		Schema: schema, Consumer: "rewards", OutputTopic: "cashback",
	}, nil)
	if err != nil {
		panic(err)
	}
	handler := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+credits+` VALUES ('pay_42', 2400)`); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"paise":2400}`))}, nil
	})

	for range 3 { // a redelivery, a producer retry, a redrive: same event id
		if _, err := handler(message.NewMessage("e-91", []byte(`{"payment_id":"pay_42"}`))); err != nil {
			panic(err)
		}
	}
	var credited, outbox int
	_ = db.QueryRow(`SELECT count(*) FROM ` + credits).Scan(&credited)
	_ = db.QueryRow(`SELECT count(*) FROM ` + pgtx.QualifiedName(schema, "outbox")).Scan(&outbox)
	c := mw.Counters().Consumer("rewards")
	fmt.Printf("credited %d, outbox %d, fresh %d, duplicates %d\n", credited, outbox, c.Fresh, c.Duplicates)
	// Output: credited 1, outbox 1, fresh 1, duplicates 2
}
