package intent

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// PruneSent deletes the SENT intents in schema ("" means pgtx.DefaultSchema) that the provider
// confirmed before req's cutoff (Before, or Keep ago by the database clock), in batches of at
// most req.BatchSize rows,
// and returns how many it deleted, also when it stops on an error or a cancelled ctx. PENDING,
// SENDING, FAILED and SKIPPED intents are never deleted: they are work or need attention.
//
// A deleted intent no longer deduplicates: recording the same channel and key again creates a
// new intent, which is sent again. Keep SENT intents at least as long as the claims of the
// consumers that record them (retention.Config Keep), so that a redelivered message is refused
// by its claim before its handler could record the intent again. The retention janitor calls
// it when retention.Config.SentIntentsKeep is set.
func PruneSent(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	n, err := owner.PruneOlder(ctx, db, schema, req, "intents", "sent_at", false, `status = 'SENT'`)
	if err != nil {
		return n, fmt.Errorf("intent: prune sent: %w", err)
	}
	return n, nil
}
