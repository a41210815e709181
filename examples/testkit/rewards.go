// Package testkit shows the oncetest kit catching a handler bug and passing its fix:
//
//	go test ./examples/testkit/
//
// rewards.go holds two versions of one handler, as an application would have them:
// BuggyRewards writes its cashback row through the pool it was built with, FixedRewards
// through the transaction the middleware lends it. Delivered once each, both give the same
// rows; the kit finds the difference (a connection killed or an attempt retried after the
// pool's write committed applies the cashback twice). rewards_test.go is the test an
// application writes; its events include one the handlers cannot decode and refuse with
// wmonce.Permanent, which the kit expects refused under every fault, not applied. EXAMPLE_SHOW_FAILURE=1 makes the buggy handler's test fail as it would
// in your project, with the kit's report.
package testkit

import (
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/pgtx"
)

// payment is the event the handlers consume.
type payment struct {
	PaymentID string `json:"payment_id"`
	Paise     int64  `json:"paise"`
}

func decode(msg *message.Message) (payment, error) {
	var p payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return p, wmonce.Permanent(err)
	}
	return p, nil
}

func cashbackEvent(p payment) *message.Message {
	event, _ := json.Marshal(map[string]any{"payment_id": p.PaymentID, "paise": p.Paise / 50})
	return message.NewMessage(watermill.NewUUID(), event)
}

// BuggyRewards credits 2% cashback per payment into table, through db: the bug. The write
// commits on its own, before and whatever the middleware's transaction does.
func BuggyRewards(db *sql.DB, table string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p, err := decode(msg)
		if err != nil {
			return nil, err
		}
		if _, err := db.ExecContext(msg.Context(), `INSERT INTO `+table+` (payment_id, paise) VALUES ($1, $2)`, p.PaymentID, p.Paise/50); err != nil {
			return nil, err
		}
		return []*message.Message{cashbackEvent(p)}, nil
	}
}

// FixedRewards is BuggyRewards writing through the transaction of the message context: the
// row commits with the claim and the outbox row, or not at all.
func FixedRewards(table string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p, err := decode(msg)
		if err != nil {
			return nil, err
		}
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return nil, fmt.Errorf("rewards: no transaction in the message context: add once.Middleware")
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+table+` (payment_id, paise) VALUES ($1, $2)`, p.PaymentID, p.Paise/50); err != nil {
			return nil, err
		}
		return []*message.Message{cashbackEvent(p)}, nil
	}
}
