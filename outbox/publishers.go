package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/pgtx"
)

// The Writer's message.Publisher adapters, for code that publishes through Watermill's
// interface rather than calling PublishTx: in the transaction of each message's context
// (Publisher), in a transaction of each call's own (DBPublisher), and for the poison queue
// (ParkingPublisher).

// ErrNotParking is wrapped when a publisher that cannot park every message is used to park one:
// Writer.DBPublisher (it stores byte for byte or refuses, and the messages a consumer refuses are
// often the ones it refuses) or Writer.Publisher (it needs the handler's transaction, which a
// parked message no longer has). A poison queue given either leaves its refused messages nacked
// forever and their partition or queue stopped. Park through Writer.ParkingPublisher.
var ErrNotParking = errors.New("outbox: this publisher cannot park every message: use Writer.ParkingPublisher(db) for a poison queue")

// checkParking returns an error wrapping ErrNotParking when pub is the Writer's Publisher or
// DBPublisher, which cannot serve as a poison queue's publisher; nil for ParkingPublisher and
// for any other publisher (it cannot tell what those do). once.Stack checks its
// PoisonPublisher with it (outboxops.CheckParking); a poison queue built by hand around an
// inbox Receiver (middleware.PoisonQueueWithFilter) has no constructor of ours, so there each
// refusal of a poisoned message says the same (see DBPublisher).
func checkParking(pub message.Publisher) error {
	switch p := pub.(type) {
	case contextPublisher:
		return fmt.Errorf("%w: Writer.Publisher stores in the transaction of each message's context, and a message being parked has none (its handler's was rolled back)", ErrNotParking)
	case dbPublisher:
		if !p.parking {
			return fmt.Errorf("%w: Writer.DBPublisher stores byte for byte or refuses, and refuses exactly the messages a consumer refuses for their UUID or metadata", ErrNotParking)
		}
	}
	return nil
}

// poisoned reports whether msgs come from Watermill's poison queue (it adds reason_poisoned).
func poisoned(msgs []*message.Message) bool {
	for _, m := range msgs {
		if m != nil {
			if _, ok := m.Metadata[middleware.ReasonForPoisonedKey]; ok {
				return true
			}
		}
	}
	return false
}

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
	if !ok && poisoned(msgs) {
		return fmt.Errorf("%w: %w", checkParking(p), pgtx.ErrNoTransaction)
	}
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
// message refused for its UUID or metadata is exactly one DBPublisher refuses to store. A
// refusal of a message from Watermill's poison queue (it carries reason_poisoned) wraps
// ErrNotParking too and says to use ParkingPublisher, so that every nack it causes is logged
// with the fix; once.Stack refuses DBPublisher at construction.
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
	err := pgtx.RunInTx(ctx, p.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return p.w.store(ctx, tx, topic, msgs, !p.parking, nil)
	})
	if err != nil && !p.parking && errors.Is(err, ErrInvalidMessage) && poisoned(msgs) {
		// Used as a poison queue's publisher: the refused message stays nacked, and its
		// partition or queue stopped, until the publisher is replaced.
		return fmt.Errorf("%w: %w", checkParking(p), err)
	}
	return err
}

func (dbPublisher) Close() error { return nil }
