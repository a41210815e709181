package metrics_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/relaytest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func logger() watermill.LoggerAdapter {
	if testing.Verbose() {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

// value returns the value of the series name{labels}, failing when it is not exported.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := lookup(t, reg, name, labels)
	require.True(t, ok, "series %s%v not exported", name, labels)
	return v
}

func lookup(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	return find(families, name, labels)
}

// find returns the value of name{labels} in one gathered scrape.
func find(families []*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return metricValue(m), true
		}
	}
	return 0, false
}

func metricValue(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// label is what the metrics use for a component's consumer or relay name: the accessor's
// answer when the component has one, "" otherwise.
func label(v any) string {
	switch n := v.(type) {
	case interface{ Consumer() string }:
		return n.Consumer()
	case interface{ Name() string }:
		return n.Name()
	}
	return ""
}

func occurred(uuid, sender, payload string, at time.Time) *message.Message {
	msg := message.NewMessage(uuid, []byte(payload))
	msg.Metadata.Set("sender", sender)
	msg.Metadata.Set(outbox.MetadataOccurredAt, at.UTC().Format(time.RFC3339Nano))
	return msg
}

func TestMetricsOfRealComponents(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	now := time.Now()

	// Effectively-once middleware: applied, duplicate, mismatching duplicate, failed, refused, too old.
	mw, err := once.New(db, once.Config{
		Schema: schema, Consumer: "payments", SenderMetadataKey: "sender", MaxMessageAge: 24 * time.Hour,
	}, logger())
	require.NoError(t, err)
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "fail" {
			msg.Ack() // ignored, counted in wmonce_handler_acked_total
			return nil, errors.New("handler failed")
		}
		if string(msg.Payload) == "ends its tx" {
			tx, _ := pgtx.TxFromContext(msg.Context())
			_ = tx.Commit() // refused by the attempt guard: nothing applied
		}
		return nil, nil
	})
	for _, m := range []*message.Message{
		occurred("p-1", "shop", "a", now),
		occurred("p-1", "shop", "a", now),
		occurred("p-1", "redrive", "changed", now),
		occurred("p-2", "shop", "fail", now),
		occurred("", "shop", "no key", now),
		occurred("p-3", "shop", "late", now.Add(-48*time.Hour)),
		occurred("p-4", "shop", "ends its tx", now),
	} {
		_, _ = h(m)
	}

	// Inbox: a receiver and processor for "orders" (one message poisoned, one whose handler
	// commits the transaction it was lent), a receiver for "backlog" with no processor.
	orders, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: schema, Consumer: "orders"}, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = orders.Close() })
	for _, uuid := range []string{"o-1", "o-2", "o-2", "o-poison", "o-commits"} {
		require.NoError(t, orders.Handle(message.NewMessage(uuid, []byte(uuid))))
	}
	handled := make(chan string, 10)
	proc, err := inbox.NewProcessor(db, func(msg *message.Message) ([]*message.Message, error) {
		defer func() { handled <- msg.UUID }()
		switch msg.UUID {
		case "o-poison":
			msg.Nack() // ignored, counted in wmonce_handler_acked_total
			return nil, wmonce.Permanent(errors.New("poison"))
		case "o-commits":
			tx, _ := pgtx.TxFromContext(msg.Context())
			return nil, tx.Commit()
		}
		return nil, nil
	}, inbox.ProcessorConfig{Schema: schema, Consumer: "orders", Workers: 1, PollInterval: 10 * time.Millisecond, ShutdownGrace: testsignal.Timeout}, logger())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- proc.Run(ctx) }()
	// Each of the four rows is handled once; Close lets the last attempt record its outcome.
	for seen := map[string]bool{}; len(seen) < 4; {
		seen[testwait.Receive(t, handled, "the four orders handled")] = true
	}
	require.NoError(t, proc.Close())
	require.NoError(t, <-done)
	require.Equal(t, uint64(2), proc.Counters().Processed)
	require.Equal(t, uint64(2), proc.Counters().Parked)
	backlog, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: schema, Consumer: "backlog"}, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = backlog.Close() })
	require.NoError(t, backlog.Handle(message.NewMessage("b-1", []byte("x"))))
	require.NoError(t, backlog.Handle(message.NewMessage("b-2", []byte("x"))))
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "inbox")+` SET received_at = now() - interval '90 seconds' WHERE message_id = 'b-1'`)

	// Outbox: three rows, relay "kafka" forwards all, relay "audit" one.
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, w.PublishTx(ctx, tx, "events", message.NewMessage(fmt.Sprintf("e-%d", i), []byte(`{}`))))
	}
	require.NoError(t, tx.Commit())
	kafka := relay(t, db, schema, "kafka", 100, 3)
	audit := relay(t, db, schema, "audit", 1, 1)

	// Janitor: four expired claims.
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "processed_messages")+` (consumer, message_id, payload_sha256, processed_at)
SELECT 'old', 'k' || g, '\x00', now() - interval '30 days' FROM generate_series(1, 4) g`)
	j, err := retention.NewJanitor(db, retention.Config{Schema: schema, Consumers: map[string]retention.Policy{"payments": {Keep: time.Hour, RedeliveryHorizon: 2 * time.Hour}}}, logger())
	require.NoError(t, err)
	_, err = j.RunOnce(ctx)
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{
		DB: db, Schema: schema,
		Middlewares: []*once.Middleware{mw},
		Relays:      []*outbox.Relay{kafka, audit},
		Processors:  []*inbox.Processor{proc},
		Receivers:   []*inbox.Receiver{orders, backlog},
		Janitors:    []*retention.Janitor{j},
	}))

	// The exposition of one family, in full.
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP wmonce_claims_total Messages the effectively-once middleware claimed: result=fresh (applied and committed) or duplicate (key already claimed, skipped and acked).
# TYPE wmonce_claims_total counter
wmonce_claims_total{consumer="payments",result="duplicate",sender="redrive"} 1
wmonce_claims_total{consumer="payments",result="duplicate",sender="shop"} 1
wmonce_claims_total{consumer="payments",result="fresh",sender="redrive"} 0
wmonce_claims_total{consumer="payments",result="fresh",sender="shop"} 1
`), "wmonce_claims_total"))

	m := func(kv ...string) map[string]string {
		out := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	require.Equal(t, 1.0, value(t, reg, "wmonce_fingerprint_mismatches_total", m("consumer", "payments", "sender", "redrive")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_fingerprint_mismatches_total", m("consumer", "payments", "sender", "shop")))
	for outcome, want := range map[string]float64{"applied": 1, "failed": 1, "refused": 1, "too_old": 1, "handler_ended_tx": 1} {
		require.Equal(t, want, value(t, reg, "wmonce_handler_outcomes_total", m("consumer", "payments", "outcome", outcome)), outcome)
	}
	require.Equal(t, 0.0, value(t, reg, "wmonce_tx_retries_total", m("consumer", "payments")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_group_commit_transactions_total", nil))

	// Receivers and processor: labelled by consumer where the inbox types say it.
	recv := func(r *inbox.Receiver, result string) float64 {
		return value(t, reg, "wmonce_inbox_received_total", m("consumer", label(r), "result", result))
	}
	if label(orders) == label(backlog) {
		require.Equal(t, 6.0, recv(orders, "stored"))
	} else {
		require.Equal(t, 4.0, recv(orders, "stored"))
		require.Equal(t, 2.0, recv(backlog, "stored"))
	}
	require.Equal(t, 1.0, recv(orders, "duplicate"))
	require.Equal(t, 2.0, value(t, reg, "wmonce_inbox_processed_total", m("consumer", label(proc))))
	require.Equal(t, 2.0, value(t, reg, "wmonce_inbox_parked_total", m("consumer", label(proc))))
	require.Equal(t, 2.0, value(t, reg, "wmonce_inbox_failed_attempts_total", m("consumer", label(proc))))
	require.Equal(t, 1.0, value(t, reg, "wmonce_inbox_handler_ended_tx_total", m("consumer", label(proc))))
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_lease_conflicts_total", m("consumer", label(proc))))
	require.Equal(t, 1.0, value(t, reg, "wmonce_handler_acked_total", m("component", "once", "consumer", "payments")))
	require.Equal(t, 1.0, value(t, reg, "wmonce_handler_acked_total", m("component", "inbox", "consumer", label(proc))))

	// Inbox rows from the database, per consumer and status.
	require.Equal(t, 2.0, value(t, reg, "wmonce_inbox_rows", m("consumer", "orders", "status", "failed")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_rows", m("consumer", "orders", "status", "pending")))
	require.Equal(t, 2.0, value(t, reg, "wmonce_inbox_rows", m("consumer", "backlog", "status", "pending")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_rows", m("consumer", "backlog", "status", "in_progress")))
	age := value(t, reg, "wmonce_inbox_oldest_pending_age_seconds", m("consumer", "backlog"))
	require.InDelta(t, 90, age, 60, "the oldest pending row was received 90s ago")
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_oldest_pending_age_seconds", m("consumer", "orders")))

	// Outbox backlog and lag per relay, from the database; relay counters from the relays.
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_backlog", m("relay", "kafka")))
	require.Equal(t, 2.0, value(t, reg, "wmonce_outbox_backlog", m("relay", "audit")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_lag_seconds", m("relay", "kafka")))
	require.Greater(t, value(t, reg, "wmonce_outbox_lag_seconds", m("relay", "audit")), 0.0)
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_rejected", nil))
	if label(kafka) == label(audit) {
		require.Equal(t, 4.0, value(t, reg, "wmonce_relay_forwarded_total", m("relay", label(kafka))))
	} else {
		require.Equal(t, 3.0, value(t, reg, "wmonce_relay_forwarded_total", m("relay", label(kafka))))
		require.Equal(t, 1.0, value(t, reg, "wmonce_relay_forwarded_total", m("relay", label(audit))))
	}

	// Janitor.
	require.Equal(t, 4.0, value(t, reg, "wmonce_janitor_deleted_total", m("table", "processed_messages")))
	require.Equal(t, 0.0, value(t, reg, "wmonce_janitor_deleted_total", m("table", "outbox")))
	require.Equal(t, 1.0, value(t, reg, "wmonce_janitor_rounds_total", m("result", "ok")))
	require.Equal(t, 1.0, value(t, reg, "wmonce_retention_warnings", nil), "Keep 1h below a 2h horizon")
	require.Greater(t, value(t, reg, "wmonce_janitor_last_round_timestamp_seconds", nil), float64(now.Unix()-1))
	require.Equal(t, 0.0, value(t, reg, "wmonce_scrape_errors_total", m("source", "inbox")))

	// A drained backlog reports 0 instead of vanishing.
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "inbox")+` SET status = 'DONE', finished_at = now() WHERE consumer = 'backlog'`)
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_rows", m("consumer", "backlog", "status", "pending")))

	// Names, types and help follow Prometheus conventions.
	c, err := metrics.NewCollector(metrics.Sources{DB: db, Schema: schema, Middlewares: []*once.Middleware{mw}, Janitors: []*retention.Janitor{j}})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// relay forwards want rows with a relay of its own name and batch size. Rows committed before
// a round are read by it, so every round forwards more until all are out.
func relay(t *testing.T, db *sql.DB, schema, name string, batch, want int) *outbox.Relay {
	t.Helper()
	pub := gochannel.NewGoChannel(gochannel.Config{}, logger())
	t.Cleanup(func() { _ = pub.Close() })
	r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, Name: name, BatchSize: batch}, logger())
	require.NoError(t, err)
	relaytest.RunUntil(t, r, fmt.Sprintf("forward %d rows (relay %s)", want, name), 1, func(c outbox.RelayCounters) bool { return int(c.Forwarded) >= want })
	require.Equal(t, want, int(r.Counters().Forwarded))
	return r
}

func TestScrapeSurvivesDatabaseErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	mw, err := once.New(db, once.Config{Schema: "no_such_schema_here", Consumer: "c", SenderMetadataKey: "sender"}, logger())
	require.NoError(t, err)
	// A producer-controlled sender that is not UTF-8 must not break the scrape either.
	msg := message.NewMessage("", nil)
	msg.Metadata.Set("sender", "bad\xffsender")
	_, err = mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.ErrorIs(t, err, wmonce.ErrInvalidKey)

	sender, err := intent.NewSender(db, intent.SenderConfig{Schema: "no_such_schema_here", Channels: map[string]intent.Channel{"sms": {Provider: &provider{}, OnCrash: intent.Resend}}}, logger())
	require.NoError(t, err)
	_, err = sender.SendNext(context.Background())
	require.Error(t, err)
	idem, err := httpidem.NewMiddleware(db, httpidem.Config{Schema: "no_such_schema_here"}, logger())
	require.NoError(t, err)

	logs := watermill.NewCaptureLogger()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{
		DB: db, Schema: "no_such_schema_here", Middlewares: []*once.Middleware{mw}, Logger: logs,
		Senders: []*intent.Sender{sender}, HTTPIdempotency: []*httpidem.Middleware{idem},
	}))
	for scrape := 1; scrape <= 2; scrape++ {
		families, err := reg.Gather()
		require.NoError(t, err, "database errors are counted, not returned")
		for _, source := range []string{"inbox", "outbox", "intent", "http_idempotency"} {
			n, ok := find(families, "wmonce_scrape_errors_total", map[string]string{"source": source})
			require.True(t, ok)
			require.Equal(t, float64(scrape), n, source)
		}
	}
	require.Equal(t, 1.0, value(t, reg, "wmonce_handler_outcomes_total", map[string]string{"consumer": "c", "outcome": "refused"}), "in-process figures are still exported")
	require.Equal(t, 0.0, value(t, reg, "wmonce_claims_total", map[string]string{"consumer": "c", "sender": "bad\uFFFDsender", "result": "fresh"}))
	require.Equal(t, 1.0, value(t, reg, "wmonce_intent_sender_errors_total", nil), "in-process intent figures too")
	require.Equal(t, 0.0, value(t, reg, "wmonce_http_idempotency_requests_total", map[string]string{"result": "stored"}))
	_, found := lookup(t, reg, "wmonce_outbox_backlog", map[string]string{"relay": "kafka"})
	require.False(t, found)
	_, found = lookup(t, reg, "wmonce_intent_rows", map[string]string{"channel": "sms", "status": "pending"})
	require.False(t, found, "gauges of a failed read are left out, not reported as 0")
	_, found = lookup(t, reg, "wmonce_http_idempotency_keys", nil)
	require.False(t, found)
	require.NotEmpty(t, logs.Captured()[watermill.ErrorLogLevel])

	// A slow database is cut off by ScrapeTimeout instead of hanging the scrape.
	blocker, err := db.Begin()
	require.NoError(t, err)
	defer blocker.Rollback()
	schema := pgtest.Schema(t, db)
	_, err = blocker.Exec(`LOCK TABLE ` + pgtx.QualifiedName(schema, "inbox") + `, ` + pgtx.QualifiedName(schema, "outbox") + `, ` +
		pgtx.QualifiedName(schema, "intents") + `, ` + pgtx.QualifiedName(schema, "http_idempotency_keys") + ` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	reg = prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema, ScrapeTimeout: 200 * time.Millisecond,
		Senders: []*intent.Sender{sender}, HTTPIdempotency: []*httpidem.Middleware{idem}}))
	start := time.Now()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, source := range []string{"inbox", "outbox", "intent", "http_idempotency"} {
		n, ok := find(families, "wmonce_scrape_errors_total", map[string]string{"source": source})
		require.True(t, ok)
		require.Equal(t, 1.0, n, source)
	}
	require.Less(t, time.Since(start), 10*time.Second)
}

func TestRegisterChecksItsInput(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, metrics.Register(nil, metrics.Sources{}), "registerer is nil")
	require.ErrorContains(t, metrics.Register(prometheus.NewRegistry(), metrics.Sources{Schema: "Bad"}), "schema name")
	require.ErrorContains(t, metrics.Register(prometheus.NewRegistry(), metrics.Sources{ScrapeTimeout: -1}), "ScrapeTimeout")
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{}))
	require.ErrorContains(t, metrics.Register(reg, metrics.Sources{}), "register", "a second collector of the same names is refused")
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Empty(t, families, "no sources, no series")
}

// Sources documents that nil components are skipped; a nil processor once reached the
// database gauges, which asked it for its consumer and panicked.
func TestNilComponentsAreSkipped(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema,
		Middlewares: []*once.Middleware{nil}, Relays: []*outbox.Relay{nil}, Processors: []*inbox.Processor{nil},
		Receivers: []*inbox.Receiver{nil}, Janitors: []*retention.Janitor{nil}, Senders: []*intent.Sender{nil},
		HTTPIdempotency: []*httpidem.Middleware{nil}}))
	_, err := reg.Gather()
	require.NoError(t, err)
}
