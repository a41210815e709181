// Package tracing is the one place where watermill-once meets OpenTelemetry: the carrier that
// puts W3C trace context into message metadata, the span names and the attribute keys every
// component uses. It depends on the OpenTelemetry API only; with no SDK installed every span is
// a no-op.
//
// Trace context travels in message metadata under "traceparent" and "tracestate", the keys of
// propagation.TraceContext: the keys the Watermill tracing decorators that propagate over
// metadata (the forks of voi-oss/watermill-opentelemetry, which inject with the global
// TextMapPropagator over message.Metadata) write and read, so their spans and ours join one
// trace.
package tracing

import (
	"context"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Metadata keys of the W3C trace context (propagation.TraceContext).
const (
	MetadataTraceParent = "traceparent"
	MetadataTraceState  = "tracestate"
)

// ScopeName is the instrumentation scope of every tracer of this module.
const ScopeName = "github.com/wmonce/watermill-once"

// Span names.
const (
	SpanOnce          = "once process"
	SpanInbox         = "inbox process"
	SpanHandler       = "handler"
	SpanOutboxStore   = "outbox store"
	SpanRelayPublish  = "outbox relay publish"
	SpanHTTPIdem      = "httpidem request"
	SpanIntentSend    = "intent send"
	SpanDelayedRetry  = "once delayed retry"
	SpanBatch         = "once batch" // one run of a batch handler's function, linked to its messages' spans
	EventClaim        = "claim"
	EventDuplicate    = "duplicate"
	EventCommit       = "commit"
	EventPublishRetry = "publish failed"
	EventDelayedRetry = "delayed retry"
)

// Attribute keys.
const (
	Consumer            = attribute.Key("wmonce.consumer")
	DedupeKey           = attribute.Key("wmonce.dedupe_key")
	Duplicate           = attribute.Key("wmonce.duplicate")
	FingerprintMismatch = attribute.Key("wmonce.fingerprint_mismatch")
	Attempt             = attribute.Key("wmonce.attempt")
	Fresh               = attribute.Key("wmonce.fresh")
	Path                = attribute.Key("wmonce.path") // own_tx, group_commit, subscriber_tx
	Relay               = attribute.Key("wmonce.relay")
	IdempotencyKey      = attribute.Key("wmonce.idempotency_key")
	Replayed            = attribute.Key("wmonce.replayed")
	Channel             = attribute.Key("wmonce.intent.channel")
	IntentKey           = attribute.Key("wmonce.intent.key")
	Outcome             = attribute.Key("wmonce.outcome")
	DelayedRetry        = attribute.Key("wmonce.delayed_retry") // the number of the retry scheduled
	BatchSize           = attribute.Key("wmonce.batch_size")    // the messages of a batch handler's run
	MessageID           = attribute.Key("messaging.message.id")
	Destination         = attribute.Key("messaging.destination.name")
	MessageCount        = attribute.Key("messaging.batch.message_count")
	HTTPStatus          = attribute.Key("http.response.status_code")
)

var propagator = propagation.TraceContext{}

// Tracer returns the module's tracer from tp, or from otel.GetTracerProvider() when tp is nil.
// The global provider is looked up when Tracer is called, so set it before building components.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// Carrier adapts message.Metadata to propagation.TextMapCarrier.
type Carrier message.Metadata

// Get returns the value of key.
func (c Carrier) Get(key string) string { return c[key] }

// Set stores value under key.
func (c Carrier) Set(key, value string) { c[key] = value }

// Keys lists the keys.
func (c Carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Stamp writes the span context of ctx into msg's metadata, unless the message carries a
// traceparent already or ctx holds no valid span context. It reports whether it wrote.
func Stamp(ctx context.Context, msg *message.Message) bool {
	if msg.Metadata.Get(MetadataTraceParent) != "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	propagator.Inject(ctx, Carrier(msg.Metadata))
	return true
}

// TraceContext returns the W3C traceparent and tracestate of the span in ctx, for a row that
// records work to be done later; both are "" when ctx holds no valid span context.
func TraceContext(ctx context.Context) (parent, state string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := Carrier{}
	propagator.Inject(ctx, c)
	return c[MetadataTraceParent], c[MetadataTraceState]
}

// FromTraceContext returns the span context of a traceparent and tracestate that TraceContext
// returned (invalid for "" or a malformed value).
func FromTraceContext(parent, state string) trace.SpanContext {
	if parent == "" {
		return trace.SpanContext{}
	}
	c := Carrier{MetadataTraceParent: parent}
	if state != "" {
		c[MetadataTraceState] = state
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), c))
}

// Extract returns the span context a message carries (invalid when it carries none or a
// malformed one).
func Extract(md message.Metadata) trace.SpanContext {
	if md.Get(MetadataTraceParent) == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), Carrier(md)))
}

// StartConsumer starts a consumer span for msg. Its parent is the context the message carries
// (the producer's span, across the broker); without one, the span in ctx. A span in ctx of
// another trace (e.g. a tracing middleware in front of ours that started a trace of its own)
// is linked.
func StartConsumer(ctx context.Context, tracer trace.Tracer, name string, msg *message.Message, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	parent := ctx
	if remote := Extract(msg.Metadata); remote.IsValid() {
		if local := trace.SpanContextFromContext(ctx); local.IsValid() && local.TraceID() != remote.TraceID() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: local}))
		}
		parent = trace.ContextWithRemoteSpanContext(ctx, remote)
	}
	attrs = append(attrs, MessageID.String(msg.UUID))
	opts = append(opts, trace.WithAttributes(attrs...))
	return tracer.Start(parent, name, opts...)
}

// StartChild starts an internal span under ctx's span, only if ctx holds a valid one: the
// library's internal steps never start traces of their own.
func StartChild(ctx context.Context, tracer trace.Tracer, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx) // a no-op span: ctx holds none
	}
	return tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// End records err (if any) as the span's error status and ends it.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// MarkDuplicate marks the span as a skipped duplicate, with whether its payload differed from
// the applied copy's.
func MarkDuplicate(span trace.Span, mismatch bool) {
	span.SetAttributes(Duplicate.Bool(true), FingerprintMismatch.Bool(mismatch))
	span.AddEvent(EventDuplicate, trace.WithAttributes(FingerprintMismatch.Bool(mismatch)))
}

// StartRelay starts one producer span per message that carries a trace context, each a child
// of that context and linked to it, and returns a function that ends them all with the
// publish's outcome. The messages keep their metadata: consumers continue the producer's
// trace. Each traced message's context gets its span (and nothing else: no cancellation), so a
// tracing publisher decorator nests its own span under it. Messages without a trace context are
// published untraced.
func StartRelay(ctx context.Context, tracer trace.Tracer, relay, topic string, msgs []*message.Message) (spans []trace.Span) {
	for _, m := range msgs {
		sc := Extract(m.Metadata)
		if !sc.IsValid() {
			continue
		}
		_, span := tracer.Start(trace.ContextWithRemoteSpanContext(ctx, sc), SpanRelayPublish,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(trace.Link{SpanContext: sc}),
			trace.WithAttributes(Relay.String(relay), Destination.String(topic), MessageID.String(m.UUID)))
		m.SetContext(trace.ContextWithSpan(m.Context(), span))
		spans = append(spans, span)
	}
	return spans
}

// AddEvent adds an event to every span.
func AddEvent(spans []trace.Span, name string, attrs ...attribute.KeyValue) {
	for _, s := range spans {
		s.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// EndAll ends every span with err.
func EndAll(spans []trace.Span, err error) {
	for _, s := range spans {
		End(s, err)
	}
}

// StartServer starts the span of an HTTP request: a child of the span in ctx when there is one
// (a tracing HTTP middleware in front), else a server span continuing the trace context the
// request headers carry (or starting a trace).
func StartServer(ctx context.Context, tracer trace.Tracer, name string, header http.Header, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	kind := trace.SpanKindInternal
	if !trace.SpanContextFromContext(ctx).IsValid() {
		kind = trace.SpanKindServer
		ctx = propagator.Extract(ctx, propagation.HeaderCarrier(header))
	}
	return tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}
