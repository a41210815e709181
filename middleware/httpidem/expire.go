package httpidem

import (
	"context"
	"database/sql"
	"fmt"

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
	schema, req, cutoff, err := pgtx.CheckPrune(ctx, db, schema, req, pgtx.Unscoped)
	if err != nil {
		return 0, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	t := pgtx.QualifiedName(schema, "http_idempotency_keys")
	// A key is live while created_at > now() - Retention (the lookup), so "<=" is exactly the
	// expired ones. ctid = ANY(ARRAY(...)) deletes the batch by physical address (a TID scan).
	query := `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + t + ` WHERE created_at <= $1::timestamptz LIMIT $2))`
	n, err := pgtx.DeleteInBatches(ctx, db, req.BatchSize, query, cutoff)
	if err != nil {
		return n, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	return n, nil
}
