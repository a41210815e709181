package pgtx

import (
	"context"
	"database/sql"
	"time"

	"github.com/wmonce/watermill-once/internal/replan"
)

// DeleteInBatches runs query, a DELETE of at most batchSize rows whose last parameter is the
// batch size, each run a transaction of its own, until a run deletes fewer, and returns how
// many it deleted in all, also on an error. It is the one loop behind every owner's Prune.
func DeleteInBatches(ctx context.Context, db *sql.DB, batchSize int, query string, args ...any) (int64, error) {
	args = replan.For(db).Args(append(args, batchSize)...)
	var total int64
	for ctx.Err() == nil {
		res, err := db.ExecContext(ctx, query, args...)
		if err != nil {
			return total, err
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(batchSize) {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// PruneRequest is what every owner's Prune function takes (outbox.Prune, once.PruneClaims,
// inbox.PruneFinished, ...): which rows are old enough to go, for whom, in batches of what size.
type PruneRequest struct {
	// Before deletes rows older than this time (by the time column each owner documents).
	// Set Before or Keep, not both.
	Before time.Time
	// Keep deletes rows older than Keep by the database clock (now() - Keep).
	Keep time.Duration
	// Consumer scopes the functions whose rows belong to a consumer (claims, inbox rows); it is
	// required there and refused by the others.
	Consumer string
	// BatchSize is the most rows one transaction deletes. Default 1000.
	BatchSize int
}
