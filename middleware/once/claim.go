package once

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// claim inserts the key first. It returns fresh=false for a duplicate, after checking the
// fingerprint of the applied copy.
func (e *Middleware) claim(ctx context.Context, tx *sql.Tx, d *delivery) (fresh bool, err error) {
	args := []any{d.consumer, d.key, d.fingerprint}
	if e.q.daily {
		args = append(args, partition.Day(d.occurredAt))
	}
	res, err := tx.ExecContext(ctx, e.q.claim, args...)
	return e.claimOutcome(ctx, tx, d, res, err)
}

// claimOutcome interprets the result of a claim statement (alone or last of a list).
func (e *Middleware) claimOutcome(ctx context.Context, tx *sql.Tx, d *delivery, res sql.Result, err error) (fresh bool, _ error) {
	lookupArgs := []any{d.consumer, d.key}
	if e.q.daily {
		lookupArgs = append(lookupArgs, partition.Day(d.occurredAt))
	}
	if err != nil {
		if txguard.IsMissing(err) {
			return false, fmt.Errorf("once: a table or function of schema %q is missing (processed_messages, attempt_guard, attempt_begin, attempt_open): run the migrations: %w", e.config.Schema, err)
		}
		if e.q.daily && pgtx.SQLState(err) == pgtx.CodeCheckViolation {
			return false, &missingPartitionError{days: []time.Time{partition.Day(d.occurredAt)}, err: err}
		}
		if pgtx.IsSerializationFailure(err) {
			return false, &claimedAfterSnapshotError{err: err} // still retryable as a new transaction
		}
		return false, fmt.Errorf("once: claim: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		d.claimed()
		return true, e.checkAge(d)
	}
	d.countDuplicate()
	var stored []byte
	var processedAt time.Time
	if err := tx.QueryRowContext(ctx, e.q.lookup, lookupArgs...).Scan(&stored, &processedAt); err != nil {
		// The duplicate is certain (the insert conflicted); only the fingerprint check is lost.
		e.logger.Error("Duplicate skipped, but its applied copy could not be read to compare payloads", err, d.fields)
		return false, nil
	}
	return false, e.reportDuplicate(d, stored, processedAt)
}

// reportDuplicate logs a skipped copy and compares its payload with the applied one's. It
// returns a permanent error only for a mismatch under RejectFingerprintMismatch.
func (e *Middleware) reportDuplicate(d *delivery, stored []byte, processedAt time.Time) error {
	if bytes.Equal(stored, d.fingerprint) {
		e.logDuplicate(d, "Duplicate skipped: already applied", d.fields.Add(watermill.LogFields{"processed_at": processedAt}))
		return nil
	}
	d.countMismatch()
	e.recordDuplicate(d.consumer, true)
	mismatch := fmt.Errorf("payload fingerprint mismatch: key %q was applied at %s with a different payload; two different events share one id", d.key, processedAt.Format(time.RFC3339))
	e.logger.Error("Duplicate with a DIFFERENT payload: not applied", mismatch, d.fields)
	if e.config.RejectFingerprintMismatch {
		return wmonce.Permanent(mismatch)
	}
	return nil
}
