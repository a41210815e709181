package httpidem

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// Prune deletes the stored responses in schema's http_idempotency_keys created at or before
// req's cutoff (Before, or Keep ago by the database clock), in batches of at most
// req.BatchSize rows (one short transaction each), and returns how many it deleted, also when it stops on an error or a
// cancelled ctx. It is the one delete of that table: Middleware.Prune and the
// retention janitor (retention.Config.HTTPKeysKeep) both call it.
//
// Lookups ignore responses older than Config.Retention anyway, so deleting bounds the table's
// size, not correctness; pass a Keep below Retention and retries inside Retention run again as
// new requests.
func Prune(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	// A key is live while created_at > now() - Retention (the lookup), so "<=" is exactly the
	// expired ones.
	n, err := owner.PruneOlder(ctx, db, schema, req, "http_idempotency_keys", "created_at", true, "")
	if err != nil {
		return n, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	return n, nil
}
