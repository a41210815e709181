package restore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/outbox"
)

// checkOutbox returns the outbox's position check (outbox.CheckPositions).
func checkOutbox(ctx context.Context, t *testing.T, db *sql.DB, schema string) error {
	t.Helper()
	r, err := outbox.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	return r.Err()
}

// rebaseOutbox rebases the outbox's positions, as `wmonce rebase` does.
func rebaseOutbox(ctx context.Context, t *testing.T, db *sql.DB, schema string) {
	t.Helper()
	r, err := outbox.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	t.Logf("rebase of the outbox positions: %+v", r)
}
