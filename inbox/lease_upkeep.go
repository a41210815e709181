package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// upkeep renews the leases workers hold and reaps expired ones. Reaping stops with claimCtx;
// renewal goes on until upkeepCtx ends, so handlers finishing during the shutdown grace keep
// their claims.
func (p *Processor) upkeep(claimCtx, upkeepCtx context.Context) {
	var renew <-chan time.Time
	if p.config.RenewInterval > 0 {
		t := time.NewTicker(p.config.RenewInterval)
		defer t.Stop()
		renew = t.C
	}
	reap := time.NewTicker(max(p.config.ReapInterval, time.Millisecond))
	defer reap.Stop()
	reapC, reaping := reap.C, claimCtx.Done()
	for {
		select {
		case <-upkeepCtx.Done():
			return
		case <-reaping:
			reapC, reaping = nil, nil
		case <-renew:
			p.renew(upkeepCtx)
		case <-reapC:
			p.reap(upkeepCtx)
		}
	}
}

func (p *Processor) renew(ctx context.Context) {
	var rowIDs, tokens []int64
	for _, w := range p.workers {
		w.mu.Lock()
		// A transaction running past HandlerTimeout is stuck (its handler ignores the
		// cancellation): stop renewing so that its rows can be claimed by others.
		if w.txStart.IsZero() || time.Since(w.txStart) < p.config.HandlerTimeout {
			for id, token := range w.owned {
				rowIDs = append(rowIDs, id)
				tokens = append(tokens, token)
			}
		}
		w.mu.Unlock()
	}
	if len(rowIDs) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, p.config.RenewInterval)
	defer cancel()
	res, err := p.db.ExecContext(qctx, p.q.renew, p.replanned(rowIDs, tokens, micros(p.config.Lease))...)
	if err != nil {
		if ctx.Err() == nil {
			p.errs.Add(1)
			p.logger.Error("Lease renewal failed", err, watermill.LogFields{"rows": len(rowIDs)})
		}
		return
	}
	renewed, _ := res.RowsAffected()
	p.testSignals.LeasesRenewed.Signal(int(renewed))
}

func (p *Processor) reap(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rs, err := p.db.QueryContext(qctx, p.q.reap, p.replanned(p.config.Consumer, p.config.MaxAttempts)...)
	if err != nil {
		if ctx.Err() == nil {
			p.errs.Add(1)
			p.logger.Error("Reaping expired leases failed", err, nil)
		}
		return
	}
	defer rs.Close()
	pending := 0
	var reaped []expiredLease
	for rs.Next() {
		var id int64
		var status string
		if err := rs.Scan(&id, &status); err != nil {
			p.errs.Add(1)
			return
		}
		p.expired.Add(1)
		reaped = append(reaped, expiredLease{ID: id, Parked: Status(status) == StatusFailed})
		if Status(status) == StatusFailed {
			p.parked.Add(1)
			p.logger.Error("Lease expired on the last attempt: row parked as FAILED", errors.New("lease expired"), watermill.LogFields{"row": id})
		} else {
			pending++
			p.logger.Info("Lease expired: row taken back for another attempt", watermill.LogFields{"row": id})
		}
	}
	if err := rs.Err(); err != nil {
		if ctx.Err() == nil {
			p.errs.Add(1)
			p.logger.Error("Reaping expired leases failed", err, nil)
		}
	} else {
		_ = rs.Close() // the statement's commit, before tests hear of it
		p.signalReaped(reaped)
	}
	if pending > 0 {
		p.wakeAll()
	}
}

// signalReaped sends the test signals of reaped leases.
func (p *Processor) signalReaped(reaped []expiredLease) {
	for _, e := range reaped {
		p.testSignals.LeaseExpired.Signal(e)
		if e.Parked {
			p.testSignals.Settled.Signal(settledRow{ID: e.ID, As: settledParked})
		}
	}
}
