package httpidem

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// Prune deletes the stored responses created at or before req's cutoff (pgtx.PruneRequest):
// the table's one delete. A Keep below Config.Retention lets retries inside it run again.
func Prune(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	// A key is live while created_at > now() - Retention (the lookup), so "<=" is exactly the
	// expired ones.
	n, err := owner.PruneOlder(ctx, db, schema, req, "http_idempotency_keys", "created_at", true, "")
	if err != nil {
		return n, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	return n, nil
}
