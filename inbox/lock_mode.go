package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/pgtx"
)

// The savepoint that lets a lock-mode transaction undo a failed handler and still record the
// failure while it holds the row lock.
const (
	lockSavepoint         = `SAVEPOINT wmonce_inbox_row`
	lockRollbackSavepoint = `ROLLBACK TO SAVEPOINT wmonce_inbox_row`
)

// workLocked is a ClaimLock worker: each round is one transaction that locks up to
// TxBatchSize due rows, runs their handlers and completes them.
func (p *Processor) workLocked(ctx context.Context) {
	backoff := claimBackoff
	for ctx.Err() == nil {
		var n int
		err := p.requireGuard(ctx)
		began := time.Now()
		if err == nil {
			n, err = p.lockedRound(ctx)
		}
		if err != nil {
			if ctx.Err() != nil || !p.claimFailed(ctx, &backoff, err) {
				return
			}
			continue
		}
		backoff.Reset()
		if n == 0 {
			p.testSignals.Idle.Signal(began)
			p.idle(ctx)
		}
	}
}

// beginLocked begins a ClaimLock transaction bounded by HandlerTimeout. end, to defer even after
// an error, rolls it back unless *committed says the caller ended it, and ends its spans.
func (p *Processor) beginLocked() (ctx context.Context, tx *sql.Tx, committed *bool, end func(), err error) {
	ctx, cancel := context.WithTimeout(p.handlerCtx(), p.config.HandlerTimeout)
	ctx, spans := withTxSpans(ctx)
	committed = new(bool)
	tx, err = p.db.BeginTx(ctx, p.config.TxOptions)
	return ctx, tx, committed, func() {
		if tx != nil && !*committed {
			_ = tx.Rollback()
		}
		spans.end("not committed")
		cancel()
	}, err
}

// lockedRound returns how many rows it claimed.
func (p *Processor) lockedRound(claimCtx context.Context) (int, error) {
	ctx, tx, committed, end, err := p.beginLocked()
	defer end()
	if err != nil {
		return 0, fmt.Errorf("inbox: begin: %w", err)
	}
	rows, err := p.claimRows(func(after int64) ([]claimedRow, error) {
		return p.lockRows(ctx, tx, p.q.lockDue, p.config.Consumer, p.config.TxBatchSize, after)
	})
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	p.claimed.Add(uint64(len(rows)))
	p.testSignals.Claimed.Signal(ids(rows))
	if p.testHooks.Locked != nil {
		p.testHooks.Locked(ids(rows))
	}
	if claimCtx.Err() != nil {
		_ = tx.Rollback() // shutdown: the rollback gives them back
		p.count(settledReleased, nil, rows...)
		return len(rows), nil
	}
	if len(rows) == 1 {
		*committed = p.runLockedRow(ctx, tx, rows[0])
		return 1, nil
	}
	*committed, err = p.runLockedBatch(claimCtx, ctx, tx, rows)
	return len(rows), err
}

// processLockedEach runs the rows of a failed batch one per transaction, each locked again by
// id (a row another worker took meanwhile, or that is no longer eligible, is left to it).
func (p *Processor) processLockedEach(claimCtx context.Context, rows []claimedRow) {
	for _, r := range rows {
		if claimCtx.Err() != nil {
			return // not locked any more: they stay PENDING for whoever runs next
		}
		p.processLockedOne(r.id)
	}
}

func (p *Processor) processLockedOne(id int64) {
	ctx, tx, committed, end, err := p.beginLocked()
	defer end()
	if err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not begin a row's transaction; the row is claimed again later", err, watermill.LogFields{"row": id})
		return
	}
	rows, err := p.lockRows(ctx, tx, p.q.lockOne, p.config.Consumer, id)
	if err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not lock a row again; it is claimed again later", err, watermill.LogFields{"row": id})
		return
	}
	if len(rows) == 0 {
		return // taken by another worker, or no longer due
	}
	*committed = p.runLockedRow(ctx, tx, rows[0])
}

// runLockedRow runs one locked row's handler in a savepoint of tx, so that a failure can be
// undone and recorded while the lock is held, then completes or records it and commits. It
// reports whether it ended tx (commit attempted).
func (p *Processor) runLockedRow(ctx context.Context, tx *sql.Tx, r claimedRow) bool {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts}
	if r.crashed > 0 {
		if err := p.recheckStart(ctx, &r); err != nil {
			p.errs.Add(1)
			p.logger.Error("Could not read the start of the row's last attempt again; the row is claimed again later", err, fields)
			return false
		}
		fields["attempt"] = r.attempts
	}
	if r.crashed >= p.config.MaxAttempts {
		return p.parkCrashed(ctx, tx, r, fields)
	}
	if err := p.startLocked([]claimedRow{r}); err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not record the start of an attempt; the row is claimed again later", err, fields)
		return false
	}
	if ctx.Err() != nil {
		// HandlerTimeout (or shutdown) ended the transaction while the start was recorded:
		// the handler did not run, so the attempt does not count.
		p.forgetLocked([]claimedRow{r})
		if p.handlerCtx().Err() != nil {
			p.count(settledReleased, nil, r)
			p.logger.Info("Shutdown: row given back unprocessed", fields)
			return false
		}
		p.errs.Add(1)
		p.logger.Error("HandlerTimeout ran out before the handler started; the row is claimed again, the attempt not counted", ctx.Err(), fields)
		return false
	}
	// The attempt guard (guard.go) opens before the savepoint, so that undoing a failed
	// handler (ROLLBACK TO SAVEPOINT) leaves it open; it travels with the SAVEPOINT.
	err := p.guard.Open(ctx, tx)
	if err == nil {
		_, err = tx.ExecContext(ctx, lockSavepoint)
	}
	if err != nil {
		p.errs.Add(1)
		p.logger.Error("Savepoint failed; the row is claimed again later", err, fields)
		p.forgetLocked([]claimedRow{r})
		return false
	}
	var herr error
	_ = pgtx.Retry(ctx, pgtx.RetryPolicy{}, func(ctx context.Context, n int) error {
		if n > 1 {
			// A serialization failure or deadlock in the handler: undo it and run it again.
			if _, err := tx.ExecContext(ctx, lockRollbackSavepoint); err != nil {
				return nil // stop: herr stays the handler's error
			}
		}
		herr = p.runHandler(ctx, tx, r, false)
		return herr
	})
	if herr == nil {
		// The guard closes before the row is completed, so that the completion cannot run in
		// autocommit after a handler ended the transaction with SQL text (see attemptOne).
		err := p.guard.Close(ctx, tx)
		if err == nil {
			var res sql.Result
			res, err = tx.ExecContext(ctx, p.q.completeLock, p.replanned([]int64{r.id}, []int64{int64(r.attempts)})...)
			if err == nil {
				if n, _ := res.RowsAffected(); n != 1 {
					err = fmt.Errorf("inbox: row %d was not PENDING at completion", r.id)
				}
			}
		}
		if ended := p.endedAt(ctx, r, err); ended != nil {
			// The handler ended the transaction and returned no error: nothing of it was
			// applied, and the row lock went with it.
			p.recordLockedFailure(r, ended)
			return true
		}
		if err == nil {
			err = tx.Commit()
			spansIn(ctx).committed(err)
			if err != nil {
				p.errs.Add(1)
				p.logger.Error("Commit failed; the row is processed again unless it did commit", err, fields)
				return true
			}
			spansIn(ctx).end("")
			p.count(settledDone, nil, r)
			return true
		}
		herr = fmt.Errorf("inbox: mark done: %w", err)
	}
	return p.lockedRowFailed(ctx, tx, r, herr, fields)
}

// recheckStart reads the start record of r's last attempt again, now that this worker holds
// the row lock, and corrects r.crashed and r.attempts. The claim read it in its statement's
// snapshot: another worker may have withdrawn that start (forgetLocked: its attempt did not
// count) after the snapshot was taken and released the row before this worker locked it. Taken
// as it was, the withdrawn start would count an attempt that never ran, and at MaxAttempts
// park the row without running it. The read runs on the pool, in a snapshot of its own
// whatever TxOptions says, and waits for a withdrawal in progress (FOR KEY SHARE).
func (p *Processor) recheckStart(ctx context.Context, r *claimedRow) error {
	var recorded, started int
	if err := p.db.QueryRowContext(ctx, p.q.recheckStart, r.id).Scan(&recorded, &started); err != nil {
		return fmt.Errorf("inbox: read the start of row %d's last attempt again: %w", r.id, err)
	}
	r.crashed, r.attempts = started, max(recorded, started)+1
	return nil
}

// lockedRowFailed settles a locked row whose attempt failed with herr: recorded in tx when the
// transaction and its lock are still there (undoing the handler's writes to the savepoint),
// on its own otherwise; given back uncounted at shutdown. It reports whether it ended tx.
func (p *Processor) lockedRowFailed(ctx context.Context, tx *sql.Tx, r claimedRow, herr error, fields watermill.LogFields) bool {
	switch {
	case isEnded(herr):
		// Nothing of the attempt was applied, and the row lock went with the transaction.
		p.recordLockedFailure(r, herr)
		return true
	case p.handlerCtx().Err() != nil:
		p.logger.Info("Shutdown: row given back unprocessed", fields)
		p.forgetLocked([]claimedRow{r})
		p.count(settledReleased, nil, r)
		return false
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// database/sql has rolled the transaction back: record the attempt on its own.
		p.recordLockedFailure(r, fmt.Errorf("handler exceeded HandlerTimeout (%s): %w", p.config.HandlerTimeout, herr))
		return true
	case pgtx.IsConnectionError(herr):
		// The connection ended while the handler ran, perhaps by the message's doing (a query
		// that crashes the backend, pg_terminate_backend): the attempt counts, as in lease mode.
		// If it cannot be recorded now, its start makes the next worker count it.
		_ = tx.Rollback()
		p.recordLockedFailure(r, fmt.Errorf("inbox: the database connection ended during the attempt (counted): %w", herr))
		return true
	}
	// Undo the handler's writes, keep the lock, record the attempt, commit.
	if _, err := tx.ExecContext(ctx, lockRollbackSavepoint); err != nil {
		_ = tx.Rollback()
		p.recordLockedFailure(r, herr)
		return true
	}
	status, err := p.failLocked(ctx, tx, r, herr)
	if err == nil {
		err = p.guard.Close(ctx, tx)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		p.recordLockedFailure(r, herr)
		return true
	}
	p.reportFailure(r, herr, status)
	return true
}

// failLocked records a failed attempt through q (the locking transaction, or the pool).
func (p *Processor) failLocked(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, r claimedRow, cause error) (string, error) {
	var status string
	err := q.QueryRowContext(ctx, p.q.failLock, r.id, wmonce.IsPermanent(cause), p.config.MaxAttempts,
		micros(p.backoff(r.attempts)), errorText(cause), r.attempts).Scan(&status)
	return status, err
}

// parkCrashed parks a locked row whose last allowed attempt ended its connection or process,
// without running it again, and commits tx. It reports that it ended tx.
func (p *Processor) parkCrashed(ctx context.Context, tx *sql.Tx, r claimedRow, fields watermill.LogFields) bool {
	cause := fmt.Errorf("attempt %d ended its database connection or process (killed, crashed or terminated) and was the last of MaxAttempts (%d)", r.crashed, p.config.MaxAttempts)
	var status string
	err := tx.QueryRowContext(ctx, p.q.parkLock, r.id, r.crashed, errorText(cause)).Scan(&status)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		p.errs.Add(1)
		p.logger.Error("Could not park a row whose attempts ended their process; it is claimed again later", err, fields)
		return true
	}
	p.count(settledParked, cause, r)
	p.logger.Error("Row parked as FAILED: replay or skip it (its ordering key, if any, waits)", cause, fields.Add(watermill.LogFields{"attempt": r.crashed}))
	return true
}

// recordLockedFailure records an attempt whose transaction is gone. If another worker took
// the row in between, this waits for its transaction; a row it completed is left alone.
func (p *Processor) recordLockedFailure(r claimedRow, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, err := p.failLocked(ctx, p.db, r, cause)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		p.count(settledFailed, cause, r)
		p.logger.Info("Attempt failed; the row was finished by another worker meanwhile", watermill.LogFields{"row": r.id, "err": cause.Error()})
	case err != nil:
		p.errs.Add(1)
		p.count(settledFailed, cause, r)
		p.logger.Error("Could not record a failed attempt; it is counted when the row is claimed again", errors.Join(cause, err), watermill.LogFields{"row": r.id})
	default:
		p.reportFailure(r, cause, status)
	}
}

func (p *Processor) reportFailure(r claimedRow, cause error, status string) {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts, "max_attempts": p.config.MaxAttempts}
	if Status(status) == StatusFailed {
		p.failed.Add(1)
		p.count(settledParked, cause, r)
		p.logger.Error("Row parked as FAILED: replay or skip it (its ordering key, if any, waits)", cause, fields)
		return
	}
	p.count(settledFailed, cause, r)
	p.logger.Info("Attempt failed; retrying later", fields.Add(watermill.LogFields{"err": cause.Error()}))
}

// lockRows runs a locking claim query and scans its rows in id order.
func (p *Processor) lockRows(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]claimedRow, error) {
	return p.queryClaimed(ctx, tx, query, args...)
}
