package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The read of a round looks its rows up by primary key, whatever plan PostgreSQL makes for
// it: with a custom plan for a batch of BatchSize rows it joined the batch to a scan of the
// whole outbox (3-4 ms a round at 40,000 rows, instead of 0.1-0.2).
func TestRelayReadsARoundByIndexInEveryPlanMode(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	ctx := context.Background()
	fillOutbox(t, db, schema, `'{}'`)

	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `PREPARE read_round(text, int, text) AS `+outbox.ReadRoundSQL(schema))
	require.NoError(t, err)
	// The previous round saw up to 20,995 with 20,992 in progress: this one reads the last rows.
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err = conn.ExecContext(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		var plan string
		require.NoError(t, conn.QueryRowContext(ctx, `EXPLAIN (FORMAT JSON) EXECUTE read_round('20990:20995:20992', 101, '')`).Scan(&plan))
		require.NotContains(t, strings.ReplaceAll(plan, " ", ""), `"NodeType":"SeqScan"`, "%s: a round must not scan the outbox", mode)
	}
	_, err = conn.ExecContext(ctx, `RESET plan_cache_mode; DEALLOCATE read_round`)
	require.NoError(t, err)
}

// The failure groups of parked messages read them through the partial index of parked rows
// (outbox_parked_idx), never by a scan of the whole outbox, now that the grouping statement
// is shared by three kinds of failure (internal/failgroup) and takes the parked rows as a
// subquery.
func TestParkedGroupsReadTheNewestThroughTheParkedIndex(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	ctx := context.Background()
	// 200 parked copies among the 20,000 rows.
	fillOutbox(t, db, schema, `CASE WHEN g % 100 = 0
    THEN jsonb_build_object('reason_poisoned', 'boom ' || (g % 3), 'handler_poisoned', 'h', 'topic_poisoned', 't') ELSE '{}' END`)

	var plan string
	require.NoError(t, db.QueryRowContext(ctx, `EXPLAIN (FORMAT JSON) `+outbox.ParkedGroupsSQL(schema, 50)).Scan(&plan))
	var parsed []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal([]byte(plan), &parsed))
	var indexes []string
	var walk func(n planNode)
	walk = func(n planNode) {
		require.False(t, n.NodeType == "Seq Scan" && n.RelationName == "outbox", "the outbox is scanned whole:\n%s", plan)
		if n.IndexName != "" {
			indexes = append(indexes, n.IndexName)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(parsed[0].Plan)
	require.Contains(t, indexes, "outbox_parked_idx", plan)

	groups, left, err := outboxops.ParkedGroups(ctx, db, schema, 50)
	require.NoError(t, err)
	require.EqualValues(t, 150, left, "200 parked, the newest 50 grouped")
	var rows int64
	for _, g := range groups {
		rows += g.Rows
	}
	require.EqualValues(t, 50, rows)
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

// fillOutbox stores 20,000 rows of 20,000 transactions in schema's outbox (IDs below any real
// one, so every row is committed), with the metadata of the SQL expression metadata over g
// (1000 to 20999), and takes the table's statistics.
func fillOutbox(t *testing.T, db *sql.DB, schema, metadata string) {
	t.Helper()
	table := pgtx.QualifiedName(schema, "outbox")
	pgtest.Exec(t, db, `INSERT INTO `+table+` (uuid, payload, metadata, transaction_id)
SELECT 'm' || g, '{}', `+metadata+`, (g::text)::xid8 FROM generate_series(1000, 20999) g`)
	pgtest.Exec(t, db, `ANALYZE `+table)
}
