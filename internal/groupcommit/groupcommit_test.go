package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/groupcommit"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/testwait"
)

var errClosed = errors.New("closed")

// recorder is a group function that records each group's items and answers every member with
// answer(item), optionally holding each run until release is closed.
type recorder struct {
	mu      sync.Mutex
	groups  [][]string
	started chan []string // each group as its run starts
	release chan struct{} // nil: runs do not wait
	answer  func(item string) error
	running atomic.Int32
	most    atomic.Int32 // the most runs at once
}

func newRecorder() *recorder {
	return &recorder{started: make(chan []string, 100), answer: func(string) error { return nil }}
}

func (r *recorder) run(group []*groupcommit.Member[string]) {
	r.hold()
	defer r.running.Add(-1)
	items := make([]string, len(group))
	for i, m := range group {
		items[i] = m.Item
	}
	r.mu.Lock()
	r.groups = append(r.groups, items)
	r.mu.Unlock()
	r.started <- items
	if r.release != nil {
		<-r.release
	}
	for _, m := range group {
		m.Answer(r.answer(m.Item))
	}
}

// hold counts a lane in use (running, released by the caller) and keeps the most at once.
func (r *recorder) hold() {
	n := r.running.Add(1)
	for {
		most := r.most.Load()
		if n <= most || r.most.CompareAndSwap(most, n) {
			return
		}
	}
}

func (r *recorder) all() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.groups...)
}

func newQueue(config groupcommit.Config, r *recorder) (*groupcommit.Queue[string], *testsignal.Signal[int]) {
	var queued testsignal.Signal[int]
	queued.Init()
	config.Queued = &queued
	config.Closed = errClosed
	return groupcommit.New(config, r.run), &queued
}

// holdLane takes the queue's only free lane as a caller running alone would, until the
// returned function gives it back.
func holdLane(t *testing.T, q *groupcommit.Queue[string]) func() {
	t.Helper()
	require.True(t, q.Alone(), "a lane is free and nobody waits")
	return q.Release
}

// waitAsync calls Wait in a goroutine and returns its answer's channel.
func waitAsync(ctx context.Context, q *groupcommit.Queue[string], item string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- q.Wait(ctx, item) }()
	return ch
}

func TestLoneCallerRunsAloneAndPaysNothing(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	q, _ := newQueue(groupcommit.Config{Lanes: 2, MaxGroup: 10}, r)
	defer q.Close()
	for range 3 {
		require.True(t, q.Alone())
		require.Equal(t, 1, q.Waiting())
		q.Release()
	}
	require.True(t, q.Alone())
	require.True(t, q.Alone(), "two lanes: two callers alone at once")
	require.False(t, q.Alone(), "every lane busy")
	q.Release()
	q.Release()
	require.Zero(t, q.Waiting())
	require.Empty(t, r.all(), "no group ran")
}

func TestCallersThatFindEveryLaneBusyRunAsOneGroupInOrder(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 3}, r)
	defer q.Close()
	release := holdLane(t, q)
	var answers []<-chan error
	for i := 1; i <= 5; i++ {
		answers = append(answers, waitAsync(context.Background(), q, fmt.Sprintf("m-%d", i)))
		require.Equal(t, i, queued.WaitOrTimeout(), "m-%d waits in order", i)
	}
	require.False(t, q.Alone(), "nobody runs alone past those waiting")
	require.Equal(t, 6, q.Waiting())
	release() // the lane goes to the waiting members
	for _, a := range answers {
		require.NoError(t, testwait.Receive(t, a, "the member's answer"))
	}
	require.Equal(t, [][]string{{"m-1", "m-2", "m-3"}, {"m-4", "m-5"}}, r.all(), "MaxGroup caps a group, oldest first")
	require.Zero(t, q.Waiting())
	require.True(t, q.Alone(), "the lane is free again")
	q.Release()
}

func TestEachMemberGetsItsOwnAnswer(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	r.answer = func(item string) error {
		if item == "bad" {
			return errors.New("bad failed")
		}
		return nil
	}
	q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10}, r)
	defer q.Close()
	release := holdLane(t, q)
	good := waitAsync(context.Background(), q, "good")
	queued.WaitOrTimeout()
	bad := waitAsync(context.Background(), q, "bad")
	queued.WaitOrTimeout()
	release()
	require.NoError(t, testwait.Receive(t, good, "good's answer"))
	require.EqualError(t, testwait.Receive(t, bad, "bad's answer"), "bad failed")
}

func TestWaitingMemberWhoseContextEndsLeavesWithoutRunning(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10}, r)
	defer q.Close()
	release := holdLane(t, q)
	cause := errors.New("shutdown grace over")
	ctx, cancel := context.WithCancelCause(context.Background())
	gaveUp := waitAsync(ctx, q, "gives-up")
	queued.WaitOrTimeout()
	stays := waitAsync(context.Background(), q, "stays")
	queued.WaitOrTimeout()
	cancel(cause)
	require.ErrorIs(t, testwait.Receive(t, gaveUp, "the answer of the member that gave up"), cause)
	release()
	require.NoError(t, testwait.Receive(t, stays, "the other member's answer"))
	require.Equal(t, [][]string{{"stays"}}, r.all(), "the member that gave up never ran")
}

func TestMemberInARunningGroupWaitsForItsAnswerPastItsContext(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	r.release = make(chan struct{})
	q, _ := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10}, r)
	defer q.Close()
	ctx, cancel := context.WithCancel(context.Background())
	// Lanes free but Wait called directly: the member waits and a lane starts for it at once.
	answer := waitAsync(ctx, q, "m-1")
	require.Equal(t, []string{"m-1"}, testwait.Receive(t, r.started, "the group to start"))
	cancel()
	select {
	case err := <-answer:
		t.Fatalf("Wait returned %v while the member's group was still running", err)
	default:
	}
	close(r.release)
	require.NoError(t, testwait.Receive(t, answer, "the member's answer"), "the run's answer, not the context's")
}

func TestCloseAnswersWaitingMembersWithClosed(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10}, r)
	release := holdLane(t, q)
	waiting := waitAsync(context.Background(), q, "m-1")
	queued.WaitOrTimeout()
	q.Close()
	require.ErrorIs(t, testwait.Receive(t, waiting, "the waiting member's answer"), errClosed)
	require.ErrorIs(t, q.Wait(context.Background(), "late"), errClosed)
	require.False(t, q.Alone())
	release()
	q.Close() // idempotent
	require.Empty(t, r.all(), "nothing ran after Close")
}

func TestDrainingCloseRunsWaitingMembersAndWaitsForLoneRuns(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10, Drain: true}, r)
	release := holdLane(t, q)
	waiting := waitAsync(context.Background(), q, "m-1")
	queued.WaitOrTimeout()
	var released atomic.Bool
	closedAfterRelease := make(chan bool, 1)
	go func() { q.Close(); closedAfterRelease <- released.Load() }()
	// Close cannot return before the caller running alone gives its lane back. (Had it returned
	// first, the flag would say so; if Close only starts after the release, nothing is shown.)
	released.Store(true)
	release()
	require.True(t, testwait.Receive(t, closedAfterRelease, "Close to return"), "Close returned while a caller was running alone")
	require.NoError(t, testwait.Receive(t, waiting, "the waiting member's answer"), "drained, not refused")
	require.Equal(t, [][]string{{"m-1"}}, r.all())
	require.ErrorIs(t, q.Wait(context.Background(), "late"), errClosed)
	require.False(t, q.Alone())
}

func TestLingerMakesEveryCallerWaitForCompany(t *testing.T) {
	t.Parallel()
	for _, drain := range []bool{false, true} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			t.Parallel()
			r := newRecorder()
			q, queued := newQueue(groupcommit.Config{Lanes: 1, MaxGroup: 10, Linger: time.Hour, Drain: drain}, r)
			require.False(t, q.Alone(), "with Linger nobody runs alone")
			first := waitAsync(context.Background(), q, "m-1")
			queued.WaitOrTimeout()
			second := waitAsync(context.Background(), q, "m-2")
			queued.WaitOrTimeout()
			// The lane lingers for an hour, and Close ends its wait: without Drain the members
			// are refused, with Drain they run, as one group.
			q.Close()
			for _, answer := range []<-chan error{first, second} {
				err := testwait.Receive(t, answer, "a lingering member's answer")
				if drain {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, errClosed)
				}
			}
			if drain {
				require.Equal(t, [][]string{{"m-1", "m-2"}}, r.all())
			} else {
				require.Empty(t, r.all())
			}
		})
	}
}

// Many callers at once: every one is answered exactly once, no group exceeds MaxGroup and no
// more than Lanes runs (groups and callers alone) go at once.
func TestConcurrentCallersAreEachAnsweredOnce(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	r.started = make(chan []string, 2000)
	var alone atomic.Int32
	q, _ := newQueue(groupcommit.Config{Lanes: 3, MaxGroup: 7}, r)
	defer q.Close()
	errs := make(chan error, 500)
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Go(func() {
			if q.Alone() {
				r.hold() // a lane in use, as a group's run is
				alone.Add(1)
				r.running.Add(-1)
				q.Release()
				return
			}
			errs <- q.Wait(context.Background(), fmt.Sprint(i))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	grouped := 0
	for _, g := range r.all() {
		require.LessOrEqual(t, len(g), 7)
		grouped += len(g)
	}
	require.Equal(t, 500, grouped+int(alone.Load()), "every caller ran once")
	require.LessOrEqual(t, r.most.Load(), int32(3), "never more runs at once than lanes")
	require.Zero(t, q.Waiting())
}
