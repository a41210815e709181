package worker_test

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/worker"
)

func TestJitterStaysBetweenHalfAndAll(t *testing.T) {
	t.Parallel()
	require.Zero(t, worker.Jitter(0))
	require.Zero(t, worker.Jitter(-time.Second))
	for range 1000 {
		d := worker.Jitter(101 * time.Millisecond)
		require.GreaterOrEqual(t, d, 50*time.Millisecond+500*time.Microsecond)
		require.LessOrEqual(t, d, 101*time.Millisecond)
	}
	require.LessOrEqual(t, worker.Jitter(1), time.Duration(1))
}

func TestDelayDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 500, 60: 500} {
		d := worker.Delay(100, 500, attempt)
		require.LessOrEqual(t, d, want, "attempt %d", attempt)
		require.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
	}
	// A cap below the base counts as the base; a huge attempt count does not overflow.
	require.LessOrEqual(t, worker.Delay(time.Second, 0, 1), time.Second)
	require.Positive(t, worker.Delay(time.Hour, time.Duration(1<<62), 1000))

	b := worker.Backoff{Base: 100, Max: 300}
	require.LessOrEqual(t, b.Next(), time.Duration(100))
	require.GreaterOrEqual(t, b.Next(), time.Duration(100))
	b.Reset()
	require.LessOrEqual(t, b.Next(), time.Duration(100))
}

func TestSleepEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	require.True(t, worker.Sleep(ctx, 0))
	cancel()
	require.False(t, worker.Sleep(ctx, time.Hour), "returns at once when ctx has ended")
	require.False(t, worker.Sleep(ctx, 0))
}

// The keys are those the module used before they were derived in one place: instances of an
// older version must still exclude new ones.
func TestLockKeyKeepsTheKeysInUse(t *testing.T) {
	t.Parallel()
	fnvKey := func(s string) int64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(s))
		return int64(h.Sum64())
	}
	require.Equal(t, fnvKey("watermill-once/migrate/wmonce"), worker.LockKey("migrate", "wmonce"))
	require.Equal(t, fnvKey("watermill-once/relay/wmonce/relay"), worker.LockKey("relay", "wmonce", "relay"))
	require.Equal(t, fnvKey("watermill-once/retention/s"), worker.LockKey("retention", "s"))
	require.Equal(t, fnvKey("watermill-once/retention-drop/s"), worker.LockKey("retention-drop", "s"))
	require.NotEqual(t, worker.LockKey("relay", "s", "a"), worker.LockKey("relay", "s", "b"))
	hi, lo := worker.LockKeyParts(-1)
	require.Equal(t, int64(0xffffffff), hi)
	require.Equal(t, int64(0xffffffff), lo)
}

// One Run/Close semantics for every worker: one Run at a time, Run again after it returned,
// Close cancels and waits, and is final.
func TestRunnerLifecycle(t *testing.T) {
	t.Parallel()
	var r worker.Runner
	started := make(chan struct{})
	returned := make(chan error, 1)
	ctx1, cancel1 := context.WithCancel(context.Background())
	go func() {
		returned <- r.Run(ctx1, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return nil
		})
	}()
	<-started
	require.ErrorIs(t, r.Run(context.Background(), func(context.Context) error {
		t.Error("a second concurrent Run must not run")
		return nil
	}), worker.ErrRunning)
	cancel1()
	require.NoError(t, <-returned)

	// Run again after it returned: it works, and Close cancels it and waits for it.
	started2 := make(chan struct{})
	var finished atomic.Bool
	go func() {
		returned <- r.Run(context.Background(), func(ctx context.Context) error {
			close(started2)
			<-ctx.Done()
			finished.Store(true)
			return errors.New("stopped")
		})
	}()
	<-started2
	require.NoError(t, r.Close())
	require.True(t, finished.Load(), "Close returned before Run did")
	require.EqualError(t, <-returned, "stopped")
	require.True(t, r.Closed())

	// Close is final and idempotent.
	require.NoError(t, r.Run(context.Background(), func(context.Context) error {
		t.Error("Run after Close must not work")
		return nil
	}))
	require.NoError(t, r.Close())
}

func TestCloseBeforeRun(t *testing.T) {
	t.Parallel()
	var r worker.Runner
	require.NoError(t, r.Close())
	called := false
	require.NoError(t, r.Run(context.Background(), func(context.Context) error { called = true; return nil }))
	require.False(t, called)
}

// Two instances on one key: one leads, the other stands by and takes over when the first stops.
func TestLeaderOneAtATimeAndTakeover(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	key := worker.LockKey("test", pgtest.NewName("leader"))
	var holders atomic.Int32
	leading := make(chan int, 2)
	newLeader := func() *worker.Leader {
		return &worker.Leader{DB: db, Key: key, Name: "test", Standby: 5 * time.Millisecond,
			Backoff: worker.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}}
	}
	leaders := []*worker.Leader{newLeader(), newLeader()}
	ctxs := make([]context.CancelFunc, 2)
	done := make(chan int, 2)
	for i, l := range leaders {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		go func() {
			_ = l.Run(ctx, func(ctx context.Context, conn *sql.Conn) error {
				if n := holders.Add(1); n != 1 {
					t.Errorf("%d instances lead at once", n)
				}
				leading <- i
				<-ctx.Done()
				holders.Add(-1)
				return nil
			})
			done <- i
		}()
	}
	first := <-leading
	require.True(t, leaders[first].Leading())
	require.False(t, leaders[1-first].Leading())
	ctxs[first]()
	require.Equal(t, first, <-done)
	require.False(t, leaders[first].Leading(), "the lock is given up when Run returns")
	require.Equal(t, 1-first, <-leading, "the standby takes over")
	ctxs[1-first]()
	<-done
}

// An error in lead releases the lock and is reported with the backoff wait; the instance then
// competes again.
func TestLeaderBacksOffAfterErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []time.Duration
	l := &worker.Leader{DB: db, Key: worker.LockKey("test", pgtest.NewName("leader")), Name: "test", Standby: time.Hour,
		Backoff: worker.Backoff{Base: time.Millisecond, Max: 4 * time.Millisecond}}
	l.OnError = func(err error, wait time.Duration) {
		waits = append(waits, wait)
		if len(waits) == 4 {
			cancel()
		}
	}
	boom := errors.New("boom")
	require.NoError(t, l.Run(ctx, func(context.Context, *sql.Conn) error { return boom }))
	require.Len(t, waits, 4)
	require.LessOrEqual(t, waits[0], time.Millisecond)
	require.GreaterOrEqual(t, waits[3], 2*time.Millisecond, "the wait doubled up to the cap")
	require.LessOrEqual(t, waits[3], 4*time.Millisecond)
}

// Start registers the run before it returns, so that a Close right after it waits for it.
func TestStartThenCloseWaits(t *testing.T) {
	t.Parallel()
	var r worker.Runner
	var stopped atomic.Bool
	require.NoError(t, r.Start(context.Background(), func(ctx context.Context) {
		<-ctx.Done()
		stopped.Store(true)
	}))
	require.ErrorIs(t, r.Start(context.Background(), func(context.Context) {}), worker.ErrRunning)
	require.NoError(t, r.Close())
	require.True(t, stopped.Load(), "Close returned before the run ended")
	require.NoError(t, r.Start(context.Background(), func(context.Context) { t.Error("started after Close") }))
}

// LeadingSignal announces each time a Leader on the key starts leading, once it holds the lock:
// a test of another package waits on it instead of polling Leading.
func TestLeadingSignalAnnouncesEachLead(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	key := worker.LockKey("test", pgtest.NewName("leader"))
	leading := worker.LeadingSignal(key)
	require.Same(t, leading, worker.LeadingSignal(key), "one signal per key")
	l := &worker.Leader{DB: db, Key: key, Name: "test", Standby: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leads := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx, func(context.Context, *sql.Conn) error {
			if leads++; leads == 2 {
				<-ctx.Done()
			}
			return nil // the first lead ends at once: the lock is given up and taken again
		})
	}()
	leading.WaitOrTimeout()
	leading.WaitOrTimeout()
	require.True(t, l.Leading(), "the event comes once the lock is held")
	cancel()
	<-done
}
