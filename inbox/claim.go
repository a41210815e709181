package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	iworker "github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// claimedRow is one row returned by a claim.
type claimedRow struct {
	id          int64
	messageID   string
	uuid        string
	orderingKey string
	topic       string
	payload     []byte
	metadata    string
	attempts    int // the attempt being started, 1-based
	receivedAt  time.Time

	// ClaimLock only: the number of an earlier attempt that ended its connection or process
	// (0: none), and the row version the attempt starts from (xmin).
	crashed int
	xmin    string
}

// queryClaimed runs a claim query (on the pool or in a transaction) and scans the claimed rows.
func (p *Processor) queryClaimed(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]claimedRow, error) {
	rs, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return nil, fmt.Errorf("inbox: table %s or inbox_paused (migration 014) is missing: run the migrations: %w", p.q.table, err)
		}
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	defer rs.Close()
	var rows []claimedRow
	for rs.Next() {
		var r claimedRow
		if err := rs.Scan(&r.id, &r.messageID, &r.uuid, &r.orderingKey, &r.topic, &r.payload, &r.metadata, &r.attempts, &r.receivedAt, &r.crashed, &r.xmin); err != nil {
			return nil, fmt.Errorf("inbox: scan claimed row: %w", err)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	return rows, nil
}

func ids(rows []claimedRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.id
	}
	return out
}

// claimBackoff is the wait of a worker after a failed claim (and of the listener after a lost
// connection): database trouble, not the message's doing, so not ProcessorConfig.Backoff.
var claimBackoff = iworker.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// claimFailed counts and logs a failed claim and waits claimBackoff; false means ctx ended.
func (p *Processor) claimFailed(ctx context.Context, backoff *iworker.Backoff, err error) bool {
	p.errs.Add(1)
	p.testSignals.ClaimFailed.Signal(err)
	wait := backoff.Next()
	p.logger.Error("Inbox claim failed, retrying", err, watermill.LogFields{"backoff": wait})
	return iworker.Sleep(ctx, wait)
}

// rescanEvery bounds how long a row below the claim floor can wait to be seen.
const rescanEvery = 100 * time.Millisecond

// claimAfter returns the id claims start above. Finished rows are not removed from the
// indexes until VACUUM, so a claim that starts at the beginning of the table walks past every
// row finished since: draining a backlog that way costs time quadratic in its size. Claims
// therefore start above a floor: the smallest id the last claim took, less one. Everything
// below it was, when that claim looked, finished, claimed by another worker, not yet due or
// held back by its ordering key. Such rows can become claimable later (a retry falls due, a
// key's older row finishes, a claim is released or reaped, an operator replays a row), so
// every rescanEvery, and whenever a claim above the floor finds nothing, a claim starts from
// the beginning instead: a row below the floor waits at most rescanEvery longer.
func (p *Processor) claimAfter() int64 {
	now := time.Now().UnixNano()
	if last := p.lastRescan.Load(); now-last >= int64(rescanEvery) && p.lastRescan.CompareAndSwap(last, now) {
		return 0
	}
	return p.floor.Load()
}

// rescan makes the next claims start from the beginning.
func (p *Processor) rescan() int64 {
	p.floor.Store(0)
	p.lastRescan.Store(time.Now().UnixNano())
	return 0
}

// raiseFloor records the smallest id of a claim (rows in id order) as the new floor.
func (p *Processor) raiseFloor(rows []claimedRow) {
	if len(rows) == 0 {
		return
	}
	next := rows[0].id - 1
	for {
		cur := p.floor.Load()
		if next <= cur || p.floor.CompareAndSwap(cur, next) {
			return
		}
	}
}
