package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
	table := pgtx.QualifiedName(schema, "outbox")
	// 20,000 rows of 20,000 transactions (IDs below any real one, so every row is committed).
	pgtest.Exec(t, db, `INSERT INTO `+table+` (uuid, payload, metadata, transaction_id)
SELECT 'm' || g, '{}', '{}', (g::text)::xid8 FROM generate_series(1000, 20999) g`)
	pgtest.Exec(t, db, `ANALYZE `+table)

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
