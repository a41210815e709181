// Package replan makes PostgreSQL plan a hot query at each execution, for the few statements
// that run often against a table whose size changes fast and whose plan depends on it. It is a
// leaf: it imports nothing of this module.
package replan

import (
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// For returns the arguments to put before a query's own so that PostgreSQL plans it at
// each execution, with the table sizes of that moment (on pgx's driver, pgx.QueryExecModeExec;
// nil for other drivers). For the few hot statements on tables whose size changes fast; a plan
// costs some 0.2 ms of server CPU.
func For(db *sql.DB) Prefix {
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

// Prefix is what For returns: the arguments that go before a query's own.
type Prefix []any

// Args returns r followed by args, in a new slice each time, so a Prefix kept by a component
// serves concurrent queries.
func (r Prefix) Args(args ...any) []any {
	return append(r[:len(r):len(r)], args...)
}
