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

// KeyStats describes the stored responses in the http_idempotency_keys table of one schema.
type KeyStats struct {
	// Estimated is the number of stored keys, live and expired, from the planner's statistics
	// (pg_class.reltuples, refreshed by VACUUM and ANALYZE, normally by autovacuum). While the
	// statistics say nothing or 0 (a new table) it is an exact count, capped at 100000.
	Estimated int64
	// OldestAge is the age of the oldest stored key by the database clock; 0 when the table is
	// empty. Well above Config.Retention, it means expired keys are not being deleted
	// (Middleware.Prune or the retention janitor is not running).
	OldestAge time.Duration
}

// StoredKeys reads KeyStats cheaply: a catalog lookup and one probe of the created_at index,
// never a scan of the table once it has statistics. It is what package metrics exports at
// scrape time.
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
