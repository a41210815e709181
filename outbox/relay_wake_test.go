package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// With the fallback poll an hour away, a message committed while the relay waits is published:
// the Writer's notification wakes it. After its LISTEN connection is killed, the relay listens
// again and a new message is still published (either the re-established LISTEN or a
// notification received on it wakes the relay).
func TestRelayWakesOnCommitAndAfterItsListenConnectionDies(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	s := newKeyedSink(1)
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)

	waitIdleListening(sig)
	publishTx(t, db, w, "a", "first")
	testwait.Closed(t, s.done, "a publish after a commit (with PollInterval an hour only a notification wakes the relay)")

	// The LISTEN connection is the only session of this test's channel (its name holds the
	// per-test schema).
	var killed bool
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "wmonce_outbox_' || $1 || '"'`, schema).Scan(&killed))
	require.True(t, killed)
	// Published whether it commits before the relay noticed (the new LISTEN wakes it) or after
	// (the notification does).
	done := s.expect(2)
	publishTx(t, db, w, "a", "second")
	testwait.Closed(t, done, "a publish after pg_terminate_backend of the LISTEN connection")
	require.Equal(t, []string{"first", "second"}, s.all())
	require.GreaterOrEqual(t, r.Counters().Failures, uint64(1), "the lost LISTEN connection is counted")
}

// countingTracer counts every query sent through the pool it is installed on.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (*countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An idle relay with the default PollInterval reads at most twice a second. The queries are
// counted by the driver of the relay's own pool over a window of several seconds: the bound
// (2 per second plus a fixed allowance) cannot be exceeded by a slow machine, which only runs
// fewer queries, while the former default (a poll every 100ms, 2 queries each) would send
// about ten times as many.
func TestIdleRelayQueriesAtMostTwicePerSecond(t *testing.T) {
	t.Parallel()
	_, schema, _ := setup(t)
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	tracer := &countingTracer{}
	cfg.Tracer = tracer
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	r, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	waitIdleListening(sig)
	// Measure the steady state: after it asked for notifications, the relay reads again for a
	// moment while transactions that were in progress then (other tests') still run. A wait
	// that is no re-read means it waits PollInterval now.
	sig.Waiting.WaitFor(func(w outbox.RelayWait) bool { return w.Listening && !w.Recheck })

	const window = 5 * time.Second
	before, start := tracer.n.Load(), time.Now()
	time.Sleep(window) // the measurement itself: the relay is idle for the whole window
	queries, elapsed := tracer.n.Load()-before, time.Since(start)
	limit := int64(2*elapsed.Seconds()) + 4
	t.Logf("idle relay: %d queries in %v (limit %d)", queries, elapsed.Round(time.Millisecond), limit)
	require.LessOrEqual(t, queries, limit, "an idle relay polls more often than twice a second")
}

// listenTo LISTENs on the relay channel of schema on a connection of its own and returns the
// payloads of the notifications it receives, in order.
func listenTo(t *testing.T, schema string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `LISTEN "wmonce_outbox_`+schema+`"`)
	require.NoError(t, err)
	out := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			out <- n.Payload
		}
	}()
	t.Cleanup(func() { cancel(); <-done; _ = conn.Close(context.Background()) })
	return out
}

// A Writer notifies only while a relay of the schema asked for it (outbox_offsets.idle_until
// in the future): a busy relay costs producers no notification. Absence is shown by order:
// PostgreSQL delivers notifications in commit order, so a marker sent after the producer's
// commit arriving first proves the producer sent none.
func TestWriterNotifiesOnlyWhileARelayIsIdle(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	got := listenTo(t, schema)
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	marker := func() {
		pgtest.Exec(t, db, `SELECT pg_notify('wmonce_outbox_`+schema+`', 'marker')`)
	}
	pgtest.Exec(t, db, `INSERT INTO `+offsets+` (consumer_group, offset_acked, last_processed_transaction_id, snapshot) VALUES ('busy', 0, '1', '1:1:')`)

	publishTx(t, db, w, "a", "never-asked")
	marker()
	require.Equal(t, "marker", testwait.Receive(t, got, "the marker"), "no relay asked: the producer must not notify")

	pgtest.Exec(t, db, `UPDATE `+offsets+` SET idle_until = now() - interval '1 second'`)
	publishTx(t, db, w, "a", "lapsed")
	marker()
	require.Equal(t, "marker", testwait.Receive(t, got, "the marker"), "the request lapsed: the producer must not notify")

	pgtest.Exec(t, db, `UPDATE `+offsets+` SET idle_until = now() + interval '1 hour'`)
	publishTx(t, db, w, "a", "idle-1", "idle-2")
	marker()
	require.Equal(t, "", testwait.Receive(t, got, "the producer's notification"), "a relay is idle: the producer notifies at commit")
	require.Equal(t, "marker", testwait.Receive(t, got, "the marker"))
}

// A relay that has caught up asks the Writers to notify it before it waits, for longer than
// its PollInterval (it renews the request at every idle round).
func TestCaughtUpRelayAsksForNotifications(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	s := newKeyedSink(1)
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	waitIdleListening(sig)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+offsets+` WHERE idle_until > now() + interval '1 hour'`),
		"the waiting relay asked for notifications for more than its PollInterval")
	publishTx(t, db, w, "a", "first")
	testwait.Closed(t, s.done, "a publish woken by the notification")
}

// A relay without LISTEN never asks the Writers to notify.
func TestRelayWithoutListenDoesNotAskForNotifications(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	r, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, DisableListen: true, PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	sig.Waiting.WaitOrTimeout()
	sig.Waiting.WaitOrTimeout()
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` WHERE idle_until IS NOT NULL`))
}

// A round that publishes withdraws the relay's request for notifications: a busy relay costs
// producers nothing. One that finds nothing leaves it standing.
func TestPublishingRoundWithdrawsTheRequestForNotifications(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	asking := `SELECT count(*) FROM ` + offsets + ` WHERE idle_until > now()`
	n, err := r.RelayOnce(context.Background()) // creates the relay's position
	require.NoError(t, err)
	require.Zero(t, n)
	pgtest.Exec(t, db, `UPDATE `+offsets+` SET idle_until = now() + interval '1 hour'`)

	n, err = r.RelayOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, pgtest.Count(t, db, asking), "an empty round leaves the request standing")

	publishTx(t, db, w, "a", "m-1")
	drain(t, r, s, 1)
	require.Zero(t, pgtest.Count(t, db, asking), "a round that published withdrew the request")
}

// A transaction that stored its rows before the relay asked for notifications, and commits
// after the relay's last look, sends no notification (a Writer decides when it stores). The
// relay saw it in progress when it asked, so it reads again shortly until it is over: with
// the fallback poll an hour away, its message is still published.
func TestRelayReadsAgainForATransactionInProgressWhenItAsked(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	// Stored before any relay of the schema asked: no notification will be sent at commit.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, w.PublishTx(ctx, tx, "a", message.NewMessage("straddler", []byte(`{}`))))

	s := newKeyedSink(1)
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	waitIdleListening(sig)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` WHERE idle_until IS NOT NULL`),
		"the relay asked for notifications while the transaction was open")
	require.NoError(t, tx.Commit())
	testwait.Closed(t, s.done, "the straddling transaction's message (with PollInterval an hour, only a re-read finds it)")
	require.Positive(t, r.Counters().Rechecks)
}
