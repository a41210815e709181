package httpidem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestStoredKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	ctx := context.Background()
	st, err := httpidem.StoredKeys(ctx, e.db, e.schema)
	require.NoError(t, err)
	require.Equal(t, httpidem.KeyStats{}, st, "empty table")

	e.post("k-1", `{"amount":1}`)
	e.post("k-2", `{"amount":2}`)
	e.post("k-2", `{"amount":2}`) // a replay stores nothing
	pgtest.Exec(t, e.db, `UPDATE `+e.table("http_idempotency_keys")+` SET created_at = now() - interval '2 hours' WHERE idem_key = 'k-1'`)
	st, err = httpidem.StoredKeys(ctx, e.db, e.schema)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Estimated, "exact count while the table has no statistics")
	require.InDelta(t, (2 * time.Hour).Seconds(), st.OldestAge.Seconds(), 60)

	// With statistics, the planner's figure (exact right after ANALYZE).
	pgtest.Exec(t, e.db, `ANALYZE `+e.table("http_idempotency_keys"))
	st, err = httpidem.StoredKeys(ctx, e.db, e.schema)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Estimated)

	_, err = httpidem.StoredKeys(ctx, e.db, "no_such_schema_here")
	require.Error(t, err)
	_, err = httpidem.StoredKeys(ctx, e.db, `bad"name`)
	require.ErrorContains(t, err, "schema")
	_, err = httpidem.StoredKeys(ctx, nil, e.schema)
	require.ErrorContains(t, err, "db is nil")
}

// Prune is the one delete of the table, shared by Middleware.Prune and the
// retention janitor: it removes keys at least olderThan old, in batches, and nothing younger.
func TestDeleteExpiredInBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	ctx := context.Background()
	for _, k := range []string{"k-1", "k-2", "k-3", "k-4"} {
		e.post(k, `{"amount":1}`)
	}
	pgtest.Exec(t, e.db, `UPDATE `+e.table("http_idempotency_keys")+` SET created_at = now() - interval '3 hours' WHERE idem_key <> 'k-4'`)

	n, err := httpidem.Prune(ctx, e.db, e.schema, pgtx.PruneRequest{Keep: 2 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "over two batches")
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")+` WHERE idem_key = 'k-4'`))
	n, err = httpidem.Prune(ctx, e.db, e.schema, pgtx.PruneRequest{Keep: 2 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = httpidem.Prune(ctx, e.db, e.schema, pgtx.PruneRequest{Keep: time.Hour, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize must be positive")
	_, err = httpidem.Prune(ctx, e.db, `bad"name`, pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.ErrorContains(t, err, "schema")
	_, err = httpidem.Prune(ctx, nil, e.schema, pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.ErrorContains(t, err, "db is nil")
}
