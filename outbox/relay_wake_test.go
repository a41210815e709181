package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
)

// startRelay runs r until the test ends and returns a channel that receives each time the
// relay starts waiting (buffered: the test reads the latest state, never blocks the relay).
func startRelay(t *testing.T, r *outbox.Relay) <-chan struct{} {
	t.Helper()
	idle := make(chan struct{}, 1)
	outbox.SetIdleHook(r, func() {
		select {
		case idle <- struct{}{}:
		default:
		}
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	return idle
}

// waitIdleListening waits until the relay is waiting with its LISTEN connection up.
func waitIdleListening(t *testing.T, r *outbox.Relay, idle <-chan struct{}) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-idle:
			if r.Stats().Listening {
				return
			}
		case <-deadline:
			t.Fatalf("relay never waited with LISTEN up: %+v", r.Stats())
		}
	}
}

func waitFor(t *testing.T, s *keyedSink, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: relay published %v; with PollInterval an hour only a notification wakes it", what, s.all())
	}
}

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
	idle := startRelay(t, r)

	waitIdleListening(t, r, idle)
	publishTx(t, db, w, "a", "first")
	waitFor(t, s, s.done, "after a commit")

	// The LISTEN connection is the only session of this test's channel (its name holds the
	// per-test schema).
	var killed bool
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "wmonce_outbox_' || $1 || '"'`, schema).Scan(&killed))
	require.True(t, killed)
	// Published whether it commits before the relay noticed (the new LISTEN wakes it) or after
	// (the notification does).
	done := make(chan struct{})
	s.mu.Lock()
	s.want, s.done = 2, done
	s.mu.Unlock()
	publishTx(t, db, w, "a", "second")
	waitFor(t, s, done, "after pg_terminate_backend of the LISTEN connection")
	require.Equal(t, []string{"first", "second"}, s.all())
	require.GreaterOrEqual(t, r.Stats().Failures, uint64(1), "the lost LISTEN connection is counted")
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
	idle := startRelay(t, r)
	waitIdleListening(t, r, idle)

	const window = 5 * time.Second
	before, start := tracer.n.Load(), time.Now()
	time.Sleep(window) // the measurement itself: the relay is idle for the whole window
	queries, elapsed := tracer.n.Load()-before, time.Since(start)
	limit := int64(2*elapsed.Seconds()) + 4
	t.Logf("idle relay: %d queries in %v (limit %d)", queries, elapsed.Round(time.Millisecond), limit)
	require.LessOrEqual(t, queries, limit, "an idle relay polls more often than twice a second")
}
