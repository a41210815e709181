package pgtx

import (
	"context"
	"database/sql"
)

// DeleteInBatches runs query, a DELETE of at most batchSize rows whose last parameter is the
// batch size (args are the ones before it), until a run deletes fewer than batchSize rows, and
// returns how many it deleted in all, also when it stops on an error or a cancelled ctx. Each
// run is a transaction of its own, so a large purge never holds locks for long. It is the one
// loop behind every owner's Prune.
func DeleteInBatches(ctx context.Context, db *sql.DB, batchSize int, query string, args ...any) (int64, error) {
	args = append(args, batchSize)
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
