package retention

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/worker"
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
// returns how many it deleted (with DryRun: how many it would delete).
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
	q := newQueries(schema)
	consumers := []string{req.Consumer}
	if req.Consumer == "" {
		var err error
		if consumers, err = listConsumers(ctx, db, q.consumers); err != nil {
			return 0, fmt.Errorf("retention: purge: %w", hint(err))
		}
	}
	var total int64
	for _, c := range consumers {
		var n int64
		var err error
		if req.DryRun {
			err = db.QueryRowContext(ctx, q.countClaims, c, req.Before).Scan(&n)
		} else {
			n, err = deleteInBatches(ctx, db, req.BatchSize, q.deleteClaims, c, req.Before)
		}
		total += n
		if err != nil {
			return total, fmt.Errorf("retention: purge claims of %q: %w", c, hint(err))
		}
	}
	var n int64
	var err error
	if req.DryRun {
		err = db.QueryRowContext(ctx, q.countDaily, req.Consumer, req.Before).Scan(&n)
	} else {
		n, err = deleteInBatches(ctx, db, req.BatchSize, q.deleteDaily, req.Consumer, req.Before)
	}
	total += n
	if err != nil && !pgtx.IsUndefinedTable(err) { // a schema older than migration 004 has no daily table
		return total, fmt.Errorf("retention: purge day-partitioned claims: %w", err)
	}
	return total, nil
}

// ErrRelayActive is returned by ForgetRelay for a relay that is forwarding right now.
var ErrRelayActive = errors.New("retention: the relay is running: stop every instance of it first")

// ForgetRelay deletes the position of a retired relay from outbox_offsets and reports whether
// it existed. The janitor keeps every outbox row that some relay has not forwarded, so a relay
// name that no longer runs holds back outbox retention for good until it is forgotten.
//
// It refuses (ErrRelayActive) while an instance of that relay leads. Stop standby instances
// too: a relay that starts after its position was forgotten begins again at the oldest row
// still in the outbox and publishes those rows again (consumers deduplicate them, but the
// burst is avoidable).
func ForgetRelay(ctx context.Context, db *sql.DB, schema, name string) (bool, error) {
	if db == nil {
		return false, errors.New("retention: forget relay: db is nil")
	}
	if schema == "" {
		schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return false, fmt.Errorf("retention: forget relay: %w", err)
	}
	if name == "" {
		return false, errors.New("retention: forget relay: name the relay (its RelayConfig.Name)")
	}
	q := newQueries(schema)
	// The key outbox.Relay locks while it leads (see outbox/relay.go); a test keeps the two in step.
	classid, objid := worker.LockKeyParts(worker.LockKey("relay", schema, name))
	var active bool
	if err := db.QueryRowContext(ctx, q.relayLockHeldByPeer, classid, objid).Scan(&active); err != nil {
		return false, fmt.Errorf("retention: forget relay: %w", err)
	}
	if active {
		return false, fmt.Errorf("%w (relay %q)", ErrRelayActive, name)
	}
	res, err := db.ExecContext(ctx, q.deleteRelay, name)
	if err != nil {
		return false, fmt.Errorf("retention: forget relay: %w", hint(err))
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// Relays lists the relay names with a position in outbox_offsets: every one of them must
// forward a row before the janitor may delete it.
func Relays(ctx context.Context, db *sql.DB, schema string) ([]string, error) {
	if db == nil {
		return nil, errors.New("retention: db is nil")
	}
	if schema == "" {
		schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return nil, fmt.Errorf("retention: relays: %w", err)
	}
	rows, err := db.QueryContext(ctx, newQueries(schema).relays)
	if err != nil {
		return nil, fmt.Errorf("retention: relays: %w", hint(err))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("retention: relays: %w", err)
		}
		out = append(out, name)
	}
	return out, rows.Err()
}
