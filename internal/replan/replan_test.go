package replan_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/replan"
	"github.com/wmonce/watermill-once/pgtx"
)

// A query run with replan.For is never prepared on the connection, so PostgreSQL has no
// cached plan to reuse for it; the same query without them is, and after five executions
// PostgreSQL runs its generic plan.
func TestForKeepsAQueryOutOfThePlanCache(t *testing.T) {
	t.Parallel()
	pgtest.SkipShort(t)
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 1})
	require.NoError(t, err, "this test needs PostgreSQL: start it (make services) or set DATABASE_URL")
	t.Cleanup(func() { _ = db.Close() })
	table := pgtx.QualifiedName(pgtest.Schema(t, db), "t")
	pgtest.Exec(t, db, `CREATE TABLE `+table+` (k bigint PRIMARY KEY)`)
	prefix := replan.For(db)
	require.NotEmpty(t, prefix, "a pool from pgtx.Open uses pgx's driver")

	cached := `SELECT count(*) FROM ` + table + ` WHERE k = $1`
	fresh := cached + ` /* fresh */`
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	for range 8 {
		var n int
		require.NoError(t, conn.QueryRowContext(ctx, cached, int64(1)).Scan(&n))
		require.NoError(t, conn.QueryRowContext(ctx, fresh, prefix.Args(int64(1))...).Scan(&n))
	}
	plans := func(query string) (prepared bool, generic int64) {
		t.Helper()
		err := conn.QueryRowContext(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1`, query).Scan(&generic)
		if err == sql.ErrNoRows {
			return false, 0
		}
		require.NoError(t, err)
		return true, generic
	}
	prepared, generic := plans(cached)
	require.True(t, prepared, "pgx prepares a query on the connection by default")
	require.Positive(t, generic, "after five executions PostgreSQL reuses the generic plan")
	prepared, _ = plans(fresh)
	require.False(t, prepared, "with replan.For the query is planned at each execution, never prepared")

	require.Nil(t, replan.For(nil))
	require.Equal(t, []any{int64(1)}, replan.For(nil).Args(int64(1)))
	// Args never writes into the Prefix it is called on: concurrent callers share one.
	a, b := prefix.Args(int64(1)), prefix.Args(int64(2))
	require.Equal(t, int64(1), a[len(a)-1])
	require.Equal(t, int64(2), b[len(b)-1])
}
