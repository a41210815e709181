package tracing_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/tracing"
)

func provider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// The metadata written by Stamp is what the standard W3C propagator reads over the metadata
// (the carrier Watermill tracing decorators use), and the reverse.
func TestStampInteroperatesWithTheStandardPropagator(t *testing.T) {
	tp, _ := provider(t)
	ctx, span := tp.Tracer("t").Start(context.Background(), "producer")
	defer span.End()

	ours := message.NewMessage("a", nil)
	require.True(t, tracing.Stamp(ctx, ours))
	require.NotEmpty(t, ours.Metadata.Get(tracing.MetadataTraceParent))
	theirs := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(ours.Metadata)))
	require.True(t, theirs.Equal(span.SpanContext().WithRemote(true)), "their propagator reads our stamp")

	stampedByThem := message.NewMessage("b", nil)
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(stampedByThem.Metadata))
	require.True(t, tracing.Extract(stampedByThem.Metadata).Equal(span.SpanContext().WithRemote(true)), "we read theirs")
}

func TestStampKeepsAnExistingContextAndNeedsASpan(t *testing.T) {
	tp, _ := provider(t)
	msg := message.NewMessage("a", nil)
	require.False(t, tracing.Stamp(context.Background(), msg), "no span in the context: nothing stamped")
	require.Empty(t, msg.Metadata.Get(tracing.MetadataTraceParent))

	first, s1 := tp.Tracer("t").Start(context.Background(), "first")
	defer s1.End()
	second, s2 := tp.Tracer("t").Start(context.Background(), "second")
	defer s2.End()
	require.True(t, tracing.Stamp(first, msg))
	require.False(t, tracing.Stamp(second, msg), "a message keeps the context it carries")
	require.Equal(t, s1.SpanContext().TraceID(), tracing.Extract(msg.Metadata).TraceID())

	msg.Metadata.Set(tracing.MetadataTraceParent, "garbage")
	require.False(t, tracing.Extract(msg.Metadata).IsValid(), "a malformed traceparent is no context")
}

// A consumer span continues the trace the message carries and links a span of another trace
// found in the context.
func TestStartConsumerContinuesTheMessagesTrace(t *testing.T) {
	tp, _ := provider(t)
	pctx, producer := tp.Tracer("t").Start(context.Background(), "producer")
	producer.End()
	msg := message.NewMessage("a", nil)
	tracing.Stamp(pctx, msg)

	local, outer := tp.Tracer("t").Start(context.Background(), "outer middleware")
	defer outer.End()
	_, span := tracing.StartConsumer(local, tracing.Tracer(tp), tracing.SpanOnce, msg)
	span.End()
	ro := span.(sdktrace.ReadOnlySpan)
	require.Equal(t, producer.SpanContext().TraceID(), ro.SpanContext().TraceID())
	require.Equal(t, producer.SpanContext().SpanID(), ro.Parent().SpanID())
	require.Len(t, ro.Links(), 1)
	require.Equal(t, outer.SpanContext().SpanID(), ro.Links()[0].SpanContext.SpanID())
	require.Equal(t, "a", ro.Attributes()[0].Value.AsString())
}

// Internal steps never start a trace of their own.
func TestStartChildWithoutASpanRecordsNothing(t *testing.T) {
	tp, rec := provider(t)
	_, span := tracing.StartChild(context.Background(), tracing.Tracer(tp), tracing.SpanOutboxStore)
	span.End()
	require.Empty(t, rec.Ended())
	require.Empty(t, tracing.StartRelay(context.Background(), tracing.Tracer(tp), "relay", "topic", []*message.Message{message.NewMessage("a", nil)}),
		"a message without trace context is relayed untraced")
}

// The relay's span is a child of the producing span, linked to it, and in the message's context
// for a tracing publisher decorator; the metadata keeps the producer's context.
func TestStartRelay(t *testing.T) {
	tp, _ := provider(t)
	pctx, producer := tp.Tracer("t").Start(context.Background(), "producer")
	producer.End()
	msg := message.NewMessage("a", nil)
	tracing.Stamp(pctx, msg)
	before := msg.Metadata.Get(tracing.MetadataTraceParent)

	spans := tracing.StartRelay(context.Background(), tracing.Tracer(tp), "relay", "orders", []*message.Message{msg})
	require.Len(t, spans, 1)
	tracing.EndAll(spans, nil)
	ro := spans[0].(sdktrace.ReadOnlySpan)
	require.Equal(t, trace.SpanKindProducer, ro.SpanKind())
	require.Equal(t, producer.SpanContext().SpanID(), ro.Parent().SpanID())
	require.Equal(t, producer.SpanContext().SpanID(), ro.Links()[0].SpanContext.SpanID())
	require.Equal(t, ro.SpanContext(), trace.SpanContextFromContext(msg.Context()))
	require.Equal(t, before, msg.Metadata.Get(tracing.MetadataTraceParent))
}
