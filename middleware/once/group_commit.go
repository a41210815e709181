package once

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/groupcommit"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/pgtx"
)

// member is one delivery of a group: the message and the handler to run it with.
type member struct {
	d *delivery
	h message.HandlerFunc
	// unwatch stops the group's watch of the member's context (run); nil when unwatched.
	unwatch func() bool
}

// queued is a delivery waiting for its group's outcome (internal/groupcommit); its context is
// detached from Router.Close for ShutdownGrace.
type queued = groupcommit.Member[member]

// groupCommitter runs the deliveries that find every lane busy as groups, each in one
// transaction (GroupCommitConfig); internal/groupcommit decides who runs together.
type groupCommitter struct {
	groups, grouped atomic.Uint64 // committed transactions, messages applied in them

	e           *Middleware
	lanes       *groupcommit.Queue[member]
	testSignals groupCommitTestSignals
}

// groupCommitTestSignals are the group committer's events, for tests (internal/testsignal).
type groupCommitTestSignals struct {
	Queued    testsignal.Signal[int]    // a delivery waits for a lane: how many wait now
	Committed testsignal.Signal[int]    // a group committed: how many messages it applied
	Isolated  testsignal.Signal[string] // a delivery failed alone, the others run again: its key
}

// Init makes every signal carry events.
func (s *groupCommitTestSignals) Init() {
	s.Queued.Init()
	s.Committed.Init()
	s.Isolated.Init()
}

func newGroupCommitter(e *Middleware, config GroupCommitConfig) *groupCommitter {
	g := &groupCommitter{e: e}
	g.lanes = groupcommit.New(groupcommit.Config{
		Lanes:    config.Workers,
		MaxGroup: config.TxBatchSize,
		Linger:   config.Linger,
		Closed:   errClosed,
		Queued:   &g.testSignals.Queued,
	}, g.run)
	return g
}

// close answers the deliveries still waiting with errClosed and waits for the groups running.
func (g *groupCommitter) close() { g.lanes.Close() }

var errClosed = errors.New("once: middleware closed")

// submit runs a delivery. With a lane free and nobody waiting (Linger 0), it runs at once in
// the caller's goroutine in a transaction of its own, exactly as without group commit: a lone
// message pays nothing for it. Otherwise it waits, and the next lane to free up takes everything
// waiting (up to TxBatchSize) as one group. A delivery still waiting when its shutdown grace is
// over, or its deadline passes, gives up; one that a lane has taken waits for its group's
// outcome, since the group may hold its claim.
func (g *groupCommitter) submit(origCtx context.Context, h message.HandlerFunc, d *delivery) error {
	if g.lanes.Alone() {
		defer g.lanes.Release()
		d.tracedPath(pathOwnTx)
		return g.e.runInOwnTx(origCtx, h, d)
	}
	d.tracedPath(pathGroupCommit)
	ctx, release := detachForShutdown(origCtx, g.e.config.ShutdownGrace)
	defer release()
	return g.lanes.Wait(ctx, member{d: d, h: h})
}

// run commits a group, isolating failed messages: a failure rolls the transaction back, the
// failed message is answered alone and the rest run again.
func (g *groupCommitter) run(group []*queued) {
	e := g.e
	defer func() {
		for _, q := range group {
			q.Answer(errors.New("once: group ended without an outcome")) // never reached
		}
	}()
	var live []*queued
	for _, q := range group {
		if err := q.Context().Err(); err != nil {
			q.Answer(context.Cause(q.Context())) // gave up waiting (shutdown): redelivered later
			continue
		}
		live = append(live, q)
	}
	pending := g.dropSameBatchCopies(live)
	// The wait between attempts ends when a delivery of the group still waiting for its outcome
	// gives up (its shutdown grace is over): the group's outcome is then an error, and its
	// messages are redelivered. Only while it waits: a member answered early (a duplicate, a
	// handler isolated) returns, and its caller's context ends with it; the group's work must
	// not depend on it (settle stops the watch before answering).
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	for _, q := range pending {
		q.Item.unwatch = context.AfterFunc(q.Context(), func() { cancel(context.Cause(q.Context())) })
		defer q.Item.unwatch()
	}
	for len(pending) > 0 {
		// Each transaction of the group (a new one after a handler is isolated) has
		// TxRetry's attempts for serialization failures and deadlocks.
		isolated := false
		err := pgtx.Retry(ctx, e.config.TxRetry, func(_ context.Context, attempt int) error {
			if attempt > 1 {
				for _, q := range pending {
					q.Item.d.counters.txRetries.Add(1)
				}
			}
			next, err := g.attempt(pending)
			if err != nil && e.ensurePartition(context.Background(), err) {
				next, err = g.attempt(next) // the missing day partition exists now
			}
			pending, isolated = next, err == nil
			return err
		})
		if isolated {
			continue
		}
		for _, q := range pending {
			q.Item.d.counters.failed.Add(1)
			g.settle(q, err)
		}
		return
	}
}

// dropSameBatchCopies keeps the first of several copies of one key in a group; the others are
// answered with it when it is settled.
func (g *groupCommitter) dropSameBatchCopies(group []*queued) []*queued {
	seen := make(map[[2]string]*queued, len(group))
	var out []*queued
	for _, q := range group {
		k := [2]string{q.Item.d.consumer, q.Item.d.key}
		if first, ok := seen[k]; ok {
			first.Item.d.copies = append(first.Item.d.copies, q)
			continue
		}
		seen[k] = q
		out = append(out, q)
	}
	return out
}

// attempt runs one transaction over pending. With a nil error it returns the deliveries that
// must run again because one handler failed and was isolated (nil when all committed); with an
// error (begin, claim or commit failed for the whole group) it returns the deliveries still
// unanswered, for the caller to retry or fail.
func (g *groupCommitter) attempt(pending []*queued) ([]*queued, error) {
	e := g.e
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, e.config.TxOptions)
	if err != nil {
		return pending, fmt.Errorf("once: begin group: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := e.guard.Open(ctx, tx); err != nil {
		return pending, fmt.Errorf("once: %w", err)
	}

	fresh, dups, err := g.claimAll(ctx, tx, pending)
	if err != nil {
		return pending, err
	}
	for _, q := range dups {
		g.settle(q, nil) // applied and committed by an earlier transaction (unless already refused)
	}
	for _, q := range fresh {
		// A failed message's claim must not commit: settle it and start over without it.
		if err := e.checkAge(q.Item.d); err != nil {
			return g.isolate(fresh, q, err), nil
		}
	}
	for _, q := range fresh {
		d := q.Item.d
		d.sharedTx = true
		if err := e.apply(q.Context(), q.Item.h, d, tx); err != nil {
			if pgtx.IsRetryableTx(err) && !wmonce.IsPermanent(err) {
				// The transaction lost a race (serialization failure, deadlock) in a handler: run
				// it again whole, this message included, as TxRetry promises on every path.
				return fresh, err
			}
			// Its own failure, or it ended the transaction (Commit or Rollback, refused by the
			// attempt guard, so nothing of the group committed): either way the others
			// run again without it.
			return g.isolate(fresh, q, err), nil
		}
	}
	if err := e.guard.Close(ctx, tx); err != nil {
		return fresh, err
	}
	committed = true
	err = tx.Commit()
	for _, q := range fresh {
		q.Item.d.committed(err)
	}
	if err != nil {
		e.logger.Error("Group commit failed", err, watermill.LogFields{"messages": len(fresh)})
		return fresh, fmt.Errorf("once: commit group: %w", err)
	}
	g.groups.Add(1)
	g.grouped.Add(uint64(len(fresh)))
	g.testSignals.Committed.Signal(len(fresh))
	for _, q := range fresh {
		q.Item.d.counters.fresh.Add(1)
		g.settle(q, nil)
	}
	return nil, nil
}

// isolate answers a delivery that failed on its own (its age, its handler) and returns the rest
// of fresh, to run again in a new transaction without it.
func (g *groupCommitter) isolate(fresh []*queued, q *queued, err error) []*queued {
	g.settle(q, err)
	g.testSignals.Isolated.Signal(q.Item.d.key)
	return without(fresh, q)
}

// settle answers a delivery and every copy of it that arrived in the same group: copies of an
// applied message are duplicates; copies of a failed one fail with it and are redelivered.
func (g *groupCommitter) settle(q *queued, err error) {
	if q.Item.unwatch != nil {
		q.Item.unwatch() // before the answer: the caller's context ends once it has it
	}
	q.Answer(err)
	for _, c := range q.Item.d.copies {
		if err == nil {
			copied := c.Item.d
			copied.countDuplicate()
			g.e.logDuplicate(copied, "Duplicate skipped: a copy arrived in the same group", copied.fields)
		}
		c.Answer(err)
	}
	q.Item.d.copies = nil
}

// without returns qs without drop.
func without(qs []*queued, drop *queued) []*queued {
	out := make([]*queued, 0, len(qs))
	for _, q := range qs {
		if q != drop {
			out = append(out, q)
		}
	}
	return out
}
