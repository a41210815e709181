package once

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/pgtx"
)

// claimAll inserts every key with one statement and splits the group into fresh claims and
// duplicates (checking the duplicates' fingerprints with one more statement).
func (g *groupCommitter) claimAll(ctx context.Context, tx *sql.Tx, pending []*queued) (fresh, dups []*queued, err error) {
	e := g.e
	consumers := make([]string, len(pending))
	keys := make([]string, len(pending))
	prints := make([][]byte, len(pending))
	days := make([]time.Time, len(pending))
	for i, q := range pending {
		consumers[i], keys[i], prints[i] = q.Item.d.consumer, q.Item.d.key, q.Item.d.fingerprint
		days[i] = partition.Day(q.Item.d.occurredAt)
	}
	args := []any{consumers, keys, prints}
	if e.q.daily {
		args = append(args, days)
	}
	rows, err := tx.QueryContext(ctx, e.q.claimMany, args...)
	if err != nil {
		if e.q.daily && pgtx.SQLState(err) == pgtx.CodeCheckViolation {
			return nil, nil, &missingPartitionError{days: distinct(days), err: err}
		}
		return nil, nil, fmt.Errorf("once: claim group: %w", err)
	}
	claimed, err := scanClaimed(rows, len(pending))
	if err != nil {
		return nil, nil, fmt.Errorf("once: claim group: %w", err)
	}
	for _, q := range pending {
		if claimed[[2]string{q.Item.d.consumer, q.Item.d.key}] {
			q.Item.d.claimed()
			fresh = append(fresh, q)
		} else {
			q.Item.d.countDuplicate()
			dups = append(dups, q)
		}
	}
	if len(dups) > 0 {
		g.checkFingerprints(ctx, tx, dups)
	}
	return fresh, dups, nil
}

// scanClaimed reads the (consumer, key) pairs the group's claim inserted and closes rows: the
// transaction's next statement needs the connection.
func scanClaimed(rows *sql.Rows, n int) (map[[2]string]bool, error) {
	defer rows.Close()
	claimed := make(map[[2]string]bool, n)
	for rows.Next() {
		var c, k string
		if err := rows.Scan(&c, &k); err != nil {
			return nil, err
		}
		claimed[[2]string{c, k}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return claimed, rows.Close()
}

// checkFingerprints reports duplicates whose payload differs from the applied copy's. With
// RejectFingerprintMismatch the copy is answered with the permanent error right away.
func (g *groupCommitter) checkFingerprints(ctx context.Context, tx *sql.Tx, dups []*queued) {
	e := g.e
	consumers := make([]string, len(dups))
	keys := make([]string, len(dups))
	for i, q := range dups {
		consumers[i], keys[i] = q.Item.d.consumer, q.Item.d.key
	}
	rows, err := tx.QueryContext(ctx, e.q.lookupMany, consumers, keys)
	if err != nil {
		e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
		return
	}
	defer rows.Close()
	type applied struct {
		fingerprint []byte
		at          time.Time
	}
	stored := map[[2]string]applied{}
	for rows.Next() {
		var c, k string
		var a applied
		if err := rows.Scan(&c, &k, &a.fingerprint, &a.at); err != nil {
			e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
			return
		}
		stored[[2]string{c, k}] = a
	}
	if err := rows.Err(); err != nil {
		e.logger.Error("Could not read applied copies to compare fingerprints", err, nil)
		return
	}
	for _, q := range dups {
		if a, ok := stored[[2]string{q.Item.d.consumer, q.Item.d.key}]; ok {
			if err := e.reportDuplicate(q.Item.d, a.fingerprint, a.at); err != nil {
				g.settle(q, err)
			}
		}
	}
}

func distinct(days []time.Time) []time.Time {
	seen := map[time.Time]bool{}
	var out []time.Time
	for _, d := range days {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}
