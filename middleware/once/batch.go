package once

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// BatchHandler returns a handler to register on a router behind the middleware, or to give the
// inbox Processor. Messages run in one transaction (a group, an inbox batch) reach fn together,
// once, after the claim has filtered out copies; a message run alone reaches fn as a batch of
// one. Each message is acked only after the commit holding its claim and fn's effects; a
// failed message never commits with the others. See docs/middleware.md.
func BatchHandler(fn BatchHandlerFunc) message.HandlerFunc {
	b := &batchHandler{fn: fn}
	return b.handle
}

// BatchError fails the messages it names (the messages fn got) with their errors. They are
// answered alone; the others run again, in a new transaction, without them. Naming none of
// fn's messages fails the batch as a whole.
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
// message context: it runs only behind the middleware or in the inbox Processor.
var ErrBatchWithoutTx = errors.New("once: a BatchHandler runs only behind the once middleware or in the inbox Processor, which lend it a transaction")

type batchHandler struct{ fn BatchHandlerFunc }

// handle is the HandlerFunc. When its caller runs several deliveries in one transaction, it
// hands msg to the caller's collector (internal/lend), which runs fn once for all of them;
// otherwise it runs fn with msg alone.
func (b *batchHandler) handle(msg *message.Message) ([]*message.Message, error) {
	if lend.Collect(msg, b, lend.BatchFunc(b.fn)) {
		return nil, nil
	}
	ctx := msg.Context()
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		return nil, wmonce.Permanent(ErrBatchWithoutTx)
	}
	out, err := b.fn(ctx, tx, []*message.Message{msg})
	var be *BatchError
	if errors.As(err, &be) {
		if failed, ok := be.Failed[msg]; ok {
			return nil, orFailed(failed)
		}
		return nil, err // names no message fn was given: the batch failed as a whole, as in a group
	}
	return out, err
}

// orFailed is a named message's error, never nil.
func orFailed(err error) error {
	if err == nil {
		return errors.New("once: batch: message failed without an error")
	}
	return err
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

// runBatches runs each batch handler's function once over the members collected for it, in tx.
// It answers as applyAll does: isolated with the members to run again when some failed on
// their own, an error for the group to retry (a lost race) or to bisect (bisectError).
func (g *groupCommitter) runBatches(tx *sql.Tx, fresh []*queued, c *lend.Collector) (next []*queued, isolated bool, _ error) {
	for _, b := range c.Batches() {
		err := g.runBatch(tx, b)
		if err == nil {
			continue
		}
		var be *BatchError
		if errors.As(err, &be) {
			if failed := batchFailed(b, be); len(failed) > 0 {
				return g.isolateAll(fresh, failed), true, nil
			}
		}
		if pgtx.IsRetryableTx(err) && !wmonce.IsPermanent(err) {
			return fresh, false, err // lost a race: the whole group runs again
		}
		if len(b.Items) == 1 {
			q := b.Items[0].Delivery.(*queued)
			if isEnded(err) {
				err = g.e.handlerEndedTx(q.Item.d, err)
			}
			return g.isolateAll(fresh, map[*queued]error{q: err}), true, nil
		}
		// Failed as a whole: split the batch, the group's other members going with the first half.
		mid := len(b.Items) / 2
		second := map[*queued]bool{}
		for _, it := range b.Items[mid:] {
			second[it.Delivery.(*queued)] = true
		}
		var h [2][]*queued
		for _, q := range fresh {
			if second[q] {
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
func batchFailed(b *lend.Batch, be *BatchError) map[*queued]error {
	failed := map[*queued]error{}
	for _, it := range b.Items {
		if err, ok := be.Failed[it.Msg]; ok {
			failed[it.Delivery.(*queued)] = orFailed(err)
		}
	}
	return failed
}

// runBatch runs b in tx under a span linked to each message's consumer span.
func (g *groupCommitter) runBatch(tx *sql.Tx, b *lend.Batch) (err error) {
	e := g.e
	ds := make([]lend.Delivery, len(b.Items))
	links := make([]trace.Link, 0, len(b.Items))
	for i, it := range b.Items {
		d := it.Delivery.(*queued).Item.d
		ds[i] = lend.Delivery{Msg: d.msg, Consumer: d.consumer, Key: d.key, OutputTopic: d.outputTopic, HandlerAcked: &d.counters.handlerAcked}
		if d.span != nil {
			links = append(links, trace.Link{SpanContext: d.span.SpanContext()})
		}
	}
	ctx, span := e.tracer.Start(pgtx.ContextWithTx(context.Background(), tx), spanBatch,
		trace.WithLinks(links...), trace.WithAttributes(tracing.Consumer.String(ds[0].Consumer), attribute.Int(attrBatchSize, len(b.Items))))
	defer func() { tracing.End(span, err) }()
	return e.step.RunBatch(ctx, tx, b, ds)
}

// The batch span: one per run of a batch function, linked to its messages' spans.
const (
	spanBatch     = tracing.SpanBatch
	attrBatchSize = string(tracing.BatchSize)
)

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
		if !isEnded(err) { // counted as HandlerEndedTx (handlerEndedTx)
			q.Item.d.counters.failed.Add(1)
		}
		g.settle(q, err)
		g.testSignals.Isolated.Signal(q.Item.d.key)
	}
	return rest
}
