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

// ErrNotParking is wrapped when Writer.DBPublisher or Writer.Publisher is used to park a
// message: they cannot park every message, so a poison queue given either leaves refused
// messages nacked forever. Park through Writer.ParkingPublisher.
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
// message's context (pgtx.TxFromContext), else refuses them (pgtx.ErrNoTransaction). Inside an
// effectively-once handler, give the new message the consumed message's context first:
//
//	out := message.NewMessage(watermill.NewUUID(), payload)
//	out.SetContext(msg.Context())
//	err := pub.Publish("topic", out)
func (w *Writer) Publisher() message.Publisher { return contextPublisher{w} }

type contextPublisher struct{ w *Writer }

func (p contextPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		if poisoned(msgs) {
			return fmt.Errorf("%w: %w", checkParking(p), pgtx.ErrNoTransaction)
		}
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
// of its own on db, byte for byte or not at all (like PublishTx), for code with no transaction
// to join. It refuses a message from Watermill's poison queue with ErrNotParking: use
// ParkingPublisher there.
func (w *Writer) DBPublisher(db *sql.DB) message.Publisher {
	return dbPublisher{w: w, db: db, name: "DBPublisher"}
}

// ParkingPublisher returns the message.Publisher that parks messages a consumer refused, for
// Watermill's poison queue:
//
//	poison, err := middleware.PoisonQueueWithFilter(writer.ParkingPublisher(db), topic, wmonce.IsPermanent)
//
// Each call is stored in a short transaction of its own, so a parked message is durable before
// the poison queue lets the router ack it. It never refuses a message for its content: each goes
// through Parkable, and is stored as the consumer received it (no stamps). It fails only for
// reasons that are no message's fault: a topic CheckTopic refuses, a nil message or db, a
// database error.
func (w *Writer) ParkingPublisher(db *sql.DB) message.Publisher {
	return dbPublisher{w: w, db: db, parking: true, name: "ParkingPublisher"}
}

type dbPublisher struct {
	w       *Writer
	db      *sql.DB
	parking bool
	name    string // the Writer method that made it, for errors
}

func (p dbPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.db == nil {
		return fmt.Errorf("outbox: %s: db is nil", p.name)
	}
	ctx := context.Background()
	if len(msgs) > 0 && msgs[0] != nil {
		ctx = context.WithoutCancel(msgs[0].Context())
	}
	if p.parking {
		msgs = parkableAll(msgs)
	}
	err := pgtx.RunInTx(ctx, p.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return p.w.store(ctx, tx, topic, msgs, !p.parking, nil)
	})
	if !p.parking && errors.Is(err, ErrInvalidMessage) && poisoned(msgs) {
		// Used as a poison queue's publisher: the refused message stays nacked, and its
		// partition or queue stopped, until the publisher is replaced.
		return fmt.Errorf("%w: %w", checkParking(p), err)
	}
	return err
}

// parkableAll returns msgs through Parkable, in a new slice: the caller's is left as it was.
func parkableAll(msgs []*message.Message) []*message.Message {
	parked := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		parked[i] = Parkable(m)
	}
	return parked
}

func (dbPublisher) Close() error { return nil }
