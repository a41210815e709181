// Package partition manages the daily partitions of processed_messages_daily: creating them
// ahead of need (janitor) or on demand (middleware), listing them, and dropping expired ones.
package partition

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// Parent is the partitioned table.
const Parent = "processed_messages_daily"

const namePrefix = "processed_messages_"

var namePattern = regexp.MustCompile(`^processed_messages_(\d{8})$`)

// Day truncates t to its UTC calendar day, the partition key.
func Day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// Name returns the unqualified partition name for day.
func Name(day time.Time) string { return namePrefix + Day(day).Format("20060102") }

func lockKey(schema string) int64 { return worker.LockKey("partitions", schema) }

// Ensure creates the partitions for every day from first to last (inclusive) that do not exist.
// Creating a partition locks the parent briefly; an advisory lock keeps concurrent creators
// (several instances, the janitor) from colliding.
func Ensure(ctx context.Context, db *sql.DB, schema string, first, last time.Time) error {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return err
	}
	parent := pgtx.QualifiedName(schema, Parent)
	return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(schema)); err != nil {
			return fmt.Errorf("partition: lock: %w", err)
		}
		for day := Day(first); !day.After(Day(last)); day = day.AddDate(0, 0, 1) {
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgtx.QualifiedName(schema, Name(day))).Scan(&exists); err != nil {
				return fmt.Errorf("partition: look up %s: %w", Name(day), err)
			}
			if exists {
				continue
			}
			// Bounds are dates formatted by us, not configuration: safe as literals.
			stmt := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
				pgtx.QualifiedName(schema, Name(day)), parent, day.Format(time.DateOnly), day.AddDate(0, 0, 1).Format(time.DateOnly))
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("partition: create %s: %w", Name(day), err)
			}
		}
		return nil
	})
}

// List returns the days that have a partition, oldest first.
func List(ctx context.Context, db *sql.DB, schema string) ([]time.Time, error) {
	rows, err := db.QueryContext(ctx, `
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = $1 AND p.relname = $2
ORDER BY c.relname`, schema, Parent)
	if err != nil {
		return nil, fmt.Errorf("partition: list: %w", err)
	}
	defer rows.Close()
	var days []time.Time
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		m := namePattern.FindStringSubmatch(name)
		if m == nil {
			continue // not ours: leave it alone
		}
		day, err := time.Parse("20060102", m[1])
		if err != nil {
			continue
		}
		days = append(days, day)
	}
	return days, rows.Err()
}

// DropBefore detaches and drops every partition whose whole day lies before cutoff's day and
// returns the days dropped. DETACH ... CONCURRENTLY keeps claims flowing meanwhile.
func DropBefore(ctx context.Context, db *sql.DB, schema string, cutoff time.Time) ([]time.Time, error) {
	days, err := List(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	parent := pgtx.QualifiedName(schema, Parent)
	var dropped []time.Time
	for _, day := range days {
		if !day.Before(Day(cutoff)) {
			break
		}
		part := pgtx.QualifiedName(schema, Name(day))
		if _, err := db.ExecContext(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+part+` CONCURRENTLY`); err != nil {
			// An earlier run died half way: the partition is "pending detach" and must be finalized.
			if !strings.Contains(err.Error(), "pending detach") {
				return dropped, fmt.Errorf("partition: detach %s: %w", Name(day), err)
			}
			if _, err := db.ExecContext(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+part+` FINALIZE`); err != nil {
				return dropped, fmt.Errorf("partition: finalize detach %s: %w", Name(day), err)
			}
		}
		if _, err := db.ExecContext(ctx, `DROP TABLE `+part); err != nil {
			return dropped, fmt.Errorf("partition: drop %s: %w", Name(day), err)
		}
		dropped = append(dropped, day)
	}
	return dropped, nil
}
