package inbox

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/tracing"
)

// startSpan starts the consumer span of one attempt at row r: a child of the trace context the
// message carries (the producer's, kept by the Receiver in the row's metadata).
func (p *Processor) startSpan(ctx context.Context, r claimedRow, msg *message.Message) (context.Context, trace.Span) {
	return tracing.StartConsumer(ctx, p.tracer, tracing.SpanInbox, msg,
		tracing.Consumer.String(p.config.Consumer), tracing.DedupeKey.String(r.messageID),
		tracing.Attempt.Int(r.attempts), tracing.Destination.String(r.topic))
}

// txSpans holds the spans of the attempts run in one processing transaction, so that they end
// after its COMMIT, which they record. Without one in the context an attempt's span ends when
// its handler's output is stored. A nil *txSpans does nothing.
type txSpans struct {
	mu    sync.Mutex
	spans []trace.Span
}

type txSpansKey struct{}

func withTxSpans(ctx context.Context) (context.Context, *txSpans) {
	s := &txSpans{}
	return context.WithValue(ctx, txSpansKey{}, s), s
}

// finish records the attempt's error on span and ends it, or leaves the ending to the
// transaction's txSpans.
func finishSpan(ctx context.Context, span trace.Span, err error) {
	s, _ := ctx.Value(txSpansKey{}).(*txSpans)
	if s == nil || err != nil {
		tracing.End(span, err)
		return
	}
	s.mu.Lock()
	s.spans = append(s.spans, span)
	s.mu.Unlock()
}

// committed records the COMMIT's outcome on every span of the transaction.
func (s *txSpans) committed(err error) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, span := range s.spans {
		if err != nil {
			span.AddEvent(tracing.EventCommit, trace.WithAttributes(tracing.Outcome.String("failed: "+err.Error())))
		} else {
			span.AddEvent(tracing.EventCommit)
		}
	}
}

// end ends the spans still open: the transaction committed, or was rolled back after its
// handlers succeeded (a lost lease, a failed completion), which the span then says.
func (s *txSpans) end(outcome string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, span := range s.spans {
		if outcome != "" {
			span.SetAttributes(tracing.Outcome.String(outcome))
		}
		span.End()
	}
	s.spans = nil
}
