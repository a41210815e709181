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
	// The number of the row's last attempt if it lost its lease (its worker died, stalled or
	// was killed; 0: it did not): such a row runs alone (see processClaim).
	crashed int
}

// queryClaimed runs a claim query (on the pool or in a transaction) and scans the claimed rows.
func (p *Processor) queryClaimed(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]claimedRow, error) {
	rs, err := q.QueryContext(ctx, query, p.replanned(args...)...)
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
		if err := rs.Scan(&r.id, &r.messageID, &r.uuid, &r.orderingKey, &r.topic, &r.payload, &r.metadata, &r.attempts, &r.receivedAt, &r.crashed); err != nil {
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

// replanned puts replan.For before args: the claims, completions, lease renewals and the
// reaper run against a table whose size and make-up change by the second, so a plan cached
// while it was empty or all PENDING would walk past every finished row or scan the whole inbox
// where an index finds the rows.
func (p *Processor) replanned(args ...any) []any {
	return p.replan.Args(args...)
}

// rescanEvery is how often claims start from the beginning of the table (a rescan) while
// rescans are cheap; see claimAfter.
const rescanEvery = 100 * time.Millisecond

// rescanShare bounds what rescans cost: the next periodic rescan waits at least this many
// times as long as the last rescan took, up to maxRescanPeriod.
const (
	rescanShare     = 10
	maxRescanPeriod = time.Second
)

// claimAfter returns the id claims start above. Finished rows are not removed from the
// indexes until VACUUM, so a claim that starts at the beginning of the table walks past every
// row finished since: draining a backlog that way costs time quadratic in its size. Claims
// therefore start above a floor: the smallest id the last claim took, less one. Everything
// below it was, when that claim looked, finished, claimed by another worker, not yet due or
// held back by its ordering key. Such rows can become claimable later (a retry falls due, a
// key's older row finishes, a claim is released or reaped, an operator replays a row), so
// periodically, and whenever a claim above the floor finds nothing, a claim starts from the
// beginning instead. The period is rescanEvery, or rescanShare times as long as the last
// rescan took if that is longer (at most maxRescanPeriod): with statistics taken while every row was PENDING,
// PostgreSQL walks the primary key past every finished row (about 150 ms at 50,000 of them),
// and rescans every 100 ms then kept the workers rescanning (1,650 rows/s instead of 13,000,
// docs/performance.md). A row below the floor waits at most that period.
func (p *Processor) claimAfter() int64 {
	now := time.Now().UnixNano()
	period := min(max(int64(rescanEvery), rescanShare*p.rescanTook.Load()), int64(maxRescanPeriod))
	if last := p.lastRescan.Load(); now-last >= period && p.lastRescan.CompareAndSwap(last, now) {
		return 0
	}
	return p.floor.Load()
}

// claimRows runs claim above the floor, and from the beginning when nothing is above it
// (before the worker goes idle), and moves the floor by what it found. claim returns rows in
// id order.
func (p *Processor) claimRows(claim func(after int64) ([]claimedRow, error)) ([]claimedRow, error) {
	after := p.claimAfter()
	rows, err := p.claimFrom(after, claim)
	if err == nil && len(rows) == 0 && after > 0 {
		p.lastRescan.Store(time.Now().UnixNano())
		rows, err = p.claimFrom(0, claim)
	}
	return rows, err
}

func (p *Processor) claimFrom(after int64, claim func(after int64) ([]claimedRow, error)) ([]claimedRow, error) {
	start := time.Now()
	rows, err := claim(after)
	if err != nil {
		return nil, err
	}
	if after > 0 {
		p.raiseFloor(rows)
		return rows, nil
	}
	// A rescan saw the whole table: what it found sets the floor, lower or not, so that one
	// worker's rescan does not send every worker's next claim to the beginning. Nothing found:
	// nothing is claimable, and the next claim starts from the beginning.
	p.rescanTook.Store(int64(time.Since(start)))
	if len(rows) == 0 {
		p.floor.Store(0)
	} else {
		p.floor.Store(rows[0].id - 1)
	}
	return rows, nil
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
