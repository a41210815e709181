package once

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
)

// Claim is the dedupe record of one applied message.
type Claim struct {
	Consumer      string
	Key           string
	PayloadSHA256 []byte
	ProcessedAt   time.Time
	// OccurredOn is the partition day for claims made with PartitionByDay (zero otherwise).
	OccurredOn time.Time
}

// LookupClaim answers "was message key processed by consumer, and when?" from the claims in
// schema ("" means pgtx.DefaultSchema), in both the plain and the day-partitioned table.
// found=false means no claim exists: the message was never applied, or its claim was deleted
// by retention.
func LookupClaim(ctx context.Context, db *sql.DB, schema, consumer, key string) (c Claim, found bool, err error) {
	pm, daily, err := claimTables("lookup claim", db, &schema)
	if err != nil {
		return Claim{}, false, err
	}
	// A name or key PostgreSQL text cannot hold was never claimed; say so rather than let the
	// server refuse the query with an encoding error.
	if err := setup.CheckText("consumer", consumer); err != nil {
		return Claim{}, false, fmt.Errorf("once: lookup claim: %w", err)
	}
	if err := setup.CheckText("key", key); err != nil {
		return Claim{}, false, fmt.Errorf("once: lookup claim: %w: %w", wmonce.ErrInvalidKey, err)
	}
	c = Claim{Consumer: consumer, Key: key}
	err = db.QueryRowContext(ctx, `SELECT payload_sha256, processed_at FROM `+pm+
		` WHERE consumer = $1 AND message_id = $2`, consumer, key).Scan(&c.PayloadSHA256, &c.ProcessedAt)
	if err == nil {
		return c, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Claim{}, false, fmt.Errorf("once: lookup claim: %w", err)
	}
	err = db.QueryRowContext(ctx, `SELECT payload_sha256, processed_at, occurred_on FROM `+daily+
		` WHERE consumer = $1 AND message_id = $2 ORDER BY occurred_on DESC LIMIT 1`, consumer, key).Scan(&c.PayloadSHA256, &c.ProcessedAt, &c.OccurredOn)
	if errors.Is(err, sql.ErrNoRows) {
		return Claim{}, false, nil
	}
	if err != nil {
		return Claim{}, false, fmt.Errorf("once: lookup claim: %w", err)
	}
	return c, true, nil
}
