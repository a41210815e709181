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
	return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(schema)); err != nil {
			return fmt.Errorf("partition: lock: %w", err)
		}
		for day := Day(first); !day.After(Day(last)); day = day.AddDate(0, 0, 1) {
			if err := create(ctx, tx, schema, day); err != nil {
				return err
			}
		}
		return nil
	})
}

// create creates day's partition in tx unless it exists.
func create(ctx context.Context, tx *sql.Tx, schema string, day time.Time) error {
	name := pgtx.QualifiedName(schema, Name(day))
	var exists bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || exists {
		return wrap("look up", day, err)
	}
	// Bounds are dates formatted by us, not configuration: safe as literals.
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		name, pgtx.QualifiedName(schema, Parent), day.Format(time.DateOnly), day.AddDate(0, 0, 1).Format(time.DateOnly)))
	return wrap("create", day, err)
}

// wrap names the operation and the partition in err; nil stays nil.
func wrap(op string, day time.Time, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("partition: %s %s: %w", op, Name(day), err)
}

// List returns the days that have a partition, oldest first.
func List(ctx context.Context, db *sql.DB, schema string) ([]time.Time, error) {
	var days []time.Time
	err := pgtx.QueryEach(ctx, db, func(s pgtx.Scanner) error {
		var name string
		err := s.Scan(&name)
		if day, ok := dayOf(name); ok {
			days = append(days, day)
		}
		return err
	}, `
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = $1 AND p.relname = $2
ORDER BY c.relname`, schema, Parent)
	if err != nil {
		return nil, fmt.Errorf("partition: list: %w", err)
	}
	return days, nil
}

// dayOf returns the day of a partition named by Name; false for a table that is not ours.
func dayOf(name string) (time.Time, bool) {
	m := namePattern.FindStringSubmatch(name)
	if m == nil {
		return time.Time{}, false
	}
	day, err := time.Parse("20060102", m[1])
	return day, err == nil
}

// DropBefore detaches and drops every partition whose whole day lies before cutoff's day and
// returns the days dropped. DETACH ... CONCURRENTLY keeps claims flowing meanwhile.
func DropBefore(ctx context.Context, db *sql.DB, schema string, cutoff time.Time) ([]time.Time, error) {
	days, err := List(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	var dropped []time.Time
	for _, day := range days {
		if !day.Before(Day(cutoff)) {
			break
		}
		if err := drop(ctx, db, schema, day); err != nil {
			return dropped, err
		}
		dropped = append(dropped, day)
	}
	return dropped, nil
}

// drop detaches day's partition concurrently and drops it. A partition left "pending detach"
// by an earlier run that died half way is finalized first.
func drop(ctx context.Context, db *sql.DB, schema string, day time.Time) error {
	parent, part := pgtx.QualifiedName(schema, Parent), pgtx.QualifiedName(schema, Name(day))
	_, err := db.ExecContext(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+part+` CONCURRENTLY`)
	if err != nil && strings.Contains(err.Error(), "pending detach") {
		_, err = db.ExecContext(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+part+` FINALIZE`)
	}
	if err != nil {
		return wrap("detach", day, err)
	}
	_, err = db.ExecContext(ctx, `DROP TABLE `+part)
	return wrap("drop", day, err)
}
