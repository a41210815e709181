package interop_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// spans records every ended span of one test, and signals each as it ends.
type spans struct {
	rec   *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	ended testsignal.Signal[sdktrace.ReadOnlySpan]
}

func newSpans(t *testing.T) *spans {
	s := &spans{rec: tracetest.NewSpanRecorder()}
	s.ended.Init()
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec), sdktrace.WithSpanProcessor(endSignal{&s.ended}))
	t.Cleanup(func() { _ = s.tp.Shutdown(context.Background()) })
	return s
}

// endSignal is a span processor that signals every span that ends.
type endSignal struct {
	ended *testsignal.Signal[sdktrace.ReadOnlySpan]
}

func (e endSignal) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e endSignal) OnEnd(s sdktrace.ReadOnlySpan)                   { e.ended.Signal(s) }
func (e endSignal) Shutdown(context.Context) error                  { return nil }
func (e endSignal) ForceFlush(context.Context) error                { return nil }

// named returns the ended spans called name, in the order they ended.
func (s *spans) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s.rec.Ended() {
		if sp.Name() == name {
			out = append(out, sp)
		}
	}
	return out
}

// one returns the only ended span called name that satisfies match.
func (s *spans) one(t *testing.T, name string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, sp := range s.named(name) {
		if match == nil || match(sp) {
			found = append(found, sp)
		}
	}
	require.Len(t, found, 1, "spans named %q: %d", name, len(found))
	return found[0]
}

func attr(sp sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func events(sp sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range sp.Events() {
		out = append(out, e.Name)
	}
	return out
}

func childOf(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	require.Equal(t, parent.SpanContext().TraceID(), child.SpanContext().TraceID(), "%s is in the trace of %s", child.Name(), parent.Name())
	require.Equal(t, parent.SpanContext().SpanID(), child.Parent().SpanID(), "%s is a child of %s", child.Name(), parent.Name())
}

// outcome is what the consumer's middleware returned for one delivery.
type traceOutcome struct {
	msg *message.Message
	err error
}

// TestOneTraceFromHTTPRequestToConsumerCommit follows one order from a client's HTTP request
// through the Idempotency-Key middleware, the handler's outbox write (pgtx), the relay and each
// broker to the consumer's commit under the effectively-once middleware, and shows that every
// step is a span of the same trace: the request, the outbox store, the relay's publish (a
// producer span linked to the store), the consumer span with its claim and commit, and its
// handler. A redelivered copy shows up in the same trace as a consumer span marked duplicate.
// On SQL the consumer works in the subscriber's transaction; on Kafka and RabbitMQ in its own.
func TestOneTraceFromHTTPRequestToConsumerCommit(t *testing.T) {
	for _, kind := range []broker.Kind{broker.SQL, broker.Kafka, broker.AMQP} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			oneTrace(t, kind)
		})
	}
}

func oneTrace(t *testing.T, kind broker.Kind) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (id bigserial PRIMARY KEY, event_id text NOT NULL)`)
	topic := pgtest.NewName("orders")
	cfg := brokertest.Config(t, kind, schema)
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "billing"}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	sp := newSpans(t)

	// The producer: an HTTP handler under the Idempotency-Key middleware that stores an event
	// in the outbox in the request's transaction.
	writer, err := outbox.NewWriter(outbox.Config{Schema: schema, TracerProvider: sp.tp})
	require.NoError(t, err)
	idem, err := httpidem.NewMiddleware(db, httpidem.Config{Schema: schema, Scope: httpidem.SharedScope(), TracerProvider: sp.tp}, logger())
	require.NoError(t, err)
	srv := httptest.NewServer(idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := pgtx.TxFromContext(r.Context())
		if err := writer.PublishTx(r.Context(), tx, topic, message.NewMessage("order-1", []byte(`{"cents":1200}`))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)

	// The client's span, carried to the server in the traceparent header.
	cctx, client := sp.tp.Tracer("client").Start(context.Background(), "client POST /orders", trace.WithSpanKind(trace.SpanKindClient))
	post := func() (status int, replayed string) {
		req, err := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"cents":1200}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k-order-1")
		propagation.TraceContext{}.Inject(cctx, propagation.HeaderCarrier(req.Header))
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		return res.StatusCode, res.Header.Get(httpidem.ReplayedHeader)
	}
	status, replayed := post()
	require.Equal(t, http.StatusCreated, status)
	require.Empty(t, replayed)
	_, replayed = post()
	require.Equal(t, "true", replayed, "the retry is replayed")
	client.End()
	traceID := client.SpanContext().TraceID()

	// The relay forwards it to the broker.
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, TracerProvider: sp.tp}, logger())
	require.NoError(t, err)
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// The consumer: the effectively-once middleware over the broker's subscriber.
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "billing", TracerProvider: sp.tp}, logger())
	require.NoError(t, err)
	outcomes := make(chan traceOutcome, 10)
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			outcomes <- traceOutcome{msg: msg.Copy(), err: err}
			return out, err
		}
	}
	sub, err := b.NewSubscriber("billing")
	require.NoError(t, err)
	runRouter(t, func(r *message.Router) {
		r.AddConsumerHandler("billing", topic, sub, func(msg *message.Message) error {
			tx, _ := pgtx.TxFromContext(msg.Context())
			_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+pgtx.QualifiedName(schema, "effects")+` (event_id) VALUES ($1)`, msg.UUID)
			return err
		}).AddMiddleware(observe, mw.Middleware)
	})
	first := testwait.Receive(t, outcomes, "the consumer to commit order-1")
	require.NoError(t, first.err)

	// A redelivered copy (as after a relay crash between publish and position update).
	require.NoError(t, pub.Publish(topic, first.msg))
	dup := testwait.Receive(t, outcomes, "the redelivered copy")
	require.NoError(t, dup.err)
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, mw.Counters().Consumer("billing"))

	// Every step is a span of the client's trace.
	request := sp.one(t, "httpidem request", func(s sdktrace.ReadOnlySpan) bool { return !attr(s, "wmonce.replayed").AsBool() })
	require.Equal(t, traceID, request.SpanContext().TraceID())
	require.Equal(t, trace.SpanKindServer, request.SpanKind())
	require.Equal(t, "k-order-1", attr(request, "wmonce.idempotency_key").AsString())
	require.EqualValues(t, http.StatusCreated, attr(request, "http.response.status_code").AsInt64())
	replay := sp.one(t, "httpidem request", func(s sdktrace.ReadOnlySpan) bool { return attr(s, "wmonce.replayed").AsBool() })
	require.Equal(t, traceID, replay.SpanContext().TraceID())

	store := sp.one(t, "outbox store", nil)
	childOf(t, store, request)

	publish := sp.one(t, "outbox relay publish", nil)
	childOf(t, publish, store)
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind())
	require.Len(t, publish.Links(), 1)
	require.Equal(t, store.SpanContext().SpanID(), publish.Links()[0].SpanContext.SpanID(), "the relay's span links the producing span")
	require.Equal(t, topic, attr(publish, "messaging.destination.name").AsString())

	consumed := sp.named("once process")
	require.Len(t, consumed, 2)
	fresh, dupSpan := consumed[0], consumed[1]
	for _, c := range consumed {
		childOf(t, c, store) // the message keeps the producer's context across the broker
		require.Equal(t, trace.SpanKindConsumer, c.SpanKind())
		require.Equal(t, "billing", attr(c, "wmonce.consumer").AsString())
		require.Equal(t, "order-1", attr(c, "wmonce.dedupe_key").AsString())
	}
	require.False(t, attr(fresh, "wmonce.duplicate").AsBool())
	require.True(t, attr(dupSpan, "wmonce.duplicate").AsBool(), "the copy is marked duplicate")
	require.False(t, attr(dupSpan, "wmonce.fingerprint_mismatch").AsBool())
	require.Contains(t, events(dupSpan), "duplicate")
	require.Contains(t, events(fresh), "claim")
	if kind == broker.SQL {
		require.Equal(t, "subscriber_tx", attr(fresh, "wmonce.path").AsString())
		require.Contains(t, events(fresh), "attempt complete: the subscriber commits it with its offset on ack")
	} else {
		// Group commit is the default on Kafka and RabbitMQ: a message that finds a lane free runs
		// in a transaction of its own (own_tx), one that waits shares its group's (group_commit).
		require.Contains(t, []string{"own_tx", "group_commit"}, attr(fresh, "wmonce.path").AsString())
		require.Contains(t, events(fresh), "commit")
	}
	handler := sp.one(t, "handler", nil)
	childOf(t, handler, fresh)
}

// TestTraceThroughTheInbox follows a message stamped by a producer span through the relay and
// the SQL broker into the inbox (the Receiver keeps its metadata), where each Processor attempt
// is a consumer span of the producer's trace with its attempt number: the first fails, the
// second commits and stores its output under it, stamped with the same trace.
func TestTraceThroughTheInbox(t *testing.T) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic, out := pgtest.NewName("payments"), pgtest.NewName("cashback")
	cfg := brokertest.Config(t, broker.SQL, schema)
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "rewards"}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	sp := newSpans(t)

	writer, err := outbox.NewWriter(outbox.Config{Schema: schema, TracerProvider: sp.tp})
	require.NoError(t, err)
	pctx, producer := sp.tp.Tracer("producer").Start(ctx, "producer")
	require.NoError(t, pgtx.RunInTx(pctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return writer.PublishTx(ctx, tx, topic, message.NewMessage("pay-1", []byte(`{}`)))
	}))
	producer.End()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, TracerProvider: sp.tp}, logger())
	require.NoError(t, err)
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: schema, Consumer: "rewards"}, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = receiver.Close() })
	sub, err := b.NewSubscriber("rewards")
	require.NoError(t, err)
	runRouter(t, func(r *message.Router) {
		r.AddConsumerHandler("rewards-inbox", topic, sub, receiver.Handle)
	})

	var failedOnce atomic.Bool
	processor, err := inbox.NewProcessor(db, func(msg *message.Message) ([]*message.Message, error) {
		if failedOnce.CompareAndSwap(false, true) {
			return nil, errors.New("first attempt fails")
		}
		return []*message.Message{message.NewMessage("cashback-"+msg.UUID, []byte(`{}`))}, nil
	}, inbox.ProcessorConfig{
		Schema: schema, Consumer: "rewards", OutputTopic: out, TracerProvider: sp.tp,
		Backoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond,
	}, logger())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- processor.Run(context.Background()) }()
	// The attempt's span ends after its transaction committed, and records the COMMIT.
	sp.ended.WaitFor(func(s sdktrace.ReadOnlySpan) bool {
		return s.Name() == "inbox process" && slices.Contains(events(s), "commit")
	})
	require.NoError(t, processor.Close())
	require.NoError(t, <-done)

	store := sp.one(t, "outbox store", func(s sdktrace.ReadOnlySpan) bool {
		return attr(s, "messaging.destination.name").AsString() == topic
	})
	require.Equal(t, producer.SpanContext().TraceID(), store.SpanContext().TraceID())
	attempts := sp.named("inbox process")
	require.Len(t, attempts, 2)
	for i, a := range attempts {
		childOf(t, a, store)
		require.Equal(t, trace.SpanKindConsumer, a.SpanKind())
		require.EqualValues(t, i+1, attr(a, "wmonce.attempt").AsInt64())
		require.Equal(t, "rewards", attr(a, "wmonce.consumer").AsString())
	}
	require.Equal(t, "first attempt fails", attempts[0].Status().Description)
	require.Contains(t, events(attempts[1]), "commit")
	output := sp.one(t, "outbox store", func(s sdktrace.ReadOnlySpan) bool {
		return attr(s, "messaging.destination.name").AsString() == out
	})
	childOf(t, output, attempts[1])
	var parent string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT metadata->>'traceparent' FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE uuid = 'cashback-pay-1'`).Scan(&parent))
	require.Contains(t, parent, attempts[1].SpanContext().TraceID().String(), "the output continues the trace")
}
