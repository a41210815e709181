package intent

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// PruneSent deletes the SENT intents in schema ("" means pgtx.DefaultSchema) that the provider
// confirmed longer than keep ago by the database clock, in batches of at most batchSize rows,
// and returns how many it deleted, also when it stops on an error or a cancelled ctx. PENDING,
// SENDING, FAILED and SKIPPED intents are never deleted: they are work or need attention.
//
// A deleted intent no longer deduplicates: recording the same channel and key again creates a
// new intent, which is sent again. Keep SENT intents at least as long as the claims of the
// consumers that record them (retention.Config Keep), so that a redelivered message is refused
// by its claim before its handler could record the intent again. The retention janitor calls
// it when retention.Config.SentIntentsKeep is set.
func PruneSent(ctx context.Context, db *sql.DB, schema string, keep time.Duration, batchSize int) (int64, error) {
	schema, err := pgtx.CheckPrune(db, schema, keep, batchSize)
	if err != nil {
		return 0, fmt.Errorf("intent: prune sent: %w", err)
	}
	t := pgtx.QualifiedName(schema, "intents")
	n, err := pgtx.DeleteInBatches(ctx, db, batchSize, `DELETE FROM `+t+` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM `+t+` WHERE status = 'SENT' AND sent_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2 FOR UPDATE SKIP LOCKED))`, keep.Microseconds())
	if err != nil {
		return n, fmt.Errorf("intent: prune sent: %w", err)
	}
	return n, nil
}
