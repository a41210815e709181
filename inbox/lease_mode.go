package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/pgtx"
)

func (p *Processor) work(ctx context.Context, w *worker) {
	backoff := claimBackoff
	for ctx.Err() == nil {
		err := p.requireGuard(ctx)
		var rows []claimedRow
		var token int64
		began := time.Now()
		if err == nil {
			rows, token, err = p.claim(ctx)
		}
		if err != nil {
			if ctx.Err() != nil || !p.claimFailed(ctx, &backoff, err) {
				return
			}
			continue
		}
		backoff.Reset()
		if len(rows) == 0 {
			p.testSignals.Idle.Signal(began)
			p.idle(ctx)
			continue
		}
		p.processClaim(ctx, w, rows, token)
	}
}

// claim takes up to BatchSize due rows under a new token. The statement is not cancelled with
// ctx: rows claimed by a statement whose reply is lost would wait for their lease to expire.
func (p *Processor) claim(ctx context.Context) ([]claimedRow, int64, error) {
	if ctx.Err() != nil {
		return nil, 0, ctx.Err()
	}
	token := newToken()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.config.Lease)
	defer cancel()
	rows, err := p.claimRows(func(after int64) ([]claimedRow, error) { return p.claimAbove(qctx, token, after) })
	if err != nil {
		return nil, 0, err
	}
	p.claimed.Add(uint64(len(rows)))
	if len(rows) > 0 {
		p.testSignals.Claimed.Signal(ids(rows))
	}
	return rows, token, nil
}

func (p *Processor) claimAbove(ctx context.Context, token, after int64) ([]claimedRow, error) {
	rows, err := p.queryClaimed(ctx, p.db, p.q.claim, p.config.Consumer, p.config.BatchSize, token, micros(p.config.Lease), after)
	if err != nil {
		return nil, err
	}
	// UPDATE ... RETURNING yields rows in no particular order.
	slices.SortFunc(rows, func(a, b claimedRow) int { return cmp.Compare(a.id, b.id) })
	return rows, nil
}

func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}

// processClaim works through one claim in TxBatchSize chunks. Once claiming stops (shutdown),
// rows not yet started are released at once.
//
// A row whose last attempt lost its lease (r.crashed: the worker died, stalled or was killed)
// may kill this worker too. It runs alone, and the rest of the claim is given back first: the
// lease of a dead worker's claim expires for every row in it, started or not, so a crash
// would otherwise count an attempt against each of its neighbours every time, and park them
// with it.
func (p *Processor) processClaim(ctx context.Context, w *worker, rows []claimedRow, token int64) {
	w.own(rows, token)
	for i := 0; i < len(rows); {
		if ctx.Err() != nil {
			p.releaseUnstarted(w)
			return
		}
		end := i + 1
		if rows[i].crashed > 0 {
			p.releaseUnstarted(w, rows[i].id)
		} else {
			for end < len(rows) && end-i < p.config.TxBatchSize && rows[end].crashed == 0 {
				end++
			}
		}
		chunk := w.begin(rows[i:end])
		i = end
		switch len(chunk) {
		case 0:
			continue
		case 1:
			p.processOne(w, chunk[0], token)
		default:
			p.processBatch(w, chunk, token)
		}
	}
}

// outcome of one processing transaction.
type outcome int

const (
	outcomeDone     outcome = iota
	outcomeFailed           // handler failed: record the attempt
	outcomeConflict         // the claim was lost: nothing to record
	outcomeRetryTx          // serialization failure or deadlock: run the transaction again
	outcomeRelease          // not the message's fault (shutdown, no transaction): give the row back
	outcomeCounted          // a batch's commit failed after its handlers ran: count every row's attempt
)

// processOne runs one row in a transaction of its own and settles it.
func (p *Processor) processOne(w *worker, r claimedRow, token int64) {
	defer w.settle(r.id)
	var res outcome
	var err error
	_ = pgtx.Retry(p.handlerCtx(), pgtx.RetryPolicy{}, func(context.Context, int) error {
		res, err = p.attemptOne(w, r, token)
		if res == outcomeRetryTx {
			return err // a serialization failure or deadlock: run the transaction again
		}
		return nil
	})
	switch {
	case res == outcomeRetryTx && p.handlerCtx().Err() != nil:
		res, err = outcomeRelease, fmt.Errorf("shutdown: %w", err) // the wait was cut short
	case res == outcomeRetryTx:
		res = outcomeFailed
	}
	p.settle(r, token, res, err)
}

// attemptTx is the transaction of one processing attempt.
type attemptTx struct {
	*sql.Tx   // nil when BEGIN failed
	w         *worker
	cancel    context.CancelFunc
	spans     *txSpans // the attempts' spans, ended after the COMMIT they record
	committed bool
}

// beginAttempt starts an attempt's transaction, bounded by HandlerTimeout and marked on w so
// that lease renewal knows a transaction is running, and opens the attempt guard in it (see
// guard.go; on a pool from pgtx.Open it travels with the first statement). Defer the attempt's
// end, also after an error.
func (p *Processor) beginAttempt(w *worker) (context.Context, *attemptTx, error) {
	ctx, cancel := context.WithTimeout(p.handlerCtx(), p.config.HandlerTimeout)
	ctx, spans := withTxSpans(ctx)
	w.beginTx()
	tx, err := p.db.BeginTx(ctx, p.config.TxOptions)
	if err == nil {
		err = p.guard.Open(ctx, tx)
	}
	return ctx, &attemptTx{Tx: tx, w: w, cancel: cancel, spans: spans}, err
}

// end rolls the transaction back unless it was committed, and ends the attempt.
func (a *attemptTx) end() {
	if a.Tx != nil && !a.committed {
		_ = a.Rollback()
	}
	a.spans.end("not committed")
	a.w.endTx()
	a.cancel()
}

// commit ends the attempt's transaction with COMMIT.
func (a *attemptTx) commit() error {
	a.committed = true
	err := a.Commit()
	a.spans.committed(err)
	return err
}

func (p *Processor) attemptOne(w *worker, r claimedRow, token int64) (outcome, error) {
	ctx, tx, err := p.beginAttempt(w)
	defer tx.end()
	if err != nil {
		return outcomeRelease, fmt.Errorf("inbox: begin: %w", err)
	}
	if err := p.runHandler(ctx, tx.Tx, r, false); err != nil {
		return p.classifyHandler(ctx, err)
	}
	// The guard closes before the row is marked done: a handler that ended the transaction with
	// SQL text left the server outside any transaction, where the mark would run in autocommit;
	// the server guard's close fails there instead (migration 017). It travels with the mark on
	// a pool from pgtx.Open.
	if err := p.guard.Close(ctx, tx.Tx); err != nil {
		if ended := p.endedAt(ctx, r, err); ended != nil {
			return outcomeFailed, ended // the handler ended the transaction and returned no error
		}
		return p.classifyHandler(ctx, fmt.Errorf("inbox: %w", err))
	}
	res, err := tx.ExecContext(ctx, p.q.complete, r.id, token)
	if ended := p.endedAt(ctx, r, err); ended != nil {
		return outcomeFailed, ended
	}
	if err != nil {
		return p.classifyHandler(ctx, fmt.Errorf("inbox: mark done: %w", err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		tx.spans.end("lease lost: rolled back")
		return outcomeConflict, nil
	}
	if err := tx.commit(); err != nil {
		// The handler ran, so the attempt counts (a message whose effects kill the backend at
		// commit must not loop). The outcome of a failed COMMIT may be unknown; recording the
		// failure is fenced, so if the commit did happen it changes nothing.
		return outcomeFailed, fmt.Errorf("inbox: commit: %w", err)
	}
	tx.spans.end("")
	return outcomeDone, nil
}

// classifyHandler decides what a failure inside the processing transaction means.
func (p *Processor) classifyHandler(ctx context.Context, err error) (outcome, error) {
	switch {
	case isEnded(err):
		return outcomeFailed, err // permanent: the row is parked
	case p.handlerCtx().Err() != nil:
		return outcomeRelease, fmt.Errorf("shutdown: %w", err)
	case pgtx.IsRetryableTx(err):
		return outcomeRetryTx, err
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return outcomeFailed, fmt.Errorf("handler exceeded HandlerTimeout (%s): %w", p.config.HandlerTimeout, err)
	case pgtx.IsConnectionError(err):
		// The connection ended while the handler ran. A message can do that to its own
		// backend (a query that crashes it, pg_terminate_backend, an out-of-memory kill), and
		// from here it cannot be told apart from a server restart: the attempt counts, so a
		// message that kills its backend every time is parked after MaxAttempts. A restart
		// costs each row in work one attempt.
		return outcomeFailed, fmt.Errorf("inbox: the database connection ended during the attempt (counted): %w", err)
	}
	return outcomeFailed, err
}

// settle records the result of a row's processing.
func (p *Processor) settle(r claimedRow, token int64, res outcome, err error) {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts}
	switch res {
	case outcomeDone:
		p.count(settledDone, nil, r)
	case outcomeConflict:
		p.count(settledLeaseLost, nil, r)
		p.logger.Info("Lease lost before completion: rolled back, another worker owns the row", fields)
	case outcomeRelease:
		if p.handlerCtx().Err() != nil {
			p.logger.Info("Shutdown: row given back unprocessed", fields)
		} else {
			p.errs.Add(1)
			p.logger.Error("Row not processed; giving it back", err, fields)
		}
		p.release([]claimedRow{r}, token, p.releaseDelay())
	case outcomeFailed, outcomeRetryTx:
		p.recordFailure(r, token, err)
	}
}

// recordFailure counts a failed attempt: back to PENDING after a backoff, or parked as FAILED
// past the limit or for a permanent error. Fenced by the token like every change.
func (p *Processor) recordFailure(r claimedRow, token int64, cause error) {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts, "max_attempts": p.config.MaxAttempts}
	delay := p.backoff(r.attempts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var status string
	err := p.db.QueryRowContext(ctx, p.q.fail, r.id, token, wmonce.IsPermanent(cause), p.config.MaxAttempts, micros(delay), errorText(cause)).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		p.count(settledLeaseLost, cause, r)
		p.logger.Info("Attempt failed after its claim was gone (lease lost to another worker, or a COMMIT whose reply was lost did commit)", fields.Add(watermill.LogFields{"err": cause.Error()}))
	case err != nil:
		p.errs.Add(1)
		p.count(settledFailed, cause, r)
		p.logger.Error("Could not record a failed attempt; the row is retried when its lease expires", errors.Join(cause, err), fields)
	case Status(status) == StatusFailed:
		p.failed.Add(1)
		p.count(settledParked, cause, r)
		p.logger.Error("Row parked as FAILED: replay or skip it (its ordering key, if any, waits)", cause, fields)
	default:
		p.count(settledFailed, cause, r)
		p.logger.Info("Attempt failed; retrying later", fields.Add(watermill.LogFields{"err": cause.Error(), "retry_in": delay}))
	}
}

// releaseDelay is how long a row given back unprocessed waits: not at all at shutdown (another
// instance may take it at once), Backoff after database trouble.
func (p *Processor) releaseDelay() time.Duration {
	if p.handlerCtx().Err() != nil {
		return 0
	}
	return p.config.Backoff
}
