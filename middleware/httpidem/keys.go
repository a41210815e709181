package httpidem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// maxExactKeyCount bounds the exact count StoredKeys falls back to while the table has no
// statistics.
const maxExactKeyCount = 100000

// KeyStats describes the stored responses of one schema.
type KeyStats struct {
	// Estimated counts stored keys, expired ones too, from the planner's statistics (an exact
	// count up to 100000 while there are none).
	Estimated int64
	// OldestAge is the oldest key's age (0: none); far above Retention, nothing prunes.
	OldestAge time.Duration
}

// StoredKeys reads KeyStats without scanning the table (what package metrics exports).
func StoredKeys(ctx context.Context, db *sql.DB, schema string) (KeyStats, error) {
	if db == nil {
		return KeyStats{}, errors.New("httpidem: stored keys: db is nil")
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return KeyStats{}, fmt.Errorf("httpidem: %w", err)
	}
	t := pgtx.QualifiedName(schema, "http_idempotency_keys")
	var st KeyStats
	var estimate, age float64
	// reltuples is -1 before the first VACUUM or ANALYZE (PostgreSQL 14 and later) and 0 on
	// older servers; autovacuum analyzes a table after its first 50 changes, so an exact count
	// is cheap then.
	err := db.QueryRowContext(ctx, `SELECT
    CASE WHEN c.reltuples > 0 THEN c.reltuples
         ELSE (SELECT count(*) FROM (SELECT 1 FROM `+t+` LIMIT `+fmt.Sprint(maxExactKeyCount)+`) k) END,
    coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM `+t+`)), 0)
FROM pg_class c WHERE c.oid = $1::regclass`, t).Scan(&estimate, &age)
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return KeyStats{}, fmt.Errorf("httpidem: table %s is missing: run the migrations: %w", t, err)
		}
		return KeyStats{}, fmt.Errorf("httpidem: stored keys: %w", err)
	}
	st.Estimated = int64(estimate)
	st.OldestAge = time.Duration(age * float64(time.Second))
	return st, nil
}
