package once

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// BatchHandlerFunc applies msgs, fresh messages only, in tx (typically with one statement for
// all of them) and returns the messages to publish, stored in the outbox in tx. A
// *BatchError fails some messages; any other error fails the batch as a whole.
type BatchHandlerFunc func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error)

// BatchHandler returns a handler to register on a router behind the middleware. Messages that
// group commit runs in one transaction reach fn together, once, after the group's claim has
// filtered out copies; a message that runs alone reaches fn as a batch of one. Each message is
// acked only after the commit holding its claim and fn's effects; a failed message never
// commits with the others. See docs/middleware.md for what it asks of fn.
func BatchHandler(fn BatchHandlerFunc) message.HandlerFunc {
	b := &batchHandler{fn: fn}
	return b.handle
}

// BatchError fails the messages it names (the messages fn got) with their errors. They are
// answered alone; fn runs again, in a new transaction, with the rest.
type BatchError struct {
	Failed map[*message.Message]error
}

func (e *BatchError) Error() string {
	parts := make([]string, 0, len(e.Failed))
	for m, err := range e.Failed {
		parts = append(parts, fmt.Sprintf("%s: %v", m.UUID, err))
	}
	slices.Sort(parts)
	return "once: batch: messages failed: " + strings.Join(parts, "; ")
}

// ErrBatchWithoutTx is returned by a BatchHandler called without a transaction in its
// message context: it must run behind the middleware (or in the inbox Processor).
var ErrBatchWithoutTx = errors.New("once: a BatchHandler runs only behind the once middleware or in the inbox Processor, which lend it a transaction")

type batchHandler struct{ fn BatchHandlerFunc }

// handle is the HandlerFunc. Inside a group it hands msg to the group's collector, which runs
// fn once for the group after every handler was called; elsewhere it runs fn with msg alone.
func (b *batchHandler) handle(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	if c, ok := ctx.Value(collectorKey{}).(*batchCollector); ok && c.open {
		c.add(b, msg)
		return nil, nil
	}
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		return nil, wmonce.Permanent(ErrBatchWithoutTx)
	}
	out, err := b.fn(ctx, tx, []*message.Message{msg})
	var be *BatchError
	if errors.As(err, &be) {
		if failed, ok := be.Failed[msg]; ok {
			return nil, cmpErr(failed)
		}
		if len(be.Failed) > 0 {
			return nil, err // names messages fn was not given: fn's mistake, fail it
		}
		err = nil
	}
	return out, err
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("once: batch: message failed without an error")
	}
	return err
}

type collectorKey struct{}

// batchCollector gathers, during a group's apply loop, the messages each batch handler was
// called with, in order.
type batchCollector struct {
	open    bool
	cur     *queued
	order   []*batchHandler
	batches map[*batchHandler][]batchItem
}

type batchItem struct {
	q   *queued
	msg *message.Message // the handler's own message (internal/lend): tx and claim in its context
}

func (c *batchCollector) add(b *batchHandler, msg *message.Message) {
	if c.batches == nil {
		c.batches = map[*batchHandler][]batchItem{}
	}
	items, seen := c.batches[b]
	if !seen {
		c.order = append(c.order, b)
	}
	for i, it := range items {
		if it.q == c.cur { // called twice for one member (a middleware retried inside): keep the last
			items[i].msg = msg
			return
		}
	}
	c.batches[b] = append(items, batchItem{q: c.cur, msg: msg})
}

// bisectError asks the group to run each half in a transaction of its own: a batch failed as a
// whole, and halving it finds the message at fault while the others commit once.
type bisectError struct {
	halves [2][]*queued
	err    error
}

func (e *bisectError) Error() string {
	return "once: batch failed as a whole, bisecting: " + e.err.Error()
}
func (e *bisectError) Unwrap() error { return e.err }

// runBatches runs each batch handler's fn once over the members collected for it, in tx. It
// answers the same way as applyAll: isolated with the members to run again when some failed
// on their own, an error for the group to retry (a lost race) or to bisect (bisectError).
func (g *groupCommitter) runBatches(tx *sql.Tx, fresh []*queued, c *batchCollector) (next []*queued, isolated bool, _ error) {
	c.open = false
	for _, b := range c.order {
		items := c.batches[b]
		err := g.runBatch(tx, b, items)
		if err == nil {
			continue
		}
		var be *BatchError
		if errors.As(err, &be) {
			if failed := batchFailed(items, be); len(failed) > 0 {
				return g.isolateAll(fresh, failed), true, nil
			}
		}
		if pgtx.IsRetryableTx(err) && !wmonce.IsPermanent(err) {
			return fresh, false, err // lost a race: the whole group runs again
		}
		if len(items) == 1 {
			return g.isolateAll(fresh, map[*queued]error{items[0].q: err}), true, nil
		}
		// Failed as a whole: split the batch, the other members going with the first half.
		mid := len(items) / 2
		var h [2][]*queued
		for _, q := range fresh {
			i := slices.IndexFunc(items, func(it batchItem) bool { return it.q == q })
			if i >= mid {
				h[1] = append(h[1], q)
			} else {
				h[0] = append(h[0], q)
			}
		}
		return fresh, false, &bisectError{halves: h, err: err}
	}
	return nil, false, nil
}

// batchFailed maps the members be names to their errors.
func batchFailed(items []batchItem, be *BatchError) map[*queued]error {
	failed := map[*queued]error{}
	for _, it := range items {
		if err, ok := be.Failed[it.msg]; ok {
			failed[it.q] = cmpErr(err)
		}
	}
	return failed
}

// runBatch calls fn for items in tx under a span linked to each message's, checks that fn left
// the transaction open, and stores fn's output.
func (g *groupCommitter) runBatch(tx *sql.Tx, b *batchHandler, items []batchItem) (err error) {
	e := g.e
	msgs := make([]*message.Message, len(items))
	links := make([]trace.Link, 0, len(items))
	for i, it := range items {
		msgs[i] = it.msg
		if s := it.q.Item.d.span; s != nil {
			links = append(links, trace.Link{SpanContext: s.SpanContext()})
		}
	}
	d0 := items[0].q.Item.d
	ctx, span := e.tracer.Start(pgtx.ContextWithTx(context.Background(), tx), spanBatch,
		trace.WithLinks(links...), trace.WithAttributes(tracing.Consumer.String(d0.consumer), attribute.Int(attrBatchSize, len(items))))
	defer func() { tracing.End(span, err) }()
	out, err := callBatch(ctx, b.fn, tx, msgs)
	for _, it := range items {
		d := it.q.Item.d
		e.step.Settled(it.msg, lend.Delivery{Msg: d.msg, Consumer: d.consumer, Key: d.key, HandlerAcked: &d.counters.handlerAcked})
	}
	if ended := e.step.Guard.Check(ctx, tx); isEnded(ended) {
		if err != nil {
			ended = fmt.Errorf("%w (the batch handler returned: %s)", ended, err.Error())
		}
		if len(items) == 1 {
			d0.counters.endedTx.Add(1)
			e.logger.Error("The batch handler ended the transaction it was given (Commit or Rollback): nothing of it was applied; the message is a permanent failure", ended, d0.fields)
		}
		return ended
	}
	if err != nil || len(out) == 0 {
		return err
	}
	if d0.outputTopic == "" {
		return wmonce.Permanent(fmt.Errorf("once: %w: %s", wmonce.ErrOutputWithoutTopic, e.step.NoTopic))
	}
	if err := e.step.Outbox.PublishTx(ctx, tx, d0.outputTopic, out...); err != nil {
		return fmt.Errorf("once: store batch output: %w", err)
	}
	return nil
}

const (
	spanBatch     = "once batch"
	attrBatchSize = "wmonce.batch_size"
)

// callBatch calls fn, turning a panic into a *wmonce.PanicError as for a per-message handler.
func callBatch(ctx context.Context, fn BatchHandlerFunc, tx *sql.Tx, msgs []*message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &wmonce.PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return fn(ctx, tx, msgs)
}

// isolateAll answers each failed member with its error and returns the rest of fresh, to run
// again in a new transaction without them.
func (g *groupCommitter) isolateAll(fresh []*queued, failed map[*queued]error) []*queued {
	var rest []*queued
	for _, q := range fresh {
		err, ok := failed[q]
		if !ok {
			rest = append(rest, q)
			continue
		}
		if !isEnded(err) { // a handler that ended the transaction is counted as such (runBatch)
			q.Item.d.counters.failed.Add(1)
		}
		g.settle(q, err)
		g.testSignals.Isolated.Signal(q.Item.d.key)
	}
	return rest
}
