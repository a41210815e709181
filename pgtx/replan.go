package pgtx

import (
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ReplanArgs returns the arguments to put before a query's own so that PostgreSQL plans it at
// each execution, with the table sizes of that moment (on pgx's driver, pgx.QueryExecModeExec;
// nil for other drivers). For the few hot statements on tables whose size changes fast; a plan
// costs some 0.2 ms of server CPU.
func ReplanArgs(db *sql.DB) Replan {
	// pgx otherwise prepares every query once per connection, and PostgreSQL keeps the generic
	// plan it chose after five executions until an ANALYZE invalidates it. For a table that was
	// empty then (a new deployment, after a TRUNCATE) that plan is a sequential scan, kept while
	// the table grows until autovacuum's next ANALYZE: the relay's read of a round cost 5-7 ms
	// instead of 0.1-0.3. lib/pq sends unnamed statements already.
	if db == nil {
		return nil
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil
	}
	return []any{pgx.QueryExecModeExec}
}

// Replan is what ReplanArgs returns: the arguments that go before a query's own.
type Replan []any

// Args returns r followed by args, in a new slice each time, so a Replan kept by a component
// serves concurrent queries.
func (r Replan) Args(args ...any) []any {
	return append(r[:len(r):len(r)], args...)
}
