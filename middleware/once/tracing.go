package once

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// startSpan starts the consumer span of one delivery: a child of the trace context the
// message carries (see internal/tracing.StartConsumer). It ends when the middleware returns.
func (e *Middleware) startSpan(ctx context.Context, msg *message.Message) (context.Context, trace.Span) {
	if _, ok := pgtx.SubscriberTxFromContext(ctx); ok && !e.config.DisableSubscriberTxReuse {
		return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg, tracing.Path.String(pathSubscriberTx))
	}
	if e.group != nil {
		// With group commit on, a delivery runs alone or in a group: the path is known only
		// when the queue decides (groupCommitter.submit, tracedPath).
		return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg)
	}
	return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg, tracing.Path.String(pathOwnTx))
}

// The values of the wmonce.path attribute: which transaction a delivery ran in.
const (
	pathOwnTx        = "own_tx"        // one of its own
	pathGroupCommit  = "group_commit"  // a group's, shared with the deliveries that waited with it
	pathSubscriberTx = "subscriber_tx" // watermill-sql's subscriber transaction
)

// tracedPath records which transaction the delivery runs in, once group commit decided it.
func (d *delivery) tracedPath(path string) {
	if d.span != nil {
		d.span.SetAttributes(tracing.Path.String(path))
	}
}

// traced records the delivery's consumer and key on its span.
func (d *delivery) traced(span trace.Span) {
	d.span = span
	span.SetAttributes(tracing.Consumer.String(d.consumer), tracing.DedupeKey.String(d.key))
}

// claimed records a fresh claim.
func (d *delivery) claimed() {
	if d.span != nil {
		d.span.SetAttributes(tracing.Fresh.Bool(true), tracing.Duplicate.Bool(false))
		d.span.AddEvent(tracing.EventClaim, trace.WithAttributes(tracing.Fresh.Bool(true)))
	}
}

// countDuplicate counts a skipped copy and marks its span as a duplicate.
func (d *delivery) countDuplicate() {
	d.counters.duplicates.Add(1)
	if d.span != nil {
		d.span.SetAttributes(tracing.Fresh.Bool(false))
		tracing.MarkDuplicate(d.span, false)
	}
}

// countMismatch counts a duplicate whose payload differs from the applied copy's.
func (d *delivery) countMismatch() {
	d.counters.mismatches.Add(1)
	if d.span != nil {
		d.span.SetAttributes(tracing.FingerprintMismatch.Bool(true))
	}
}

// committed records the outcome of the transaction's COMMIT on the delivery's span.
func (d *delivery) committed(err error) {
	if d.span == nil {
		return
	}
	if err != nil {
		d.span.AddEvent(tracing.EventCommit, trace.WithAttributes(tracing.Outcome.String("failed: "+err.Error())))
		return
	}
	d.span.AddEvent(tracing.EventCommit)
}

// attemptComplete records, on the subscriber-transaction path, that the attempt is done: the
// COMMIT is the subscriber's, after the ack, and is not traced.
func (d *delivery) attemptComplete() {
	if d.span != nil {
		d.span.AddEvent("attempt complete: the subscriber commits it with its offset on ack")
	}
}
