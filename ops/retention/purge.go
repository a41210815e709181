package retention

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// PurgeRequest selects the claims Purge deletes.
type PurgeRequest struct {
	Consumer  string    // whose claims go; "" means every consumer
	Before    time.Time // claims applied (processed_at) before this go; required
	DryRun    bool      // count what would go, delete nothing
	BatchSize int       // the most rows per delete transaction; default 5000
}

// Purge deletes the claims of one consumer (or all) applied before req.Before, in both claim
// tables, through the claim owner's operations, and returns how many it deleted (DryRun: would
// delete). A purged claim no longer deduplicates: a later copy of its message is applied again
// unless the age guard refuses it. For operators; it ignores Config's windows.
func Purge(ctx context.Context, db *sql.DB, schema string, req PurgeRequest) (int64, error) {
	schema = cmp.Or(schema, pgtx.DefaultSchema)
	req.BatchSize = cmp.Or(req.BatchSize, DefaultBatchSize)
	if err := req.validate(db, schema); err != nil {
		return 0, fmt.Errorf("retention: purge: %w", err)
	}
	var n int64
	var err error
	if req.DryRun {
		n, err = claims.CountClaims(ctx, db, schema, req.Consumer, req.Before)
	} else {
		n, err = purgeClaims(ctx, db, schema, req)
	}
	if err != nil {
		return n, fmt.Errorf("retention: purge: %w", hint(err))
	}
	return n, nil
}

// validate reports what makes req (with its defaults) unusable on db and schema.
func (req PurgeRequest) validate(db *sql.DB, schema string) error {
	if db == nil {
		return errors.New("db is nil")
	}
	errs := []error{
		pgtx.ValidateIdentifier("schema", schema),
		setup.Check(!req.Before.IsZero(), "give Before, the time before which claims go"),
		setup.Between("BatchSize", req.BatchSize, 1, MaxBatchSize),
	}
	if req.Consumer != "" {
		errs = append(errs, validateConsumer(req.Consumer))
	}
	return errors.Join(errs...)
}

// purgeClaims deletes req's claims from processed_messages, consumer by consumer, then from
// processed_messages_daily, and returns how many it deleted, also when it stops on an error.
func purgeClaims(ctx context.Context, db *sql.DB, schema string, req PurgeRequest) (int64, error) {
	consumers := []string{req.Consumer}
	if req.Consumer == "" {
		var err error
		if consumers, err = claims.ClaimConsumers(ctx, db, schema); err != nil {
			return 0, err
		}
	}
	var total int64
	for _, c := range consumers {
		n, err := once.PruneClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: c, Before: req.Before, BatchSize: req.BatchSize})
		total += n
		if err != nil {
			return total, err
		}
	}
	n, err := once.PruneDailyClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: req.Consumer, Before: req.Before, BatchSize: req.BatchSize})
	return total + n, err
}
