// Package scenario is the application the end-to-end suite runs: producers that commit an order
// and its event in one transaction, and a consumer that applies each event to a ledger under the
// effectively-once middleware. The suite (in the test process) and the consumer binary (a child
// process the suite kills with SIGKILL) share it.
package scenario

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Environment variables the suite passes to the consumer process, besides the broker's own
// (broker.Config.Environ).
const (
	EnvSchema      = "E2E_SCHEMA"
	EnvTopic       = "E2E_TOPIC"
	EnvPoisonTopic = "E2E_POISON_TOPIC"
	EnvGroup       = "E2E_GROUP"
	EnvInstance    = "E2E_INSTANCE"
	// EnvInOrder, set to 1, keeps each key's events in commit order: no event is sent to a
	// delayed retry, which applies it after later events of its key (the CDC pass checks the
	// order).
	EnvInOrder = "E2E_IN_ORDER"

	// The chaos mode's relay and producer processes.
	EnvRelaySelfKill = "E2E_RELAY_SELF_KILL" // probability of a SIGKILL right after a publish, before the position update
	EnvProduceFrom   = "E2E_PRODUCE_FROM"    // first event number of a producer process
	EnvProduceCount  = "E2E_PRODUCE_COUNT"   // how many events it commits
	EnvProducePace   = "E2E_PRODUCE_PACE"    // its pause between events (a Go duration)
)

// PublishedPrefix starts the lines on which the relay process lists the UUIDs it has just
// published, comma-separated: the suite counts what was published more than once.
const PublishedPrefix = "E2E-PUBLISHED "

// StatsPrefix starts the lines on which the consumer process reports its totals.
const StatsPrefix = "E2E-STATS "

// Event is the payload of an OrderPlaced event.
type Event struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
	Poison  bool   `json:"poison,omitempty"`
}

// Stats are one consumer process's totals, printed as JSON after StatsPrefix.
type Stats struct {
	Instance   string `json:"instance"`
	Deliveries uint64 `json:"deliveries"` // messages handed to the handler by the broker
	Applied    uint64 `json:"applied"`    // fresh messages committed
	Duplicates uint64 `json:"duplicates"` // copies absorbed by the dedupe claim
	Failed     uint64 `json:"failed"`     // attempts rolled back (then retried or parked)
	Produced   uint64 `json:"produced"`   // events committed (producer processes)
	Final      bool   `json:"final"`      // printed at a clean exit
}

// CreateTables creates the business tables in schema: orders (written by producers) and
// ledger (written by the consumer). ledger deliberately has no unique constraint on the event,
// so an event applied twice would show up as two rows instead of an error.
func CreateTables(ctx context.Context, db *sql.DB, schema string) error {
	_, err := db.ExecContext(ctx, `
CREATE TABLE `+pgtx.QualifiedName(schema, "orders")+` (
	id     text PRIMARY KEY,
	amount bigint NOT NULL
);
CREATE TABLE `+pgtx.QualifiedName(schema, "ledger")+` (
	event_id   text        NOT NULL,
	order_id   text        NOT NULL,
	amount     bigint      NOT NULL,
	instance   text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`)
	return err
}

// Produce commits one order and its event in one transaction, trying for up to about 2.5 s
// while connections are terminated. See ProduceUntil.
func Produce(ctx context.Context, db *sql.DB, w *outbox.Writer, schema, topic string, ev Event, key string) error {
	return ProduceUntil(ctx, db, w, schema, topic, ev, key, 2500*time.Millisecond)
}

// ProduceUntil commits one order and its event in one transaction, trying again for up to
// patience while PostgreSQL refuses or drops connections. A transaction whose COMMIT outcome
// is unknown is retried with the same ids; the order's primary key tells whether the first
// attempt committed, so an event is never stored twice.
func ProduceUntil(ctx context.Context, db *sql.DB, w *outbox.Writer, schema, topic string, ev Event, key string, patience time.Duration) error {
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(patience)
	for {
		err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "orders")+` (id, amount) VALUES ($1, $2)`, ev.OrderID, ev.Amount); err != nil {
				return err
			}
			msg := message.NewMessage("evt-"+ev.OrderID, payload)
			msg.Metadata.Set("partition_key", key)
			return w.PublishTx(ctx, tx, topic, msg)
		})
		if err == nil || pgtx.IsUniqueViolation(err) {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("produce %s: %w", ev.OrderID, err)
		}
		time.Sleep(50 * time.Millisecond) // connection terminated or server restarting: try again
	}
}

// ErrPoison is what the handler returns, as a permanent error, for a poison event.
var ErrPoison = errors.New("poison event: refusing to apply it")

// ErrNotYet is what the handler returns, as a transient error, for an event that needs time
// (NeedsTime) on its first delivery: the Stack schedules a delayed retry, which applies it.
var ErrNotYet = errors.New("event needs time: retry it later")

// NeedsTime picks one event in ten, by its order id, to fail until it is a delayed retry.
func NeedsTime(orderID string) bool { return crc32.ChecksumIEEE([]byte(orderID))%10 == 0 }

// notYet reports whether msg, of the event with orderID, is to fail until it is a delayed
// retry: only when delayed retries are on (EnvInOrder unset).
func notYet(delayed bool, orderID string, msg *message.Message) bool {
	return delayed && NeedsTime(orderID) && msg.Metadata.Get(once.MetadataDelayedRetry) == ""
}

// Handler applies an event to the ledger in the middleware's transaction; with delayed, the
// events NeedsTime picks fail until they come back as a delayed retry.
func Handler(schema, instance string, delayed bool) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + pgtx.QualifiedName(schema, "ledger") + ` (event_id, order_id, amount, instance) VALUES ($1, $2, $3, $4)`
	return func(msg *message.Message) error {
		var ev Event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return wmonce.Permanent(fmt.Errorf("payload is not an OrderPlaced event: %w", err))
		}
		if ev.Poison {
			return wmonce.Permanent(ErrPoison)
		}
		if notYet(delayed, ev.OrderID, msg) {
			return ErrNotYet
		}
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message context")
		}
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, ev.OrderID, ev.Amount, instance)
		return err
	}
}

// BatchHandler applies events to the ledger as Handler does, each batch with one multi-row
// INSERT: a poison event, or one that needs time on its first delivery, fails alone (a
// *once.BatchError naming it) with Handler's error.
func BatchHandler(schema, instance string, delayed bool) once.BatchHandlerFunc {
	insert := `INSERT INTO ` + pgtx.QualifiedName(schema, "ledger") + ` (event_id, order_id, amount, instance)
SELECT e.id, e.order_id, e.amount, $4 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS e(id, order_id, amount)`
	return func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		failed := map[*message.Message]error{}
		var ids, orders []string
		var amounts []int64
		for _, msg := range msgs {
			var ev Event
			switch err := json.Unmarshal(msg.Payload, &ev); {
			case err != nil:
				failed[msg] = wmonce.Permanent(fmt.Errorf("payload is not an OrderPlaced event: %w", err))
			case ev.Poison:
				failed[msg] = wmonce.Permanent(ErrPoison)
			case notYet(delayed, ev.OrderID, msg):
				failed[msg] = ErrNotYet
			default:
				ids, orders, amounts = append(ids, msg.UUID), append(orders, ev.OrderID), append(amounts, ev.Amount)
			}
		}
		if len(failed) > 0 {
			return nil, &once.BatchError{Failed: failed}
		}
		_, err := tx.ExecContext(ctx, insert, ids, orders, amounts, instance)
		return nil, err
	}
}

// Consumer is the router setup of one consumer instance.
type Consumer struct {
	Router     *message.Router
	Middleware *once.Middleware
	group      string
	deliveries atomic.Uint64
	instance   string
}

// NewConsumer wires sub into a router: delivery counter -> once.Stack (delayed retries, retry,
// poison queue into the outbox, effectively-once) -> Handler, or BatchHandler when batch is set.
func NewConsumer(db *sql.DB, sub message.Subscriber, schema, topic, poisonTopic, group, instance string, batch, delayed bool, logger watermill.LoggerAdapter) (*Consumer, error) {
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: group}, logger)
	if err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	stack, err := once.Stack(once.StackConfig{
		Middleware:      mw,
		Retry:           retryConfig(),
		PoisonPublisher: w.ParkingPublisher(db),
		PoisonTopic:     poisonTopic,
		DelayedRetries:  []time.Duration{200 * time.Millisecond, time.Second},
		Logger:          logger,
	})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	c := &Consumer{Router: router, Middleware: mw, group: group, instance: instance}
	handler := Handler(schema, instance, delayed)
	if batch {
		bh := once.BatchHandler(BatchHandler(schema, instance, delayed))
		handler = func(msg *message.Message) error { _, err := bh(msg); return err }
	}
	h := router.AddConsumerHandler(group, topic, sub, handler)
	h.AddMiddleware(append([]message.HandlerMiddleware{c.countDeliveries}, stack...)...)
	return c, nil
}

func (c *Consumer) countDeliveries(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		c.deliveries.Add(1)
		return h(msg)
	}
}

// Stats returns the consumer's totals.
func (c *Consumer) Stats() Stats {
	counts := c.Middleware.Counters().Consumer(c.group)
	return Stats{
		Instance:   c.instance,
		Deliveries: c.deliveries.Load(),
		Applied:    counts.Fresh,
		Duplicates: counts.Duplicates,
		Failed:     counts.Failed,
	}
}

// retryConfig retries at once what may pass at once; ErrNotYet goes to the delayed retries.
func retryConfig() wmiddleware.Retry {
	return wmiddleware.Retry{
		MaxRetries: 5, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2,
		ShouldRetry: func(p wmiddleware.RetryParams) bool { return !errors.Is(p.Err, ErrNotYet) },
	}
}
