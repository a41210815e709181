package once

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/pgtx"
)

// GroupCommitConfig turns on group commit: when messages arrive faster than Workers transactions
// can take them (several Kafka partitions, several subscriptions, many handlers), those that find
// every transaction busy are claimed with one statement, handled one after another in ONE
// transaction and committed together, then each is acked. Commits, not handlers, are what a
// PostgreSQL consumer waits on; sharing them raises throughput when many messages are in flight.
//
// It is adaptive: a message that finds a lane (one of Workers transactions) free and nobody
// waiting runs at once, in the caller's goroutine, in a transaction of its own, exactly as without
// group commit; so with one message in flight, or up to Workers, it costs nothing. Only messages
// that arrive while every lane is busy wait, and the next lane to free up takes all of them (up to
// TxBatchSize) as one group.
//
// The guarantee is the same as per-message transactions: each message is acked only after the
// commit that holds its claim, effects and outputs. A message whose handler fails is isolated:
// the group's transaction is rolled back, the failed message is nacked alone, and the others are
// run again in a new transaction (their handlers run twice, the first run leaving no trace). A
// handler that fails with a serialization failure or deadlock is not at fault: the whole group
// runs again, up to TxRetry's attempts, as a per-message transaction would. Handlers must
// therefore be short and touch only the database; a slow handler delays every message of its
// group. Messages from watermill-sql's subscriber keep using the subscriber's
// transaction and are not grouped.
//
// Measured figures are in the README (Performance); run
// BENCH_IN_FLIGHT=n go test -run '^$' -bench HandlerPathsInterleaved -benchtime 1x ./middleware/once/
// to compare on your machine.
type GroupCommitConfig struct {
	// Enabled turns group commit on.
	Enabled bool
	// TxBatchSize caps the messages of one transaction. Default DefaultGroupCommitTxBatchSize
	// (100), at most MaxGroupCommitTxBatchSize.
	TxBatchSize int
	// Workers is how many transactions (lanes) run at once, each holding one connection; beyond
	// that, messages are grouped. Default DefaultGroupCommitWorkers (2): fewer lanes make bigger
	// groups (fewer commits); more help when handlers are slow.
	Workers int
	// Linger makes every message wait for company before its group runs, even when a lane is
	// free. Default 0: a message runs at once when a lane is free, and a group is whatever arrived
	// while every lane was busy, so a lone message is never delayed.
	Linger time.Duration
}

// Defaults and limits of GroupCommitConfig.
const (
	DefaultGroupCommitTxBatchSize = 100
	DefaultGroupCommitWorkers     = 2
	MaxGroupCommitTxBatchSize     = 10000
)

func (c *GroupCommitConfig) setDefaults() {
	c.TxBatchSize = cmp.Or(c.TxBatchSize, DefaultGroupCommitTxBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultGroupCommitWorkers)
}

func (c GroupCommitConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	if c.TxBatchSize < 1 || c.TxBatchSize > MaxGroupCommitTxBatchSize {
		return fmt.Errorf("GroupCommit.TxBatchSize must be between 1 and %d, got %d", MaxGroupCommitTxBatchSize, c.TxBatchSize)
	}
	if c.Workers < 1 {
		return fmt.Errorf("GroupCommit.Workers must be at least 1, got %d", c.Workers)
	}
	if c.Linger < 0 {
		return errors.New("GroupCommit.Linger must not be negative")
	}
	return nil
}

// queued is one delivery waiting for its group's outcome.
type queued struct {
	d        *delivery
	h        message.HandlerFunc
	ctx      context.Context // detached from Router.Close for ShutdownGrace
	done     chan error
	answered bool // touched only by the worker that owns the group
}

func (q *queued) answer(err error) {
	if !q.answered {
		q.answered = true
		q.done <- err
	}
}

type groupCommitter struct {
	groups, grouped atomic.Uint64 // committed transactions, messages applied in them

	e      *Middleware
	config GroupCommitConfig

	mu     sync.Mutex
	free   int       // lanes (transactions at once) not in use
	queue  []*queued // waiting for a lane
	closed bool
	wg     sync.WaitGroup // lane goroutines

	// onQueued, set by tests only, is told the queue length each time a delivery waits.
	onQueued func(waiting int)
}

func newGroupCommitter(e *Middleware, config GroupCommitConfig) *groupCommitter {
	return &groupCommitter{e: e, config: config, free: config.Workers}
}

func (g *groupCommitter) close() {
	g.mu.Lock()
	g.closed = true
	queued := g.queue
	g.queue = nil
	g.mu.Unlock()
	for _, q := range queued {
		q.done <- errClosed
	}
	g.wg.Wait()
}

var errClosed = errors.New("once: middleware closed")

// submit runs a delivery. With a lane free and nobody waiting (Linger 0), it runs at once in
// the caller's goroutine in a transaction of its own, exactly as without group commit: a lone
// message pays nothing for it. Otherwise it waits, and the next lane to free up takes everything
// waiting (up to TxBatchSize) as one group.
func (g *groupCommitter) submit(origCtx context.Context, h message.HandlerFunc, d *delivery) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return errClosed
	}
	if g.free > 0 && len(g.queue) == 0 && g.config.Linger == 0 {
		g.free--
		g.mu.Unlock()
		err := g.e.runInOwnTx(origCtx, h, d)
		g.releaseLane()
		return err
	}
	ctx, release := detachForShutdown(origCtx, g.e.config.ShutdownGrace)
	defer release()
	q := &queued{d: d, h: h, ctx: ctx, done: make(chan error, 1)}
	g.queue = append(g.queue, q)
	if g.onQueued != nil {
		g.onQueued(len(g.queue))
	}
	startLane := g.free > 0
	if startLane {
		g.free--
		g.wg.Add(1)
	}
	g.mu.Unlock()
	if startLane {
		go g.lane()
	}
	select {
	case err := <-q.done:
		return err
	case <-ctx.Done(): // shutdown grace over, or a deadline: give up waiting unless a lane has it
		g.mu.Lock()
		if i := slices.Index(g.queue, q); i >= 0 {
			g.queue = slices.Delete(g.queue, i, i+1)
			g.mu.Unlock()
			return context.Cause(ctx)
		}
		g.mu.Unlock()
		return <-q.done // a lane runs it: its group may hold the claim, wait for the outcome
	}
}

// releaseLane gives a lane back, or hands it to the waiting messages.
func (g *groupCommitter) releaseLane() {
	g.mu.Lock()
	if len(g.queue) == 0 || g.closed {
		g.free++
		g.mu.Unlock()
		return
	}
	g.wg.Add(1)
	g.mu.Unlock()
	go g.lane()
}

// lane runs groups until nobody waits.
func (g *groupCommitter) lane() {
	defer g.wg.Done()
	if g.config.Linger > 0 {
		time.Sleep(g.config.Linger) // let the group fill up
	}
	for {
		g.mu.Lock()
		if len(g.queue) == 0 || g.closed {
			g.free++
			g.mu.Unlock()
			return
		}
		n := min(len(g.queue), g.config.TxBatchSize)
		group := g.queue[:n:n]
		g.queue = g.queue[n:]
		g.mu.Unlock()
		g.run(group)
	}
}

// run commits a group, isolating failed messages: a failure rolls the transaction back, the
// failed message is answered alone and the rest run again.
func (g *groupCommitter) run(group []*queued) {
	e := g.e
	defer func() {
		for _, q := range group {
			q.answer(errors.New("once: group ended without an outcome")) // never reached
		}
	}()
	var live []*queued
	for _, q := range group {
		if err := q.ctx.Err(); err != nil {
			q.answer(context.Cause(q.ctx)) // gave up waiting (shutdown): redelivered later
			continue
		}
		live = append(live, q)
	}
	pending := g.dropSameBatchCopies(live)
	// The wait between attempts ends when a delivery of the group gives up (its shutdown grace
	// is over): the group's outcome is then an error, and its messages are redelivered.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	for _, q := range pending {
		stop := context.AfterFunc(q.ctx, func() { cancel(context.Cause(q.ctx)) })
		defer stop()
	}
	for len(pending) > 0 {
		// Each transaction of the group (a new one after a handler is isolated) has
		// TxRetry's attempts for serialization failures and deadlocks.
		isolated := false
		err := pgtx.Retry(ctx, e.config.TxRetry, func(_ context.Context, attempt int) error {
			if attempt > 1 {
				for _, q := range pending {
					q.d.counters.txRetries.Add(1)
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
			q.d.counters.failed.Add(1)
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
		k := [2]string{q.d.consumer, q.d.key}
		if first, ok := seen[k]; ok {
			first.d.copies = append(first.d.copies, q)
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
		if err := e.checkAge(q.d); err != nil {
			g.settle(q, err)
			return without(fresh, q), nil
		}
	}
	for _, q := range fresh {
		q.d.sharedTx = true
		if err := e.apply(q.ctx, q.h, q.d, tx); err != nil {
			if pgtx.IsRetryableTx(err) && !wmonce.IsPermanent(err) {
				// The transaction lost a race (serialization failure, deadlock) in a handler: run
				// it again whole, this message included, as TxRetry promises on every path.
				return fresh, err
			}
			// Its own failure, or it ended the transaction (Commit or Rollback, refused by the
			// attempt guard, so nothing of the group committed): either way the others
			// run again without it.
			g.settle(q, err)
			return without(fresh, q), nil
		}
	}
	if err := e.guard.Close(ctx, tx); err != nil {
		return fresh, err
	}
	committed = true
	err = tx.Commit()
	for _, q := range fresh {
		q.d.committed(err)
	}
	if err != nil {
		e.logger.Error("Group commit failed", err, watermill.LogFields{"messages": len(fresh)})
		return fresh, fmt.Errorf("once: commit group: %w", err)
	}
	g.groups.Add(1)
	g.grouped.Add(uint64(len(fresh)))
	for _, q := range fresh {
		q.d.counters.fresh.Add(1)
		g.settle(q, nil)
	}
	return nil, nil
}

// settle answers a delivery and every copy of it that arrived in the same group: copies of an
// applied message are duplicates; copies of a failed one fail with it and are redelivered.
func (g *groupCommitter) settle(q *queued, err error) {
	q.answer(err)
	for _, c := range q.d.copies {
		if err == nil {
			c.d.countDuplicate()
			g.e.logDuplicate(c.d, "Duplicate skipped: a copy arrived in the same group", c.d.fields)
		}
		c.answer(err)
	}
	q.d.copies = nil
}

func without(qs []*queued, drop *queued) []*queued {
	out := make([]*queued, 0, len(qs))
	for _, q := range qs {
		if q != drop {
			out = append(out, q)
		}
	}
	return out
}

// claimAll inserts every key with one statement and splits the group into fresh claims and
// duplicates (checking the duplicates' fingerprints with one more statement).
func (g *groupCommitter) claimAll(ctx context.Context, tx *sql.Tx, pending []*queued) (fresh, dups []*queued, err error) {
	e := g.e
	consumers := make([]string, len(pending))
	keys := make([]string, len(pending))
	prints := make([][]byte, len(pending))
	days := make([]time.Time, len(pending))
	for i, q := range pending {
		consumers[i], keys[i], prints[i] = q.d.consumer, q.d.key, q.d.fingerprint
		days[i] = partition.Day(q.d.occurredAt)
	}
	args := []any{consumers, keys, prints}
	if e.q.daily {
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
		if claimed[[2]string{q.d.consumer, q.d.key}] {
			q.d.claimed()
			fresh = append(fresh, q)
		} else {
			q.d.countDuplicate()
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

// checkFingerprints reports duplicates whose payload differs from the applied copy's. With
// RejectFingerprintMismatch the copy is answered with the permanent error right away.
func (g *groupCommitter) checkFingerprints(ctx context.Context, tx *sql.Tx, dups []*queued) {
	e := g.e
	consumers := make([]string, len(dups))
	keys := make([]string, len(dups))
	for i, q := range dups {
		consumers[i], keys[i] = q.d.consumer, q.d.key
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
		if a, ok := stored[[2]string{q.d.consumer, q.d.key}]; ok {
			if err := e.reportDuplicate(q.d, a.fingerprint, a.at); err != nil {
				g.settle(q, err)
			}
		}
	}
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
