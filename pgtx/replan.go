package pgtx

import (
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ReplanArgs returns the arguments to put before a query's own so that PostgreSQL plans it
// for each execution, with the table sizes of that moment: on a pool of pgx's database/sql
// driver, pgx.QueryExecModeExec (an unnamed statement, still one round trip). pgx otherwise
// prepares every query once per connection, and PostgreSQL keeps the generic plan it chose
// after five executions until an ANALYZE of the table invalidates it. For a table that was
// empty when that happened (a new deployment, after a TRUNCATE) the plan is a sequential
// scan, and it stays one while the table grows to tens of thousands of rows until
// autovacuum's next ANALYZE: the relay's read of a round cost 5-7 ms instead of 0.1-0.3.
// Use it for the few statements that run often against a table whose size changes fast and
// whose plan depends on it; planning costs some 0.2 ms of server CPU each time. nil for other
// drivers (lib/pq sends unnamed statements already).
func ReplanArgs(db *sql.DB) Replan {
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
