package once_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// TestGroupCommitTracesEachDeliveryInItsProducersTrace sends messages stamped with a producer's
// trace context (the standard W3C propagator over the metadata, as any Watermill tracing
// decorator writes it) through group commit: each delivery is a consumer span of the producer's
// trace, with its claim, its handler as a child span and the group's COMMIT; a copy in the same
// group is marked duplicate, and a later copy with another payload is marked as a fingerprint
// mismatch. The handler's output is stored under the delivery's span and carries its trace.
func TestGroupCommitTracesEachDeliveryInItsProducersTrace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := groupEnv(t, once.Config{Consumer: "c", TracerProvider: tp, OutputTopic: "out"})
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
	})

	pctx, producer := tp.Tracer("producer").Start(context.Background(), "producer")
	stamped := func(uuid, payload string) *message.Message {
		msg := message.NewMessage(uuid, []byte(payload))
		propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(msg.Metadata))
		return msg
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, uuid := range []string{"m-1", "m-1", "m-2"} {
		wg.Go(func() { _, errs[i] = h(stamped(uuid, "p")) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, err := h(stamped("m-2", "another payload"))
	require.NoError(t, err)
	producer.End()

	var fresh, dups, mismatches int
	consumerSpans := map[trace.SpanID]bool{}
	for _, s := range rec.Ended() {
		if s.Name() != "once process" {
			continue
		}
		consumerSpans[s.SpanContext().SpanID()] = true
		require.Equal(t, producer.SpanContext().TraceID(), s.SpanContext().TraceID())
		require.Equal(t, producer.SpanContext().SpanID(), s.Parent().SpanID())
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		a := attrs(s)
		require.Equal(t, "group_commit", a["wmonce.path"])
		require.Equal(t, "c", a["wmonce.consumer"])
		switch {
		case a["wmonce.duplicate"] == "true" && a["wmonce.fingerprint_mismatch"] == "true":
			mismatches++
		case a["wmonce.duplicate"] == "true":
			dups++
		default:
			fresh++
			require.Contains(t, eventNames(s), "claim")
			require.Contains(t, eventNames(s), "commit")
		}
	}
	require.Equal(t, [3]int{2, 1, 1}, [3]int{fresh, dups, mismatches}, "fresh, duplicates, mismatches")
	handlers := 0
	for _, s := range rec.Ended() {
		if s.Name() == "handler" {
			handlers++
			require.True(t, consumerSpans[s.Parent().SpanID()], "a handler span is the child of its delivery's span")
		}
	}
	require.Equal(t, 2, handlers, "the handler ran for the fresh deliveries only")
	stores := 0
	for _, s := range rec.Ended() {
		if s.Name() == "outbox store" {
			stores++
			require.True(t, consumerSpans[s.Parent().SpanID()], "the output is stored under its delivery's span")
		}
	}
	require.Equal(t, 2, stores)
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE metadata->>'traceparent' LIKE $1`,
		"00-"+producer.SpanContext().TraceID().String()+"-%"), "the outputs continue the producer's trace")
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// TestTracePathSaysWhichTransactionRan: with group commit on (the default), a lone message runs
// in a transaction of its own and its span says own_tx; messages that wait for the busy lane
// run as a group and say group_commit (issue 34, item 12: every span said group_commit).
func TestTracePathSaysWhichTransactionRan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cfg := once.Config{Consumer: "c", TracerProvider: tp}
	cfg.GroupCommit = once.GroupCommitConfig{Workers: 1, TxBatchSize: 50}
	e := newEnv(t, cfg)
	signals := once.GroupCommitTestSignals(e.mw)
	release, busy := make(chan struct{}), make(chan struct{})
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "busy" {
			close(busy)
			<-release
		}
		return e.effect(msg)
	})
	require.NoError(t, deliver(h, "lone", "p"))

	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, deliver(h, "busy", "p")) })
	<-busy // it holds the only lane
	for i := 1; i <= 2; i++ {
		wg.Go(func() { require.NoError(t, deliver(h, fmt.Sprintf("g-%d", i), "p")) })
		require.Equal(t, i, signals.Queued.WaitOrTimeout())
	}
	close(release)
	wg.Wait()
	require.Equal(t, 2, signals.Committed.WaitOrTimeout())

	paths := map[string]string{}
	for _, s := range rec.Ended() {
		if s.Name() == "once process" {
			a := attrs(s)
			paths[a["wmonce.dedupe_key"]] = a["wmonce.path"]
		}
	}
	require.Equal(t, map[string]string{"lone": "own_tx", "busy": "own_tx", "g-1": "group_commit", "g-2": "group_commit"}, paths)
}
