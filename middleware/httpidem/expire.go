package httpidem

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// Prune deletes the stored responses in schema's http_idempotency_keys that are at
// least olderThan old by the database clock, in batches of at most batchSize rows (one short
// transaction each), and returns how many it deleted, also when it stops on an error or a
// cancelled ctx. It is the one delete of that table: Middleware.Prune and the
// retention janitor (retention.Config.HTTPKeysKeep) both call it.
//
// Lookups ignore responses older than Config.Retention anyway, so deleting bounds the table's
// size, not correctness; pass an olderThan below Retention and retries inside Retention run
// again as new requests.
func Prune(ctx context.Context, db *sql.DB, schema string, olderThan time.Duration, batchSize int) (int64, error) {
	schema, err := pgtx.CheckPrune(db, schema, olderThan, batchSize)
	if err != nil {
		return 0, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	t := pgtx.QualifiedName(schema, "http_idempotency_keys")
	// A key is live while created_at > now() - Retention (the lookup), so "<=" is exactly the
	// expired ones. ctid = ANY(ARRAY(...)) deletes the batch by physical address (a TID scan).
	query := `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + t + ` WHERE created_at <= now() - $1::bigint * interval '1 microsecond' LIMIT $2))`
	n, err := pgtx.DeleteInBatches(ctx, db, batchSize, query, olderThan.Microseconds())
	if err != nil {
		return n, fmt.Errorf("httpidem: delete expired keys: %w", err)
	}
	return n, nil
}
