package pgtx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
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

// CheckPrune checks the arguments every owner's Prune takes and returns the schema to use ("" is
// DefaultSchema): db must be set, the schema a valid identifier, keep not negative and batchSize
// positive.
func CheckPrune(db *sql.DB, schema string, keep time.Duration, batchSize int) (string, error) {
	if db == nil {
		return "", errors.New("db is nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateIdentifier("schema", schema); err != nil {
		return "", err
	}
	if keep < 0 || batchSize < 1 {
		return "", fmt.Errorf("keep must not be negative and batchSize must be positive, got %s and %d", keep, batchSize)
	}
	return schema, nil
}
