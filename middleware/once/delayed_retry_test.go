package once_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/outbox"
)

func TestStackDelayedRetriesConfigErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{})
	long := make([]time.Duration, 101)
	for i := range long {
		long[i] = time.Second
	}
	for name, schedule := range map[string][]time.Duration{
		"zero wait":     {time.Second, 0},
		"negative wait": {-time.Second},
		"absurd wait":   {8 * 24 * time.Hour},
		"too many":      long,
	} {
		_, err := once.Stack(once.StackConfig{Middleware: e.mw, DelayedRetries: schedule})
		require.ErrorContains(t, err, "DelayedRetries", name)
	}
	_, err := once.Stack(once.StackConfig{Middleware: e.mw, DelayedRetries: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute}})
	require.NoError(t, err)
}

// retryRig is a router consuming one topic of a real broker through the Stack with delayed
// retries, and a relay forwarding the Middleware's outbox to that broker: the path a
// scheduled retry takes.
type retryRig struct {
	*env
	topic   string
	pub     message.Publisher
	applied chan *message.Message // each message the handler applied, in order
	acked   chan string           // each delivery the router acked
	spans   *tracetest.SpanRecorder
}

// newRetryRig starts the rig; fail decides, per delivery, whether the handler fails.
func newRetryRig(t *testing.T, kind broker.Kind, schedule []time.Duration, fail func(*message.Message) error) *retryRig {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	e := newEnv(t, once.Config{Consumer: "ledger", TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	r := &retryRig{env: e, spans: spans, topic: pgtest.NewName("retry"), applied: make(chan *message.Message, 100), acked: make(chan string, 100)}
	cfg := brokertest.Config(t, kind, e.schema)
	// One message in flight: a nacked message stops the one behind it.
	cfg.Kafka.Partitions = 1
	cfg.AMQP.Workers, cfg.AMQP.Prefetch = 1, 1
	cfg.Subscriptions = []broker.Subscription{{Topic: r.topic, Group: "ledger"}}
	b, err := broker.New(context.Background(), e.db, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	r.pub, err = b.NewPublisher(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.pub.Close() })
	sub, err := b.NewSubscriber("ledger")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	relay, err := outbox.NewRelay(e.db, r.pub, outbox.RelayConfig{Schema: e.schema, PollInterval: 20 * time.Millisecond}, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	t.Cleanup(func() { require.NoError(t, relay.Close()); require.NoError(t, <-done) })

	stack, err := once.Stack(once.StackConfig{
		Middleware:     e.mw,
		Retry:          wmiddleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond},
		DelayedRetries: schedule,
	})
	require.NoError(t, err)
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				r.acked <- msg.UUID
			}
			return out, err
		}
	}
	handler := func(msg *message.Message) ([]*message.Message, error) {
		if err := fail(msg); err != nil {
			return nil, err
		}
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		r.applied <- msg
		return nil, nil
	}
	runRouter(t, "ledger", r.topic, sub, handler, append([]message.HandlerMiddleware{observe}, stack...)...)
	return r
}

func (r *retryRig) publish(t *testing.T, uuids ...string) {
	t.Helper()
	for _, u := range uuids {
		require.NoError(t, r.pub.Publish(r.topic, message.NewMessage(u, []byte(`{"amount":1}`))))
	}
}

// retryClaims counts the retry claims of the ledger in processed_messages.
func (r *retryRig) retryClaims(t *testing.T) int {
	return pgtest.Count(t, r.db, `SELECT count(*) FROM `+r.table("processed_messages")+` WHERE consumer = 'ledger' AND message_id LIKE 'wmonce-retry/%'`)
}

var errNotYet = errors.New("the account is not open yet")

// failUntilRetried fails the first deliveries of flaky, those that are no delayed retry.
func failUntilRetried(msg *message.Message) error {
	if msg.UUID == "flaky" && msg.Metadata.Get(once.MetadataDelayedRetry) == "" {
		return errNotYet
	}
	return nil
}

// On every broker: a message that fails past the immediate retries is scheduled through the
// outbox and its delivery acked, so the healthy message behind it on the one partition or
// queue is applied before the retry is due; the retry copy, forwarded by the relay when due,
// is applied once. Without DelayedRetries the failing message was nacked over and over and
// the one behind it waited.
func TestDelayedRetryFreesThePartitionOnEveryBroker(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			const wait = 2 * time.Second // the margin for the healthy message to go first
			r := newRetryRig(t, kind, []time.Duration{wait}, failUntilRetried)
			r.publish(t, "flaky", "healthy")

			require.Equal(t, "flaky", testwait.Receive(t, r.acked, "the failing delivery to be acked once its retry is scheduled"))
			scheduled := time.Now()
			require.Equal(t, "healthy", testwait.Receive(t, r.applied, "the message behind it").UUID)
			require.Less(t, time.Since(scheduled), wait, "the healthy message went before the retry was due")
			retried := testwait.Receive(t, r.applied, "the delayed retry")
			require.Equal(t, "flaky", retried.UUID)
			require.Equal(t, "1:ledger", retried.Metadata.Get(once.MetadataDelayedRetry))
			require.Contains(t, retried.Metadata.Get(once.MetadataDelayedRetryError), errNotYet.Error())
			require.Equal(t, "healthy", testwait.Receive(t, r.acked, "the healthy message to be acked"))
			require.Equal(t, "flaky", testwait.Receive(t, r.acked, "the delayed retry to be acked"))
			testwait.Until(t, "both effects committed (watermill-sql's subscriber commits after the ack)", func() bool { return r.effects(t) == 2 })
			require.Equal(t, 1, r.retryClaims(t))
			c := r.mw.Counters().Consumer("ledger")
			require.Equal(t, uint64(1), c.DelayedRetries)
			require.Zero(t, c.DelayedRetriesNacked)
		})
	}
}

// Two copies of one failing message (a doubled delivery) schedule one retry: the second finds
// the retry claim taken and is acked. The message is applied once.
func TestDelayedRetryCopiesCollapseToOne(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t, broker.SQL, []time.Duration{time.Second}, failUntilRetried)
	r.publish(t, "flaky", "flaky", "healthy")
	for range 3 {
		testwait.Receive(t, r.acked, "the two copies and the healthy message to be acked")
	}
	require.Equal(t, "healthy", testwait.Receive(t, r.applied, "the healthy message").UUID)
	require.Equal(t, "flaky", testwait.Receive(t, r.applied, "the one delayed retry").UUID)
	require.Equal(t, uint64(1), r.mw.Counters().Consumer("ledger").DelayedRetries)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: r.db, Schema: r.schema, Middlewares: []*once.Middleware{r.mw}}))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP wmonce_delayed_retries_total Failed messages the Stack's delayed retries handled (StackConfig.DelayedRetries): result=scheduled (stored in the outbox for later, delivery acked) or nacked (could not be scheduled: no topic, outbox or database error).
# TYPE wmonce_delayed_retries_total counter
wmonce_delayed_retries_total{consumer="ledger",result="nacked"} 0
wmonce_delayed_retries_total{consumer="ledger",result="scheduled"} 1
`), "wmonce_delayed_retries_total"))
	// The admin page's consumers table shows it.
	adm, err := admin.NewHandler(r.db, admin.Config{Schema: r.schema, Middlewares: []*once.Middleware{r.mw}, SampleInterval: -1}, nil)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	adm.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/consumers", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"delayed_retries": 1,`)

	require.Equal(t, 1, r.retryClaims(t))
	require.Equal(t, 1, pgtest.Count(t, r.db, `SELECT count(*) FROM `+r.table("outbox")+` WHERE metadata::jsonb ? $1`, once.MetadataDelayedRetry))
	require.Equal(t, "flaky", testwait.Receive(t, r.acked, "the delayed retry to be acked"))
	testwait.Until(t, "both effects committed", func() bool { return r.effects(t) == 2 })
	require.Empty(t, r.applied, "nothing applied twice")

	// The trace: a span per failed copy, saying what it did, and the retry's delivery in the
	// trace of the span that scheduled it (the copy carries its trace context).
	outcomes := map[string]trace.TraceID{}
	for _, sp := range r.spans.Ended() {
		if sp.Name() != "once delayed retry" {
			continue
		}
		for _, ev := range sp.Events() {
			for _, a := range ev.Attributes {
				if a.Key == "wmonce.outcome" {
					outcomes[strings.Fields(a.Value.AsString())[0]] = sp.SpanContext().TraceID()
				}
			}
		}
	}
	require.Len(t, outcomes, 2, "one copy scheduled, one found it already scheduled: %v", outcomes)
	retried := false
	for _, sp := range r.spans.Ended() {
		retried = retried || (sp.Name() == "once process" && sp.SpanContext().TraceID() == outcomes["scheduled"])
	}
	require.True(t, retried, "the retry's delivery continues the trace of the span that scheduled it")
}

// A message still failing after the last delayed retry is parked, the reason saying the
// retries are exhausted; each retry was scheduled once.
func TestDelayedRetriesExhaustedPark(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t, broker.SQL, []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}, func(msg *message.Message) error {
		return errNotYet
	})
	r.publish(t, "doomed")
	for range 3 { // the delivery and its two retries
		require.Equal(t, "doomed", testwait.Receive(t, r.acked, "the delivery and each retry to be acked"))
	}
	parked := parkedCopies(t, r.env, once.DefaultPoisonTopic)
	require.Len(t, parked, 1)
	require.Contains(t, parked[0].Metadata.Get(wmiddleware.ReasonForPoisonedKey), once.ErrDelayedRetriesExhausted.Error())
	require.Equal(t, "2:ledger", parked[0].Metadata.Get(once.MetadataDelayedRetry), "a replayed copy that fails again parks again: its chain has ended")
	require.Equal(t, uint64(2), r.mw.Counters().Consumer("ledger").DelayedRetries)
	require.Equal(t, 2, r.retryClaims(t))
	require.Zero(t, r.effects(t))
}

// A permanent error parks at once: no delayed retry. A transient one without a topic to
// schedule on (no router) is nacked, as without delayed retries, and counted; one whose
// delivery the router cancelled is nacked without trying.
func TestDelayedRetrySkipsPermanentErrorsAndNacksWithoutATopic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	stack, err := once.Stack(once.StackConfig{
		Middleware: e.mw, Retry: wmiddleware.Retry{InitialInterval: time.Millisecond}, DelayedRetries: []time.Duration{time.Minute},
	})
	require.NoError(t, err)
	h := compose(stack, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "poison" {
			return nil, wmonce.Permanent(errors.New("cannot decode"))
		}
		return nil, errNotYet
	})
	require.NoError(t, deliver(h, "p-1", "poison"), "parked and acked")
	require.Len(t, parkedCopies(t, e, once.DefaultPoisonTopic), 1)
	require.ErrorIs(t, deliver(h, "t-1", "transient"), errNotYet)
	closing, cancel := context.WithCancel(context.Background())
	cancel() // Router.Close: nacked as it is, no attempt to schedule
	m := message.NewMessage("t-2", []byte("transient"))
	m.SetContext(closing)
	_, err = h(m)
	require.ErrorIs(t, err, context.Canceled)
	c := e.mw.Counters().Consumer("c")
	require.Zero(t, c.DelayedRetries)
	require.Equal(t, uint64(1), c.DelayedRetriesNacked)
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages")+` WHERE message_id LIKE 'wmonce-retry/%'`))
}
