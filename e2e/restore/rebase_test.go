package restore_test

import (
	"context"
	"database/sql"
	"testing"
)

// rebaseOutbox rebases the outbox's positions (engineer restore's part; wired at merge).
func rebaseOutbox(ctx context.Context, t *testing.T, db *sql.DB, schema string) {
	t.Helper()
}
