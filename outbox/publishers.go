package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/pgtx"
)

// The Writer's message.Publisher adapters, for code that publishes through Watermill's
// interface rather than calling PublishTx: in the transaction of each message's context
// (Publisher), in a transaction of each call's own (DBPublisher), and for the poison queue
// (ParkingPublisher).

// Publisher returns a message.Publisher that stores messages in the transaction found in each
// message's context (pgtx.TxFromContext). Inside an effectively-once handler, give the new
// message the consumed message's context first:
//
//	out := message.NewMessage(watermill.NewUUID(), payload)
//	out.SetContext(msg.Context())
//	err := pub.Publish("topic", out)
//
// A message whose context holds no transaction is refused with pgtx.ErrNoTransaction, never sent
// around the transaction. All messages of one call must share one transaction.
func (w *Writer) Publisher() message.Publisher { return contextPublisher{w} }

type contextPublisher struct{ w *Writer }

func (p contextPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		return fmt.Errorf("outbox: %w: call msg.SetContext(consumed.Context()) inside an effectively-once handler, or use Writer.PublishTx", pgtx.ErrNoTransaction)
	}
	for _, m := range msgs[1:] {
		if other, _ := pgtx.TxFromContext(m.Context()); other != tx {
			return errors.New("outbox: messages of one Publish call carry different transactions in their contexts")
		}
	}
	return p.w.PublishTx(ctx, tx, topic, msgs...)
}

func (contextPublisher) Close() error { return nil }

// DBPublisher returns a message.Publisher that stores each Publish call in a short transaction
// of its own on db, byte for byte or not at all (like PublishTx). Use it where there is no
// business transaction to join. To park refused messages, use ParkingPublisher instead: a
// message refused for its UUID or metadata is exactly one DBPublisher refuses to store.
func (w *Writer) DBPublisher(db *sql.DB) message.Publisher { return dbPublisher{w: w, db: db} }

// ParkingPublisher returns the message.Publisher that parks messages a consumer refused, for
// Watermill's poison queue:
//
//	poison, err := middleware.PoisonQueueWithFilter(writer.ParkingPublisher(db), topic, wmonce.IsPermanent)
//
// Each Publish call is stored in a short transaction of its own on db, as with DBPublisher, so
// the parked message is durable in PostgreSQL before the poison queue lets the router ack it,
// and the relay forwards it to topic. Unlike DBPublisher it never refuses a message for its
// content: each message goes through Parkable first (a missing, over-long or binary UUID,
// binary metadata and metadata keys a broker refuses are encoded and marked),
// so that a message refused because of them is parked rather than nacked forever, blocking its
// partition or queue. RecoverParked restores the original UUID and metadata from the parked
// copy; the payload is stored as it is, any bytes.
//
// A parked copy is stored as the consumer received it, plus Parkable's markers: the Writer's
// stamps (correlation_id, causation_id, occurred_at, trace context) are not added, since it is
// the consumed message itself, not one it caused. It fails only for reasons that are no
// message's fault: a topic that CheckTopic refuses, a nil message or db, a database error.
// once.Stack parks through it by default.
func (w *Writer) ParkingPublisher(db *sql.DB) message.Publisher {
	return dbPublisher{w: w, db: db, parking: true}
}

type dbPublisher struct {
	w       *Writer
	db      *sql.DB
	parking bool
}

func (p dbPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.db == nil {
		if p.parking {
			return errors.New("outbox: ParkingPublisher: db is nil")
		}
		return errors.New("outbox: DBPublisher: db is nil")
	}
	ctx := context.Background()
	if len(msgs) > 0 && msgs[0] != nil {
		ctx = context.WithoutCancel(msgs[0].Context())
	}
	if p.parking {
		parked := make([]*message.Message, len(msgs))
		for i, m := range msgs {
			parked[i] = Parkable(m)
		}
		msgs = parked
	}
	return pgtx.RunInTx(ctx, p.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return p.w.store(ctx, tx, topic, msgs, !p.parking, nil)
	})
}

func (dbPublisher) Close() error { return nil }
