package inbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/internal/replan"
	"github.com/wmonce/watermill-once/pgtx"
)

// PruneFinished deletes the DONE and SKIPPED rows of req.Consumer ("" for every consumer)
// finished before req's cutoff, in batches, and returns how many it deleted. PENDING,
// IN_PROGRESS and FAILED rows are never deleted. A deleted row no longer deduplicates its
// message: keep rows for longer than the broker can redeliver.
func PruneFinished(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	schema, req, cutoff, err := owner.CheckPrune(ctx, db, schema, req, owner.AnyConsumer)
	if err != nil {
		return 0, fmt.Errorf("inbox: prune finished: %w", err)
	}
	q := newQueries(schema)
	// The batch is located through inbox_finished_idx (consumer, finished_at) and deleted by
	// physical address (a TID scan); rows an operator holds locked are skipped. A separate
	// statement per form keeps the consumer condition sargable under a generic plan.
	where := `consumer = $1 AND status IN ('DONE', 'SKIPPED') AND finished_at < $2`
	args := []any{req.Consumer, cutoff}
	if req.Consumer == "" {
		where = `status IN ('DONE', 'SKIPPED') AND finished_at < $1`
		args = []any{cutoff}
	}
	limitParam := fmt.Sprintf("$%d", len(args)+1)
	query := `WITH gone AS (
    DELETE FROM ` + q.table + ` WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM ` + q.table + ` WHERE ` + where + ` LIMIT ` + limitParam + ` FOR UPDATE SKIP LOCKED))
    RETURNING id
)
SELECT count(*) FROM gone`
	var total int64
	for ctx.Err() == nil {
		var n int64
		// Planned at each run (replan.For), as pgtx.DeleteInBatches is.
		if err := db.QueryRowContext(ctx, query, replan.For(db).Args(append(args, req.BatchSize)...)...).Scan(&n); err != nil {
			return total, fmt.Errorf("inbox: prune finished: %w", err)
		}
		total += n
		if n < int64(req.BatchSize) {
			return total, nil
		}
	}
	return total, ctx.Err()
}
