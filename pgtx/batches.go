package pgtx

import (
	"cmp"
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
// loop behind every owner's Prune. Each run is planned anew (ReplanArgs): a plan cached while
// the table was small would scan all of it for every batch.
func DeleteInBatches(ctx context.Context, db *sql.DB, batchSize int, query string, args ...any) (int64, error) {
	args = ReplanArgs(db).Args(append(args, batchSize)...)
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

// PruneRequest is what every owner's Prune function takes (outbox.Prune and PruneRejected,
// once.PruneClaims and PruneDailyClaims, inbox.PruneFinished, intent.PruneSent,
// httpidem.Prune): which rows are old enough to go, for whom, in batches of what size.
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

const defaultPruneBatchSize = 1000

// PruneScope says how an owner's rows relate to consumers, for CheckPrune.
type PruneScope int

const (
	// Unscoped rows belong to no consumer: PruneRequest.Consumer is refused.
	Unscoped PruneScope = iota
	// PerConsumer rows belong to one consumer: PruneRequest.Consumer is required.
	PerConsumer
	// AnyConsumer rows belong to a consumer: PruneRequest.Consumer narrows, "" means every one.
	AnyConsumer
)

// CheckPrune checks what every owner's Prune takes and returns the schema to use ("" is
// DefaultSchema), the request with its BatchSize defaulted, and the cutoff: Before, or now() -
// Keep read from the database.
func CheckPrune(ctx context.Context, db *sql.DB, schema string, req PruneRequest, scope PruneScope) (string, PruneRequest, time.Time, error) {
	if db == nil {
		return "", req, time.Time{}, errors.New("db is nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateIdentifier("schema", schema); err != nil {
		return "", req, time.Time{}, err
	}
	req.BatchSize = cmp.Or(req.BatchSize, defaultPruneBatchSize)
	var errs []error
	switch {
	case req.BatchSize < 1:
		errs = append(errs, fmt.Errorf("BatchSize must be positive, got %d", req.BatchSize))
	case req.Keep < 0:
		errs = append(errs, fmt.Errorf("keep must not be negative, got %s", req.Keep))
	case !req.Before.IsZero() && req.Keep != 0:
		errs = append(errs, errors.New("set Before or Keep, not both"))
	case req.Before.IsZero() && req.Keep == 0:
		errs = append(errs, errors.New("set Before (a time) or Keep (an age); a zero Keep would delete every row"))
	}
	switch {
	case scope == PerConsumer && req.Consumer == "":
		errs = append(errs, errors.New("Consumer is required: these rows belong to a consumer"))
	case scope == Unscoped && req.Consumer != "":
		errs = append(errs, fmt.Errorf("Consumer %q given, but these rows belong to no consumer", req.Consumer))
	}
	if err := errors.Join(errs...); err != nil {
		return "", req, time.Time{}, err
	}
	if !req.Before.IsZero() {
		return schema, req, req.Before, nil
	}
	var cutoff time.Time
	if err := db.QueryRowContext(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, req.Keep.Microseconds()).Scan(&cutoff); err != nil {
		return "", req, time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return schema, req, cutoff, nil
}

// PruneOlder is the whole of an owner's Prune for rows that belong to no consumer: it checks req
// (CheckPrune), then deletes, in batches of req.BatchSize, the rows of schema's table whose
// time column is before the cutoff (at or before, with inclusive) and that match the optional
// extra condition, a SQL fragment of the owner's own (never a configuration string), and
// returns how many it deleted, also when it stops on an error or a cancelled ctx. Rows are
// deleted by physical address (ctid = ANY(ARRAY(...)), a TID scan); rows another transaction
// holds locked are skipped.
func PruneOlder(ctx context.Context, db *sql.DB, schema string, req PruneRequest, table, timeColumn string, inclusive bool, extra string) (int64, error) {
	schema, req, cutoff, err := CheckPrune(ctx, db, schema, req, Unscoped)
	if err != nil {
		return 0, err
	}
	t := QualifiedName(schema, table)
	op := "<"
	if inclusive {
		op = "<="
	}
	where := QuoteIdentifier(timeColumn) + ` ` + op + ` $1::timestamptz`
	if extra != "" {
		where = extra + ` AND ` + where
	}
	return DeleteInBatches(ctx, db, req.BatchSize, `DELETE FROM `+t+` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM `+t+` WHERE `+where+` LIMIT $2 FOR UPDATE SKIP LOCKED))`, cutoff)
}
