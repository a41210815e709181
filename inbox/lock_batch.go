package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// runLockedBatch runs the handlers of rows, which tx has locked, in tx and completes them
// with one statement (ClaimLock with TxBatchSize > 1). If any handler fails, the batch is
// rolled back and its rows run again one per transaction. It reports whether it sent tx's
// COMMIT; an error is one for the worker's claim backoff.
func (p *Processor) runLockedBatch(claimCtx, ctx context.Context, tx *sql.Tx, rows []claimedRow) (committed bool, err error) {
	if slices.ContainsFunc(rows, func(r claimedRow) bool { return r.crashed > 0 }) {
		// A row whose last attempt ended its connection or process runs alone, so that it
		// cannot take its neighbours down with it again, and is parked there if it must be.
		_ = tx.Rollback()
		p.processLockedEach(claimCtx, rows)
		return false, nil
	}
	if err := p.startLocked(rows); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		// HandlerTimeout ran out while the starts were recorded, and the transaction with
		// it: no handler ran, so no attempt counts.
		p.forgetLocked(rows)
		if p.handlerCtx().Err() != nil {
			p.count(settledReleased, nil, rows...)
			return false, nil
		}
		return false, fmt.Errorf("inbox: HandlerTimeout (%s) ran out before the handlers started; the rows are claimed again, no attempt counted: %w", p.config.HandlerTimeout, ctx.Err())
	}
	// The attempt guard (guard.go) opens outside any savepoint, before the first handler.
	if err := p.guard.Open(ctx, tx); err != nil {
		p.forgetLocked(rows)
		return false, fmt.Errorf("inbox: %w", err)
	}
	for _, r := range rows {
		if err := p.runHandler(ctx, tx, r, true); err != nil {
			if isEnded(err) {
				// The handler ended the transaction: the guard refused its COMMIT, so nothing of
				// the batch was applied, and the row locks are gone with the transaction. Its
				// row is parked at once; the others' attempts do not count, and they run again
				// one per transaction.
				others := slices.DeleteFunc(slices.Clone(rows), func(o claimedRow) bool { return o.id == r.id })
				p.forgetLocked(others)
				p.recordLockedFailure(r, err)
				if p.handlerCtx().Err() != nil {
					p.count(settledReleased, nil, others...)
					return false, nil
				}
				p.processLockedEach(claimCtx, others)
				return false, nil
			}
			// Not the attempt of every row in the batch: withdraw the starts (while the locks
			// are held) and let the row-by-row pass count the attempt of the row at fault.
			p.forgetLocked(rows)
			if p.handlerCtx().Err() != nil {
				p.count(settledReleased, nil, rows...)
				return false, nil
			}
			p.logger.Debug("Handler failed in a batch; processing the batch row by row", watermill.LogFields{"row": r.id, "err": err.Error()})
			_ = tx.Rollback()
			p.processLockedEach(claimCtx, rows)
			return false, nil
		}
	}
	res, err := tx.ExecContext(ctx, p.q.completeLock, p.replanned(ids(rows), attemptsOf(rows))...)
	if err == nil {
		if n, _ := res.RowsAffected(); int(n) != len(rows) {
			err = fmt.Errorf("inbox: completed %d of %d locked rows", n, len(rows))
		}
	}
	if err == nil {
		err = p.guard.Close(ctx, tx)
	}
	if err != nil {
		if pgtx.IsConnectionError(err) && p.handlerCtx().Err() == nil {
			// The handlers ran and the connection is gone, perhaps by their doing: the starts
			// stay, and the next worker to lock these rows counts the attempt.
			_ = tx.Rollback()
			p.errs.Add(1)
			p.logger.Error("Connection lost completing a batch; the attempt counts and its rows are claimed again", err, watermill.LogFields{"rows": len(rows)})
			return false, nil
		}
		p.forgetLocked(rows) // while the locks are held (recheckStart)
		_ = tx.Rollback()
		if p.handlerCtx().Err() != nil {
			p.count(settledReleased, nil, rows...)
			return false, nil
		}
		p.processLockedEach(claimCtx, rows)
		return false, nil
	}
	err = tx.Commit()
	spansIn(ctx).committed(err)
	if err != nil {
		// Possibly committed after all: then the rows are DONE; if not, they are still PENDING,
		// their starts count the attempt, and they are claimed again.
		p.errs.Add(1)
		p.logger.Error("Batch commit failed; its rows are processed again unless it did commit", err, watermill.LogFields{"rows": len(rows)})
		return true, nil
	}
	spansIn(ctx).end("")
	p.count(settledDone, nil, rows...)
	return true, nil
}
