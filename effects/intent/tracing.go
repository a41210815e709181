package intent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/tracing"
)

// startSpan starts the span of one take of an intent (kind client: it calls the provider, whose
// own instrumentation continues the trace through the context). Its parent is the span that
// recorded the intent (the row's trace context), so the send joins the handler's trace; a span
// of another trace in ctx is linked. Without recorded context it is the child of the span in
// ctx, if any, else a trace of its own.
func (s *Sender) startSpan(ctx context.Context, in Intent, recovered bool) (context.Context, trace.Span) {
	var opts []trace.SpanStartOption
	if recorded := tracing.FromTraceContext(in.TraceParent, in.TraceState); recorded.IsValid() {
		if local := trace.SpanContextFromContext(ctx); local.IsValid() && local.TraceID() != recorded.TraceID() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: local}))
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, recorded)
	}
	opts = append(opts, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(tracing.Channel.String(in.Channel), tracing.IntentKey.String(in.Key),
			tracing.IdempotencyKey.String(in.Key), tracing.Attempt.Int(in.Attempts),
			tracing.Consumer.String(in.Consumer), tracing.MessageID.String(in.EventID),
			attribute.Bool("wmonce.intent.recovered", recovered)))
	return s.tracer.Start(ctx, tracing.SpanIntentSend, opts...)
}

// traceOutcome records the state the intent reached on the span in ctx.
func traceOutcome(ctx context.Context, outcome string, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(append(attrs, tracing.Outcome.String(outcome))...)
	if outcome == string(StatusFailed) || outcome == string(StatusSkipped) {
		span.SetStatus(codes.Error, "intent parked as "+outcome)
	}
}
