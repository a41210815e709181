// Package owner holds what the owners of the tables share to carry out their operations: the
// check and the delete-by-age behind every Prune, and the cheap listing of a table's consumers.
package owner

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// defaultBatchSize is pgtx.PruneRequest.BatchSize when it is zero.
const defaultBatchSize = 1000

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
// pgtx.DefaultSchema), the request with its BatchSize defaulted, and the cutoff: Before, or now() -
// Keep read from the database.
func CheckPrune(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest, scope PruneScope) (string, pgtx.PruneRequest, time.Time, error) {
	if db == nil {
		return "", req, time.Time{}, errors.New("db is nil")
	}
	schema = cmp.Or(schema, pgtx.DefaultSchema)
	req.BatchSize = cmp.Or(req.BatchSize, defaultBatchSize)
	if err := errors.Join(pgtx.ValidateIdentifier("schema", schema), checkWindow(req), checkConsumer(req.Consumer, scope)); err != nil {
		return "", req, time.Time{}, err
	}
	cutoff, err := pruneCutoff(ctx, db, req)
	if err != nil {
		return "", req, time.Time{}, err
	}
	return schema, req, cutoff, nil
}

// checkWindow checks the batch size and that exactly one of Before and Keep says which rows are
// old enough (a zero Keep alone would delete every row).
func checkWindow(req pgtx.PruneRequest) error {
	switch {
	case req.BatchSize < 1:
		return fmt.Errorf("BatchSize must be positive, got %d", req.BatchSize)
	case req.Keep < 0:
		return fmt.Errorf("keep must not be negative, got %s", req.Keep)
	case req.Before.IsZero() != (req.Keep == 0): // exactly one is set
		return nil
	case req.Keep != 0:
		return errors.New("set Before or Keep, not both")
	}
	return errors.New("set Before (a time) or Keep (an age); a zero Keep would delete every row")
}

// checkConsumer checks PruneRequest.Consumer against the scope of the owner's rows: refused for
// Unscoped rows, required for PerConsumer ones, optional for AnyConsumer.
func checkConsumer(consumer string, scope PruneScope) error {
	switch {
	case scope == AnyConsumer, (consumer == "") == (scope == Unscoped):
		return nil
	case scope == Unscoped:
		return fmt.Errorf("Consumer %q given, but these rows belong to no consumer", consumer)
	}
	return errors.New("Consumer is required: these rows belong to a consumer")
}

// pruneCutoff is req.Before, or now() - req.Keep by the database's clock (the rows' times were
// written by it).
func pruneCutoff(ctx context.Context, db *sql.DB, req pgtx.PruneRequest) (time.Time, error) {
	if !req.Before.IsZero() {
		return req.Before, nil
	}
	var cutoff time.Time
	if err := db.QueryRowContext(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, req.Keep.Microseconds()).Scan(&cutoff); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return cutoff, nil
}

// PruneOlder is the whole of an owner's Prune for rows that belong to no consumer: it checks req
// (CheckPrune), then deletes, in batches of req.BatchSize, the rows of schema's table whose
// time column is before the cutoff (at or before, with inclusive) and that match the optional
// extra condition, a SQL fragment of the owner's own (never a configuration string), and
// returns how many it deleted, also when it stops on an error or a cancelled ctx. Rows are
// deleted by physical address (ctid = ANY(ARRAY(...)), a TID scan); rows another transaction
// holds locked are skipped.
func PruneOlder(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest, table, timeColumn string, inclusive bool, extra string) (int64, error) {
	schema, req, cutoff, err := CheckPrune(ctx, db, schema, req, Unscoped)
	if err != nil {
		return 0, err
	}
	t := pgtx.QualifiedName(schema, table)
	op := "<"
	if inclusive {
		op = "<="
	}
	where := pgtx.QuoteIdentifier(timeColumn) + ` ` + op + ` $1::timestamptz`
	if extra != "" {
		where = extra + ` AND ` + where
	}
	return pgtx.DeleteInBatches(ctx, db, req.BatchSize, `DELETE FROM `+t+` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM `+t+` WHERE `+where+` LIMIT $2 FOR UPDATE SKIP LOCKED))`, cutoff)
}

// DistinctConsumers lists, in name order, the distinct values of the consumer column of table
// (a name from pgtx.QualifiedName, never user text). It walks an index led by consumer one value at
// a time (a "loose index scan"): one index probe per consumer, not a scan of the table, so
// it stays cheap on tables of millions of claims or inbox rows. Without such an index it is
// a sequential scan per consumer.
func DistinctConsumers(ctx context.Context, q pgtx.Executor, table string) ([]string, error) {
	out, err := pgtx.QueryAll(ctx, q, scanString, `WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM `+table+` ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer FROM `+table+` t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("consumers of %s: %w", table, err)
	}
	return out, nil
}

func scanString(s pgtx.Scanner) (string, error) {
	var v string
	err := s.Scan(&v)
	return v, err
}
