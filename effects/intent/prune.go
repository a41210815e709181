package intent

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// PruneSent deletes the SENT intents confirmed before req's cutoff (pgtx.PruneRequest), never
// others. A deleted intent no longer deduplicates: keep SENT intents at least as long as the
// claims of the consumers that record them. The janitor calls it (SentIntentsKeep).
func PruneSent(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	n, err := owner.PruneOlder(ctx, db, schema, req, "intents", "sent_at", false, `status = 'SENT'`)
	if err != nil {
		return n, fmt.Errorf("intent: prune sent: %w", err)
	}
	return n, nil
}
