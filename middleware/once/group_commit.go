package once

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/groupcommit"
	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/partition"
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

var (
	errClosed    = errors.New("once: middleware closed")
	errNoOutcome = errors.New("once: group ended without an outcome")
)

// run commits a group, isolating failed messages: a failure rolls the transaction back, the
// failed message is answered alone and the rest run again.
func (g *groupCommitter) run(group []*queued) {
	defer func() {
		for _, q := range group {
			q.Answer(errNoOutcome) // never reached
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
	g.runPending(ctx, pending)
}

// runPending commits pending in as many transactions as isolating failures (and bisecting
// failed batches, batch.go) takes.
func (g *groupCommitter) runPending(ctx context.Context, pending []*queued) {
	e := g.e
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
		if b := (*bisectError)(nil); errors.As(err, &b) {
			g.runPending(ctx, b.halves[0])
			g.runPending(ctx, b.halves[1])
			return
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
	if next, isolated, err := g.applyAll(tx, fresh); isolated || err != nil {
		return next, err
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

// applyAll runs the handlers of fresh in tx, one after another. A delivery that fails on its
// own (its age, its handler) is isolated: isolated is true and next holds the others, to run
// again without it. A transaction that lost a race returns err, for the group to run again.
func (g *groupCommitter) applyAll(tx *sql.Tx, fresh []*queued) (next []*queued, isolated bool, _ error) {
	for _, q := range fresh {
		// A failed message's claim must not commit: settle it and start over without it.
		if err := g.e.checkAge(q.Item.d); err != nil {
			return g.isolate(fresh, q, err), true, nil
		}
	}
	batches := &lend.Collector{} // batch handlers hand their messages to it (batch.go)
	for _, q := range fresh {
		d := q.Item.d
		d.sharedTx = true
		batches.Current = q
		if err := g.e.apply(lend.WithCollector(q.Context(), batches), q.Item.h, d, tx); err != nil {
			if pgtx.IsRetryableTx(err) && !wmonce.IsPermanent(err) {
				// The transaction lost a race (serialization failure, deadlock) in a handler: run
				// it again whole, this message included, as TxRetry promises on every path.
				return fresh, false, err
			}
			// Its own failure, or it ended the transaction (Commit or Rollback, refused by the
			// attempt guard, so nothing of the group committed): either way the others
			// run again without it.
			return g.isolate(fresh, q, err), true, nil
		}
	}
	return g.runBatches(tx, fresh, batches)
}

// claimAll inserts every key with one statement and splits the group into fresh claims and
// duplicates (checking the duplicates' fingerprints with one more statement).
func (g *groupCommitter) claimAll(ctx context.Context, tx *sql.Tx, pending []*queued) (fresh, dups []*queued, err error) {
	e := g.e
	consumers := make([]string, len(pending))
	keys := make([]string, len(pending))
	prints := make([][]byte, len(pending))
	for i, q := range pending {
		consumers[i], keys[i], prints[i] = q.Item.d.consumer, q.Item.d.key, q.Item.d.fingerprint
	}
	args := []any{consumers, keys, prints}
	var days []time.Time // PartitionByDay only
	if e.q.daily {
		days = make([]time.Time, len(pending))
		for i, q := range pending {
			days[i] = partition.Day(q.Item.d.occurredAt)
		}
		args = append(args, days)
	}
	rows, err := tx.QueryContext(ctx, e.q.claimMany, args...)
	if err != nil {
		if e.q.daily && pgtx.SQLState(err) == pgtx.CodeCheckViolation {
			return nil, nil, &missingPartitionError{days: distinct(days), err: err}
		}
		return nil, nil, fmt.Errorf("once: claim group: %w", err)
	}
	claimed, err := scanClaimed(rows, len(pending))
	if err != nil {
		return nil, nil, fmt.Errorf("once: claim group: %w", err)
	}
	for _, q := range pending {
		if claimed[[2]string{q.Item.d.consumer, q.Item.d.key}] {
			q.Item.d.claimed()
			fresh = append(fresh, q)
		} else {
			q.Item.d.countDuplicate()
			dups = append(dups, q)
		}
	}
	if len(dups) > 0 {
		g.checkFingerprints(ctx, tx, dups)
	}
	return fresh, dups, nil
}

// scanClaimed reads the (consumer, key) pairs the group's claim inserted and closes rows: the
// transaction's next statement needs the connection.
func scanClaimed(rows *sql.Rows, n int) (map[[2]string]bool, error) {
	defer rows.Close()
	claimed := make(map[[2]string]bool, n)
	for rows.Next() {
		var c, k string
		if err := rows.Scan(&c, &k); err != nil {
			return nil, err
		}
		claimed[[2]string{c, k}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return claimed, rows.Close()
}

func distinct(days []time.Time) []time.Time {
	seen := map[time.Time]bool{}
	var out []time.Time
	for _, d := range days {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// checkFingerprints reports duplicates whose payload differs from the applied copy's. With
// RejectFingerprintMismatch the copy is answered with the permanent error right away.
func (g *groupCommitter) checkFingerprints(ctx context.Context, tx *sql.Tx, dups []*queued) {
	e := g.e
	consumers := make([]string, len(dups))
	keys := make([]string, len(dups))
	for i, q := range dups {
		consumers[i], keys[i] = q.Item.d.consumer, q.Item.d.key
	}
	rows, err := tx.QueryContext(ctx, e.q.lookupMany, consumers, keys)
	if err != nil {
		e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
		return
	}
	defer rows.Close()
	type applied struct {
		fingerprint []byte
		at          time.Time
	}
	stored := map[[2]string]applied{}
	for rows.Next() {
		var c, k string
		var a applied
		if err := rows.Scan(&c, &k, &a.fingerprint, &a.at); err != nil {
			e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
			return
		}
		stored[[2]string{c, k}] = a
	}
	if err := rows.Err(); err != nil {
		e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
		return
	}
	for _, q := range dups {
		if a, ok := stored[[2]string{q.Item.d.consumer, q.Item.d.key}]; ok {
			if err := e.reportDuplicate(q.Item.d, a.fingerprint, a.at); err != nil {
				g.settle(q, err)
			}
		}
	}
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
			g.e.logDuplicate(copied, "Duplicate skipped: a copy arrived in the same group", copied.logFields())
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
