package intent_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/fakeprovider"
	"github.com/wmonce/watermill-once/pgtx"
)

// Each take of an intent is a client span with its channel, key and attempt and the state it
// reached: a send the provider refused once (NotSent) is one span with outcome PENDING at
// attempt 1 and one with outcome SENT at attempt 2.
func TestSenderTracesEachSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := fakeprovider.Start(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, p), OnCrash: intent.Resend}, intent.SenderConfig{TracerProvider: tp})
	recorded := e.record(t, "e-1")
	p.FailNext(1, http.StatusServiceUnavailable)
	for range 2 {
		did, err := s.SendNext(context.Background())
		require.NoError(t, err)
		if !did { // the retry waits out its backoff
			_, err = e.db.Exec(`UPDATE ` + pgtx.QualifiedName(e.schema, "intents") + ` SET run_after = now()`)
			require.NoError(t, err)
			did, err = s.SendNext(context.Background())
			require.NoError(t, err)
		}
		require.True(t, did)
	}
	require.Equal(t, intent.StatusSent, e.get(t, recorded.Key).Status)

	spans := rec.Ended()
	require.Len(t, spans, 2)
	for i, sp := range spans {
		a := map[string]string{}
		for _, kv := range sp.Attributes() {
			a[string(kv.Key)] = kv.Value.String()
		}
		require.Equal(t, "intent send", sp.Name())
		require.Equal(t, trace.SpanKindClient, sp.SpanKind())
		require.Equal(t, "sms", a["wmonce.intent.channel"])
		require.Equal(t, recorded.Key, a["wmonce.intent.key"])
		require.Equal(t, []string{"1", "2"}[i], a["wmonce.attempt"])
	}
	require.Equal(t, "PENDING", attrOf(spans[0], "wmonce.outcome"))
	require.Equal(t, "SENT", attrOf(spans[1], "wmonce.outcome"))
	require.Equal(t, "false", attrOf(spans[1], "wmonce.duplicate"))
}

func attrOf(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// An intent recorded under a span carries that span's trace context in its row, and the
// sender's span is its child: the send joins the trace of the handler that decided on it,
// however much later it runs. One recorded without a span starts a trace of its own.
func TestSendJoinsTheTraceThatRecordedTheIntent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := fakeprovider.Start(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, p), OnCrash: intent.Resend}, intent.SenderConfig{TracerProvider: tp})

	ctx, handler := tp.Tracer("test").Start(context.Background(), "handler")
	var recorded intent.Recorded
	require.NoError(t, pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		recorded, err = e.store.RecordTx(ctx, tx, intent.Draft{Channel: "sms", Consumer: "notifications", EventID: "traced", Payload: []byte(`{}`)})
		return err
	}))
	handler.End()
	stored := e.get(t, recorded.Key)
	require.Contains(t, stored.TraceParent, handler.SpanContext().TraceID().String(), "the row keeps the recording span's traceparent")

	did, err := s.SendNext(context.Background())
	require.NoError(t, err)
	require.True(t, did)
	untraced := e.record(t, "untraced")
	did, err = s.SendNext(context.Background())
	require.NoError(t, err)
	require.True(t, did)

	var sends []sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "intent send" {
			sends = append(sends, sp)
		}
	}
	require.Len(t, sends, 2)
	require.Equal(t, recorded.Key, attrOf(sends[0], "wmonce.intent.key"))
	require.Equal(t, handler.SpanContext().TraceID(), sends[0].SpanContext().TraceID(), "the send is in the handler's trace")
	require.Equal(t, handler.SpanContext().SpanID(), sends[0].Parent().SpanID(), "and the child of the span that recorded it")
	require.Equal(t, untraced.Key, attrOf(sends[1], "wmonce.intent.key"))
	require.False(t, sends[1].Parent().IsValid(), "recorded without a span: a trace of its own")
	require.Empty(t, e.get(t, untraced.Key).TraceParent)
}
