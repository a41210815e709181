package lend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/outbox"
)

// BatchFunc is a batch handler's function (middleware/once.BatchHandlerFunc).
type BatchFunc func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error)

// Collector gathers the messages batch handlers are called with while a caller runs several
// deliveries' handlers in one transaction (a group, an inbox batch): each batch function then
// runs once, for all of its messages (RunBatch).
type Collector struct {
	// Current is the caller's delivery whose handler runs now; Collect records it with the message.
	Current any

	closed  bool
	last    *message.Message // the message collected last
	order   []any
	batches map[any]*Batch
}

// Batch is one batch function's share of a transaction: its messages, in order.
type Batch struct {
	Run   BatchFunc
	Items []BatchItem
}

// BatchItem is one delivery of a batch: the caller's delivery (Collector.Current) and the
// message its handler was called with (its own copy, the transaction in its context).
type BatchItem struct {
	Delivery any
	Msg      *message.Message
}

type collectorKey struct{}

// WithCollector returns ctx with c, for the handlers run in ctx to find (Collect).
func WithCollector(ctx context.Context, c *Collector) context.Context {
	return context.WithValue(ctx, collectorKey{}, c)
}

// Collect hands msg to the collector in its context, for the batch function key stands for,
// and reports whether there was one still collecting; otherwise the caller runs run itself.
func Collect(msg *message.Message, key any, run BatchFunc) bool {
	c, ok := msg.Context().Value(collectorKey{}).(*Collector)
	if !ok || c.closed {
		return false
	}
	if c.batches == nil {
		c.batches = map[any]*Batch{}
	}
	c.last = msg
	b, seen := c.batches[key]
	if !seen {
		b = &Batch{Run: run}
		c.batches[key] = b
		c.order = append(c.order, key)
	}
	for i, it := range b.Items {
		if it.Delivery == c.Current { // called twice for one delivery (a middleware retried inside): keep the last
			b.Items[i].Msg = msg
			return true
		}
	}
	b.Items = append(b.Items, BatchItem{Delivery: c.Current, Msg: msg})
	return true
}

// Batches stops collecting and returns the batches, in the order of their first message.
func (c *Collector) Batches() []*Batch {
	c.closed = true
	out := make([]*Batch, len(c.order))
	for i, k := range c.order {
		out[i] = c.batches[k]
	}
	return out
}

// RunBatch runs b in tx (ctx carries tx: pgtx.ContextWithTx), as Handle runs one handler: it
// counts handlers that settled their messages (ds[i] is b.Items[i]'s delivery), checks that
// the function left tx open, and stores its output for ds[0].OutputTopic. Any error is the
// batch's as a whole; the caller decides who is at fault.
func (s *Step) RunBatch(ctx context.Context, tx *sql.Tx, b *Batch, ds []Delivery) error {
	msgs := make([]*message.Message, len(b.Items))
	for i, it := range b.Items {
		msgs[i] = it.Msg
	}
	out, err := callBatch(ctx, b.Run, tx, msgs)
	for i, it := range b.Items {
		s.settledByHandler(it.Msg, ds[i])
	}
	if ended := s.Guard.Check(ctx, tx); isEndedTx(ended) {
		if err != nil {
			ended = fmt.Errorf("%w (the batch handler returned: %s)", ended, err.Error())
		}
		return ended
	}
	if err != nil || len(out) == 0 {
		return err
	}
	if ds[0].OutputTopic == "" {
		return wmonce.Permanent(fmt.Errorf("%s: %w: %s", s.Component, wmonce.ErrOutputWithoutTopic, s.NoTopic))
	}
	if len(msgs) == 1 { // a batch of one's outputs are caused by its message, as a handler's are
		ctx = outbox.ContextWithConsumed(ctx, msgs[0])
	}
	if err := s.Outbox.PublishTx(ctx, tx, ds[0].OutputTopic, out...); err != nil {
		return fmt.Errorf("%s: store batch output: %w", s.Component, err)
	}
	return nil
}

// callBatch calls run, turning a panic into a *wmonce.PanicError as callHandler does.
func callBatch(ctx context.Context, run BatchFunc, tx *sql.Tx, msgs []*message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &wmonce.PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return run(ctx, tx, msgs)
}

func isEndedTx(err error) bool { return errors.Is(err, wmonce.ErrHandlerEndedTx) }

// collectedOnly reports whether the handler Handle ran only handed own to a collector: it sent
// nothing to the transaction, and RunBatch checks the transaction after the batch.
func collectedOnly(own *message.Message) bool {
	c, ok := own.Context().Value(collectorKey{}).(*Collector)
	return ok && !c.closed && c.last == own
}
