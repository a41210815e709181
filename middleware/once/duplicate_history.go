package once

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// A duplicate leaves no row of its own (its claim is ON CONFLICT DO NOTHING), so the
// middleware writes the number of duplicates per consumer and minute to duplicates_per_minute
// (migration 015): what the admin page charts, from any process. Duplicates are rare, and in a
// storm they come in thousands a second, so they are added up in memory and written at most
// once per duplicateFlushDelay, by one statement for every consumer and minute pending, outside
// the message path. The record is best-effort history: a write that fails is logged and its
// counts are lost (Counters and the metrics still have them), and so are the counts of the last
// duplicateFlushDelay when the process exits without Close. Rows older than
// duplicateHistoryKeep are deleted by the same statement, by the clock that stamped them
// (Config.Now), not the database's: a minute and its cut are read on one clock.

// duplicateFlushDelay is how long duplicates are added up in memory before they are written.
const duplicateFlushDelay = time.Second

// duplicateHistoryKeep is how long duplicates_per_minute keeps a minute (the admin page's
// longest window is a day).
const duplicateHistoryKeep = 48 * time.Hour

type duplicateMinute struct {
	consumer string
	minute   time.Time
}

type duplicateCount struct{ duplicates, mismatches int64 }

// duplicateObserver is told of every duplicate the middleware skips, once, and closed with
// the middleware: the one hook through which operators' features (the admin page's charts)
// follow deliveries, so that the delivery path does only the guarantee's work.
type duplicateObserver interface {
	duplicate(consumer string, mismatch bool)
	close()
}

// duplicateHistory is the duplicateObserver that writes duplicates_per_minute; it holds the
// counts not written yet.
type duplicateHistory struct {
	db     *sql.DB
	schema string
	now    func() time.Time
	logger watermill.LoggerAdapter

	mu         sync.Mutex
	pending    map[duplicateMinute]duplicateCount
	scheduled  bool
	failedOnce bool // a failed write was logged at error level; later ones at debug
}

// duplicate adds one skipped copy of consumer (mismatch: its payload differed) to the minute
// it was skipped in, and schedules a write.
func (h *duplicateHistory) duplicate(consumer string, mismatch bool) {
	k := duplicateMinute{consumer: consumer, minute: h.now().UTC().Truncate(time.Minute)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == nil {
		h.pending = map[duplicateMinute]duplicateCount{}
	}
	c := h.pending[k]
	c.duplicates++
	if mismatch {
		c.mismatches++
	}
	h.pending[k] = c
	if !h.scheduled {
		h.scheduled = true
		time.AfterFunc(duplicateFlushDelay, func() { _ = h.flush(context.Background()) })
	}
}

// flush writes the pending counts in one statement. It returns the write's error, which it
// also logs.
func (h *duplicateHistory) flush(ctx context.Context) error {
	h.mu.Lock()
	batch := h.pending
	h.pending, h.scheduled = nil, false
	h.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	consumers := make([]string, 0, len(batch))
	minutes := make([]time.Time, 0, len(batch))
	dups := make([]int64, 0, len(batch))
	mismatches := make([]int64, 0, len(batch))
	for k, c := range batch {
		consumers, minutes = append(consumers, k.consumer), append(minutes, k.minute)
		dups, mismatches = append(dups, c.duplicates), append(mismatches, c.mismatches)
	}
	table := pgtx.QualifiedName(h.schema, "duplicates_per_minute")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := h.db.ExecContext(ctx, `WITH old AS (DELETE FROM `+table+` WHERE minute < $5::timestamptz)
INSERT INTO `+table+` AS t (consumer, minute, duplicates, mismatches)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::bigint[])
ON CONFLICT (consumer, minute) DO UPDATE SET duplicates = t.duplicates + EXCLUDED.duplicates, mismatches = t.mismatches + EXCLUDED.mismatches`,
		consumers, minutes, dups, mismatches, h.now().Add(-duplicateHistoryKeep))
	if err != nil {
		h.mu.Lock()
		first := !h.failedOnce
		h.failedOnce = true
		h.mu.Unlock()
		fields := watermill.LogFields{"consumers": len(batch), "table": table}
		if first {
			h.logger.Error("Duplicates per minute not recorded (the admin page's duplicates chart misses them; later failures are logged at debug level)", err, fields)
		} else {
			h.logger.Debug("Duplicates per minute not recorded: "+err.Error(), fields)
		}
		return fmt.Errorf("once: record duplicates per minute: %w", err)
	}
	return nil
}

// close writes what is pending when the middleware closes; a failure is logged (the record is
// best-effort).
func (h *duplicateHistory) close() { _ = h.flush(context.Background()) }
