package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/lend"
)

// processBatch runs several rows in one transaction and completes them with one statement.
// Any failure rolls everything back and falls back to one transaction per row. A row whose
// handler ended the transaction is parked at once, and the others run again one per
// transaction: the attempt guard refused any COMMIT the handler sent, so their first run left
// nothing behind.
func (p *Processor) processBatch(w *worker, rows []claimedRow, token int64) {
	b := p.attemptBatch(w, rows, token)
	switch b.res {
	case outcomeDone:
		p.count(settledDone, nil, rows...)
		w.settle(ids(rows)...)
		return
	case outcomeRelease:
		if p.handlerCtx().Err() == nil {
			p.errs.Add(1)
		}
		p.release(rows, token, p.releaseDelay())
		w.settle(ids(rows)...)
		return
	case outcomeCounted:
		// The handlers ran but the commit failed: every row's attempt counts (fenced: rows the
		// commit did complete are left alone).
		for _, r := range rows {
			p.recordFailure(r, token, b.err)
			w.settle(r.id)
		}
		return
	}
	if b.endedBy != nil {
		p.recordFailure(*b.endedBy, token, b.err)
		w.settle(b.endedBy.id)
	}
	for _, r := range rows {
		switch {
		case b.endedBy != nil && r.id == b.endedBy.id:
		case b.lost[r.id]:
			p.count(settledLeaseLost, nil, r)
			p.logger.Info("Lease lost before completion: rolled back, another worker owns the row", watermill.LogFields{"row": r.id})
			w.settle(r.id)
		default:
			p.processOne(w, r, token)
		}
	}
}

// batchResult is how a batch's transaction ended: outcomeDone, outcomeRelease (begin failed or
// shutdown: give the rows back), outcomeCounted (commit failed after the handlers ran; err says
// why) or outcomeFailed (fall back to one row per transaction, skipping the lost rows and
// parking endedBy with err).
type batchResult struct {
	res     outcome
	lost    map[int64]bool
	endedBy *claimedRow // the row whose handler ended the transaction, if one did
	err     error
}

func (p *Processor) attemptBatch(w *worker, rows []claimedRow, token int64) batchResult {
	ctx, tx, err := p.beginAttempt(w)
	defer tx.end()
	if err != nil {
		p.logger.Error("Batch begin failed; giving its rows back", err, watermill.LogFields{"rows": len(rows)})
		return batchResult{res: outcomeRelease}
	}
	batches := &lend.Collector{} // batch handlers hand their messages to it (batch.go)
	bctx := lend.WithCollector(ctx, batches)
	for i, r := range rows {
		batches.Current = &rows[i]
		if err := p.runHandler(bctx, tx.Tx, r, true); err != nil {
			if isEnded(err) {
				return batchResult{res: outcomeFailed, endedBy: &r, err: err}
			}
			if p.handlerCtx().Err() != nil {
				return batchResult{res: outcomeRelease}
			}
			p.logger.Debug("Handler failed in a batch; processing the batch row by row", watermill.LogFields{"row": r.id, "err": err.Error()})
			return batchResult{res: outcomeFailed}
		}
	}
	if err := p.runBatches(ctx, tx.Tx, batches); err != nil {
		if p.handlerCtx().Err() != nil {
			return batchResult{res: outcomeRelease}
		}
		p.logger.Debug("Batch handler failed; processing the batch row by row", watermill.LogFields{"rows": len(rows), "err": err.Error()})
		return batchResult{res: outcomeFailed}
	}
	done, err := tx.ExecContext(ctx, p.q.completeMany, p.replanned(ids(rows), token)...)
	if err != nil {
		return batchResult{res: outcomeFailed}
	}
	if n, _ := done.RowsAffected(); int(n) != len(rows) {
		_ = tx.Rollback()
		return batchResult{res: outcomeFailed, lost: p.lostRows(rows, token)}
	}
	if err := p.guard.Close(ctx, tx.Tx); err != nil {
		return batchResult{res: outcomeFailed}
	}
	if err := tx.commit(); err != nil {
		p.logger.Error("Batch commit failed; counting an attempt for each of its rows", err, watermill.LogFields{"rows": len(rows)})
		return batchResult{res: outcomeCounted, err: fmt.Errorf("inbox: batch commit: %w", err)}
	}
	tx.spans.end("")
	return batchResult{res: outcomeDone}
}

// lostRows returns the rows of a batch whose claim is no longer ours.
func (p *Processor) lostRows(rows []claimedRow, token int64) map[int64]bool {
	lost := allLost(rows)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := p.db.QueryContext(ctx, p.q.owned, ids(rows), token)
	if err != nil {
		return nil // let the one-by-one path find out, fenced as always
	}
	defer rs.Close()
	for rs.Next() {
		var id int64
		if rs.Scan(&id) == nil {
			delete(lost, id)
		}
	}
	if rs.Err() != nil {
		return nil
	}
	return lost
}

func allLost(rows []claimedRow) map[int64]bool {
	m := make(map[int64]bool, len(rows))
	for _, r := range rows {
		m[r.id] = true
	}
	return m
}
