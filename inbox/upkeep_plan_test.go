package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// The lease upkeep (the reaper, the renewal) finds its rows with a subquery that runs once per
// statement, whatever plan PostgreSQL made for it. Joined to the table as a subquery, it ran
// again for every row of the table under a plan cached while the inbox was empty: one reap of a
// 50,000-row inbox took 397 s, one renewal 3.6 s.
func TestLeaseUpkeepFindsItsRowsOnceInEveryPlanMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	conn, err := e.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := conn.ExecContext(ctx, q, args...)
		require.NoError(t, err)
	}

	// Plans made on the empty inbox, cached in the prepared statements.
	exec(`ANALYZE ` + e.table("inbox"))
	reap, renew := inbox.UpkeepSQL(e.schema)
	exec(`PREPARE reap(text, int) AS ` + reap)
	exec(`PREPARE renew(bigint[], bigint[], bigint) AS ` + renew)
	exec(`SET plan_cache_mode = force_generic_plan`)
	exec(`EXPLAIN EXECUTE reap('c', 5)`)
	exec(`EXPLAIN EXECUTE renew('{1}', '{1}', 5)`)

	// 2,000 rows, every 20th claimed: half of those with their lease run out.
	pgtest.Exec(t, e.db, `INSERT INTO `+e.table("inbox")+` (consumer, message_id, message_uuid, topic, payload, metadata, status, claim_token, lease_until)
SELECT 'c', 'm' || g, 'u' || g, 't', '\x00', '{}',
    CASE WHEN g % 20 = 0 THEN 'IN_PROGRESS' ELSE 'PENDING' END,
    CASE WHEN g % 20 = 0 THEN g END,
    CASE WHEN g % 20 = 0 THEN now() + CASE WHEN g % 40 = 0 THEN interval '-1 minute' ELSE interval '1 hour' END END
FROM generate_series(1, 2000) g`)
	var ids, tokens string
	require.NoError(t, e.db.QueryRowContext(ctx, `SELECT array_agg(id ORDER BY id)::text, array_agg(claim_token ORDER BY id)::text
FROM `+e.table("inbox")+` WHERE status = 'IN_PROGRESS'`).Scan(&ids, &tokens))

	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		exec(`SET plan_cache_mode = ` + mode)
		for name, stmt := range map[string]string{
			"reap":  `EXECUTE reap('c', 5)`,
			"renew": `EXECUTE renew('` + ids + `', '` + tokens + `', 5)`,
		} {
			plan := explainAnalyzeRolledBack(t, conn, stmt)
			var locks int
			walkPlan(plan, func(n planNode) {
				if n.NodeType == "LockRows" {
					locks++
					require.Equal(t, 1, n.ActualLoops, "%s, %s: the rows to change were looked for more than once", mode, name)
				}
			})
			require.Equal(t, 1, locks, "%s, %s: one locking subquery", mode, name)
		}
	}
	exec(`RESET plan_cache_mode; DEALLOCATE reap; DEALLOCATE renew`)
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType    string     `json:"Node Type"`
	ActualLoops int        `json:"Actual Loops"`
	Plans       []planNode `json:"Plans"`
}

func walkPlan(n planNode, visit func(planNode)) {
	visit(n)
	for _, c := range n.Plans {
		walkPlan(c, visit)
	}
}

// explainAnalyzeRolledBack runs stmt under EXPLAIN ANALYZE in a transaction it rolls back,
// and returns the root of its plan.
func explainAnalyzeRolledBack(t *testing.T, conn *sql.Conn, stmt string) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var out string
	require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+stmt).Scan(&out))
	var plans []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal([]byte(out), &plans))
	return plans[0].Plan
}
