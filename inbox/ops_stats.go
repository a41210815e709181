package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/inboxops"
	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// Stats is a snapshot of one consumer's unfinished rows, read from the database.
type Stats struct {
	Pending    int64 // waiting for a worker, including rows waiting out a retry backoff
	Retrying   int64 // the part of Pending that failed before (attempts > 0)
	InProgress int64
	Failed     int64 // parked: alert on this
	// OldestPendingReceivedAt is the receive time of the oldest PENDING row (zero if none);
	// OldestPendingAge is how long ago that was by the database clock: alert on this, it grows
	// when processing stalls or falls behind.
	OldestPendingReceivedAt time.Time
	OldestPendingAge        time.Duration
	// PausedAt is when the consumer was paused (Ops.Pause): its processors claim nothing;
	// zero when it runs.
	PausedAt time.Time
}

const statsSelect = `SELECT consumer,
    count(*) FILTER (WHERE status = 'PENDING'),
    count(*) FILTER (WHERE status = 'PENDING' AND attempts > 0),
    count(*) FILTER (WHERE status = 'IN_PROGRESS'),
    count(*) FILTER (WHERE status = 'FAILED'),
    min(received_at) FILTER (WHERE status = 'PENDING'),
    coalesce(extract(epoch FROM now() - min(received_at) FILTER (WHERE status = 'PENDING')), 0)::float8
FROM `

func scanStats(s pgtx.Scanner) (string, Stats, error) {
	var consumer string
	var st Stats
	var oldest sql.NullTime
	var age float64
	if err := s.Scan(&consumer, &st.Pending, &st.Retrying, &st.InProgress, &st.Failed, &oldest, &age); err != nil {
		return "", Stats{}, err
	}
	st.OldestPendingReceivedAt = oldest.Time
	st.OldestPendingAge = time.Duration(age * float64(time.Second))
	return consumer, st, nil
}

// Stats counts one consumer's unfinished rows. It reads only unfinished rows (through the
// work index), so its cost grows with the backlog, not with the table.
func (o *Ops) Stats(ctx context.Context, consumer string) (Stats, error) {
	// No row: the consumer has no unfinished rows.
	_, st, err := scanStats(o.db.QueryRowContext(ctx, statsSelect+o.q.table+` WHERE consumer = $1 AND status IN `+unfinished+` GROUP BY consumer`, consumer))
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Stats{}, fmt.Errorf("inbox: stats: %w", err)
	}
	paused, err := o.Paused(ctx)
	if err != nil {
		return Stats{}, err
	}
	st.PausedAt = paused[consumer]
	return st, nil
}

// AllStats returns Stats for every consumer with unfinished rows or paused.
func (o *Ops) AllStats(ctx context.Context) (map[string]Stats, error) {
	out := map[string]Stats{}
	err := pgtx.QueryEach(ctx, o.db, func(s pgtx.Scanner) error {
		c, st, err := scanStats(s)
		out[c] = st
		return err
	}, statsSelect+o.q.table+` WHERE status IN `+unfinished+` GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	paused, err := o.Paused(ctx)
	if err != nil {
		return nil, err
	}
	for c, at := range paused {
		st := out[c]
		st.PausedAt = at
		out[c] = st
	}
	return out, nil
}

// finishedStats returns FinishedStats for every consumer with DONE or SKIPPED rows. Unlike
// AllStats it scans the table (finished rows are most of it): bound ctx with a deadline.
func (o *Ops) finishedStats(ctx context.Context) (map[string]inboxops.FinishedStats, error) {
	out := map[string]inboxops.FinishedStats{}
	err := pgtx.QueryEach(ctx, o.db, func(s pgtx.Scanner) error {
		var c string
		var st inboxops.FinishedStats
		err := s.Scan(&c, &st.Done, &st.Skipped)
		out[c] = st
		return err
	}, `SELECT consumer,
    count(*) FILTER (WHERE status = 'DONE'), count(*) FILTER (WHERE status = 'SKIPPED')
FROM `+o.q.table+` WHERE status IN ('DONE', 'SKIPPED') GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: finished stats: %w", err)
	}
	return out, nil
}

// Consumers lists, in name order, every consumer with rows in the inbox, one index probe per
// consumer, not a scan of the table.
func (o *Ops) Consumers(ctx context.Context) ([]string, error) {
	out, err := owner.DistinctConsumers(ctx, o.db, o.q.table)
	if err != nil {
		return nil, fmt.Errorf("inbox: consumers: %w", err)
	}
	return out, nil
}
