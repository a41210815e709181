package scenario

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// EnvHandler selects the consumer process's handler: unset for the ledger (Handler, under
// NewConsumer's stack), HandlerBatch for the ledger written by BatchHandler under the same
// stack, HandlerCounter for CounterHandler under the library's defaults.
const EnvHandler = "E2E_HANDLER"

// HandlerCounter is the EnvHandler value of the read-modify-write counter.
const HandlerCounter = "counter"

// HandlerBatch is the EnvHandler value of the ledger's batch handler (BatchHandler).
const HandlerBatch = "batch"

// CreateCounterTable creates the one-row table CounterHandler updates: how many events were
// applied and the sum of their amounts.
func CreateCounterTable(ctx context.Context, db *sql.DB, schema string) error {
	t := pgtx.QualifiedName(schema, "counter")
	_, err := db.ExecContext(ctx, `CREATE TABLE `+t+` (id int PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL);
INSERT INTO `+t+` VALUES (1, 0, 0)`)
	return err
}

// CounterHandler is a read-modify-write handler like Watermill's exactly-once counter example:
// it reads the counter row, adds one (and the event's amount) in Go, and writes the result back,
// in the middleware's transaction. It is exact only if the transaction it runs in sees no update
// committed after its read (REPEATABLE READ turns such an update into a serialization failure,
// which the middleware retries); `SET n = n + 1` would hide the question.
func CounterHandler(schema string) message.NoPublishHandlerFunc {
	t := pgtx.QualifiedName(schema, "counter")
	read, write := `SELECT n, total FROM `+t+` WHERE id = 1`, `UPDATE `+t+` SET n = $1, total = $2 WHERE id = 1`
	return func(msg *message.Message) error {
		var ev Event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return wmonce.Permanent(fmt.Errorf("payload is not an OrderPlaced event: %w", err))
		}
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message context")
		}
		var n, total int64
		if err := tx.QueryRowContext(msg.Context(), read).Scan(&n, &total); err != nil {
			return err
		}
		_, err := tx.ExecContext(msg.Context(), write, n+1, total+ev.Amount)
		return err
	}
}

// NewCounterConsumer wires sub into a router with CounterHandler under the library's defaults:
// once.New with nothing but the schema and the consumer name, once.Stack with nothing but the
// middleware, and a delivery counter outside it.
func NewCounterConsumer(db *sql.DB, sub message.Subscriber, schema, topic, group, instance string, logger watermill.LoggerAdapter) (*Consumer, error) {
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: group}, logger)
	if err != nil {
		return nil, err
	}
	stack, err := once.Stack(once.StackConfig{Middleware: mw, Logger: logger})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	c := &Consumer{Router: router, Middleware: mw, group: group, instance: instance}
	h := router.AddConsumerHandler(group, topic, sub, CounterHandler(schema))
	h.AddMiddleware(append([]message.HandlerMiddleware{c.countDeliveries}, stack...)...)
	return c, nil
}
