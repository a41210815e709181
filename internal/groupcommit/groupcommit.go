// Package groupcommit is the module's one group-commit queue: the effectively-once middleware's
// group committer and the inbox Receiver's writers both use it. Many callers want the same kind
// of work done (claim a key and run a handler, insert a row), and a transaction each would make
// every caller wait on a commit of its own; instead, callers that arrive while every lane is busy
// are run together, as one group, by the next lane to free up, and share its commit.
//
// It is adaptive. A caller that finds a lane free and nobody waiting runs alone, at once, in its
// own goroutine (Alone, then Release): a lone caller pays nothing for the queue, neither a
// goroutine hop nor a wait. Only callers that find every lane busy wait (Wait); a lane then takes
// all of them, up to MaxGroup, oldest first, and hands them to the group function its owner gave
// New, in a goroutine of the queue. The queue decides who runs together and when; the group
// function decides what running a group means, and answers each member.
package groupcommit

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/wmonce/watermill-once/internal/testsignal"
)

// Config configures a Queue. Its owner validates it: Lanes and MaxGroup at least 1.
type Config struct {
	// Lanes is how many runs (groups, or callers running alone) go at once; each typically holds
	// one database connection.
	Lanes int
	// MaxGroup caps the members of one group.
	MaxGroup int
	// Linger makes a lane that starts wait this long before it takes its first group, so that
	// company can gather; while it is set, nobody runs alone. Zero: a group is whatever arrived
	// while every lane was busy, and a lone caller is never delayed.
	Linger time.Duration
	// Drain makes Close let the lanes run every member already waiting, and wait for callers
	// running alone too. Without it, Close answers waiting members with Closed and waits only
	// for the groups being run.
	Drain bool
	// Closed is what Wait returns after Close, and, without Drain, the answer of the members
	// still waiting when Close is called.
	Closed error
	// Queued, when set, is told the queue's length each time a member starts waiting: a test
	// signal of the queue's owner (internal/testsignal).
	Queued *testsignal.Signal[int]
}

// Member is one caller waiting in the queue or in a group: its item, the context it waits with,
// and the answer it waits for.
type Member[T any] struct {
	Item T

	ctx      context.Context
	done     chan error
	answered bool // touched only by the holder of the member: its group's run, or Close
}

// Context is the context the member waits with. When it ends before a lane takes the member,
// the member leaves the queue; once in a group, the member waits for its answer regardless.
func (m *Member[T]) Context() context.Context { return m.ctx }

// Answer gives the member its outcome; only the first answer counts. Only the group function
// running the member's group calls it.
func (m *Member[T]) Answer(err error) {
	if !m.answered {
		m.answered = true
		m.done <- err
	}
}

// Queue groups callers into runs. Its zero value is not usable: call New.
type Queue[T any] struct {
	config Config
	run    func(group []*Member[T])

	mu      sync.Mutex
	free    int          // lanes not in use
	queue   []*Member[T] // waiting for a lane, oldest first
	waiting int          // callers with the queue: running alone, waiting, or in a group being run
	closed  bool
	closing chan struct{}  // closed by Close: ends a lane's Linger
	wg      sync.WaitGroup // lane goroutines; with Drain, callers running alone too
}

// New returns a queue whose lanes hand each group to run. run must answer every member of its
// group (Member.Answer) before it returns; the members' Wait calls return those answers.
func New[T any](config Config, run func(group []*Member[T])) *Queue[T] {
	return &Queue[T]{config: config, run: run, free: config.Lanes, closing: make(chan struct{})}
}

// Alone reports whether the caller may run now, alone, in its own goroutine: a lane is free,
// nobody waits, Linger is zero and the queue is open. The lane is then the caller's until it
// calls Release, which it must.
func (q *Queue[T]) Alone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.free == 0 || len(q.queue) > 0 || q.config.Linger > 0 {
		return false
	}
	q.free--
	q.waiting++
	if q.config.Drain {
		q.wg.Add(1)
	}
	return true
}

// Release gives back the lane Alone lent, or hands it to the members that queued meanwhile.
func (q *Queue[T]) Release() {
	q.mu.Lock()
	q.waiting--
	if q.config.Drain {
		defer q.wg.Done() // after the Add of the lane below, so that Close cannot miss it
	}
	if q.idle() {
		q.free++
		q.mu.Unlock()
		return
	}
	q.wg.Add(1)
	q.mu.Unlock()
	go q.lane()
}

// Wait queues item and returns the answer its group's run gives it, or Closed after Close. A
// member whose ctx ends before a lane takes it leaves the queue and returns context.Cause(ctx);
// once a lane has taken it, Wait waits for the answer, since the run may already have done the
// member's work (a claim, a row) and only its outcome tells.
func (q *Queue[T]) Wait(ctx context.Context, item T) error {
	m := &Member[T]{Item: item, ctx: ctx, done: make(chan error, 1)}
	startLane, err := q.enqueue(m)
	if err != nil {
		return err
	}
	defer q.leave()
	if startLane {
		go q.lane()
	}
	select {
	case err := <-m.done:
		return err
	case <-ctx.Done():
		if q.withdraw(m) {
			return context.Cause(ctx)
		}
		return <-m.done // a lane has it: its run may hold the member's work, wait for the outcome
	}
}

// enqueue queues m and reports whether a free lane is now the caller's to start; Closed after
// Close.
func (q *Queue[T]) enqueue(m *Member[T]) (startLane bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, q.config.Closed
	}
	q.queue = append(q.queue, m)
	q.waiting++
	if q.config.Queued != nil {
		q.config.Queued.Signal(len(q.queue))
	}
	if q.free == 0 {
		return false, nil
	}
	q.free--
	q.wg.Add(1)
	return true, nil
}

// withdraw takes m out of the queue if no lane has taken it yet, and reports whether it did.
func (q *Queue[T]) withdraw(m *Member[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.queue, m)
	if i >= 0 {
		q.queue = slices.Delete(q.queue, i, i+1)
	}
	return i >= 0
}

func (q *Queue[T]) leave() {
	q.mu.Lock()
	q.waiting--
	q.mu.Unlock()
}

// Waiting returns how many callers are with the queue now: running alone, waiting for a lane,
// or in a group being run.
func (q *Queue[T]) Waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting
}

// Queued returns how many callers wait for a lane now (taken by none yet).
func (q *Queue[T]) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// lane runs groups until nobody waits (or, without Drain, the queue is closed).
func (q *Queue[T]) lane() {
	defer q.wg.Done()
	q.linger()
	for {
		q.mu.Lock()
		if q.idle() {
			q.free++
			q.mu.Unlock()
			return
		}
		n := min(len(q.queue), q.config.MaxGroup)
		group := q.queue[:n:n]
		q.queue = q.queue[n:]
		q.mu.Unlock()
		q.run(group)
	}
}

// linger lets a lane's first group fill up for Linger, unless the queue closes meanwhile.
func (q *Queue[T]) linger() {
	if q.config.Linger <= 0 {
		return
	}
	t := time.NewTimer(q.config.Linger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-q.closing:
	}
}

// idle reports that a lane has nothing to run: nobody waits, or the queue is closed without
// Drain. q.mu is held.
func (q *Queue[T]) idle() bool { return len(q.queue) == 0 || q.closed && !q.config.Drain }

// Close stops the queue: Alone reports false and Wait returns Closed from now on, and a lane
// lingering for company stops waiting. Without Drain, members still waiting are answered with
// Closed; with Drain, the lanes run them. Close returns when the lanes are idle (with Drain,
// when every caller the queue took has its answer). It is idempotent.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.closing)
	}
	var refused []*Member[T]
	if !q.config.Drain {
		refused, q.queue = q.queue, nil
	}
	q.mu.Unlock()
	for _, m := range refused {
		m.Answer(q.config.Closed)
	}
	q.wg.Wait()
}
