package intent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// A claim reads the PENDING intents in id order from their own index (migration 016), not by
// walking the primary key past every SENT intent still retained: with 19,000 sent and 1,000
// pending it filtered 19,000 rows a claim, and the walk grows with retention.
func TestSenderClaimsWithoutWalkingPastSentIntents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	table := pgtx.QualifiedName(e.schema, "intents")
	pgtest.Exec(t, e.db, `INSERT INTO `+table+` (channel, intent_key, consumer, event_id, step, payload)
SELECT 'sms', 'k' || g, 'c', 'e' || g, 's', '\x00'::bytea FROM generate_series(1, 20000) g`)
	// Statistics taken while every intent was PENDING, as after a burst; then most are sent.
	pgtest.Exec(t, e.db, `ANALYZE `+table)
	pgtest.Exec(t, e.db, `UPDATE `+table+` SET status = 'SENT', sent_at = now() WHERE id <= (SELECT min(id) + 18999 FROM `+table+`)`)

	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var plan strings.Builder
	rows, err := tx.QueryContext(ctx, `EXPLAIN (ANALYZE, FORMAT TEXT) `+intent.ClaimPendingSQL(e.schema), []string{"sms"}, int64(60_000_000))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "intents_pending_id_idx", "the claim reads the PENDING rows' index:\n%s", plan.String())
	require.NotContains(t, plan.String(), "Rows Removed by Filter: 19000", "the claim walked past the sent intents:\n%s", plan.String())
}
