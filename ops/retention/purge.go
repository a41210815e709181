package retention

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// PurgeRequest selects the claims Purge deletes.
type PurgeRequest struct {
	// Consumer whose claims go; "" means every consumer.
	Consumer string
	// Before: claims applied (processed_at) before this time go. Required.
	Before time.Time
	// DryRun counts the claims that would go and deletes nothing.
	DryRun bool
	// BatchSize is the most rows per delete transaction. Default 5000.
	BatchSize int
}

// Purge deletes the claims of one consumer (or all) applied before req.Before, in
// processed_messages and processed_messages_daily, in batches of short transactions, and
// returns how many it deleted (with DryRun: how many it would delete). The deletes are the
// claim owner's operations (once.PruneClaims, once.PruneDailyClaims; internal/claims for the counts).
//
// A purged claim no longer deduplicates: a copy of its message arriving later is applied again
// unless the middleware's age guard refuses it. Purge is for operators (disk pressure, a
// retired consumer); it ignores the retention windows of Config.
func Purge(ctx context.Context, db *sql.DB, schema string, req PurgeRequest) (int64, error) {
	if db == nil {
		return 0, errors.New("retention: purge: db is nil")
	}
	if schema == "" {
		schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return 0, fmt.Errorf("retention: purge: %w", err)
	}
	if req.Before.IsZero() {
		return 0, errors.New("retention: purge: give Before, the time before which claims go")
	}
	if req.Consumer != "" {
		if err := validateConsumer(req.Consumer); err != nil {
			return 0, fmt.Errorf("retention: purge: %w", err)
		}
	}
	if req.BatchSize == 0 {
		req.BatchSize = DefaultBatchSize
	}
	if req.BatchSize < 1 || req.BatchSize > MaxBatchSize {
		return 0, fmt.Errorf("retention: purge: BatchSize must be between 1 and %d, got %d", MaxBatchSize, req.BatchSize)
	}
	if req.DryRun {
		n, err := claims.CountClaims(ctx, db, schema, req.Consumer, req.Before)
		if err != nil {
			return n, fmt.Errorf("retention: purge: %w", hint(err))
		}
		return n, nil
	}
	consumers := []string{req.Consumer}
	if req.Consumer == "" {
		var err error
		if consumers, err = claims.ClaimConsumers(ctx, db, schema); err != nil {
			return 0, fmt.Errorf("retention: purge: %w", hint(err))
		}
	}
	var total int64
	for _, c := range consumers {
		n, err := once.PruneClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: c, Before: req.Before, BatchSize: req.BatchSize})
		total += n
		if err != nil {
			return total, fmt.Errorf("retention: purge: %w", hint(err))
		}
	}
	n, err := once.PruneDailyClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: req.Consumer, Before: req.Before, BatchSize: req.BatchSize})
	total += n
	if err != nil {
		return total, fmt.Errorf("retention: purge: %w", err)
	}
	return total, nil
}
