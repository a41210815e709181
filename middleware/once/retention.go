package once

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/pgtx"
)

// The operations on the claim tables a user calls: look a claim up, read the claims per
// consumer, and the retention operations for a service that runs its own scheduler instead of
// ops/retention's janitor. The SQL is in internal/claims, which with this package owns the
// tables.

// Claim is the dedupe record of one applied message.
type Claim = claims.Claim

// LookupClaim answers "was message key processed by consumer, and when?" from the claims in
// schema ("" means pgtx.DefaultSchema), in both the plain and the day-partitioned table.
// found=false means no claim exists: the message was never applied, or its claim was deleted
// by retention.
func LookupClaim(ctx context.Context, db *sql.DB, schema, consumer, key string) (c Claim, found bool, err error) {
	return claims.LookupClaim(ctx, db, schema, consumer, key)
}

// ClaimStats are one consumer's claims in the database.
type ClaimStats = claims.ClaimStats

// Stats returns ClaimStats for every consumer with claims in schema. It scans the claim
// tables: on tables of many millions of rows this takes seconds, so bound ctx with a deadline.
// A schema without processed_messages (not migrated) is an error for which
// pgtx.IsUndefinedTable is true, not an empty map.
func Stats(ctx context.Context, db *sql.DB, schema string) (map[string]ClaimStats, error) {
	return claims.Stats(ctx, db, schema)
}

// PruneClaims deletes the claims of req.Consumer (required) in processed_messages applied
// (processed_at) before req's cutoff (Before, or Keep ago by the database clock), in batches of
// at most req.BatchSize rows (one short transaction each), and returns how many it deleted,
// also when it stops on an error or a cancelled ctx.
//
// A deleted claim no longer deduplicates: a copy of its message arriving later is applied
// again unless the age guard (Config.MaxMessageAge) refuses it. Keep claims for longer than
// any redelivery can come.
func PruneClaims(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	return prune(ctx, db, schema, req, false)
}

// PruneDailyClaims deletes row by row the claims in processed_messages_daily of req.Consumer
// ("": every consumer) applied before req's cutoff, in batches like PruneClaims. It is for
// operators purging by hand; routine retention drops whole days (MaintainDays), which costs
// no row deletes. A schema without the table (older than migration 004) has nothing to delete.
func PruneDailyClaims(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	return prune(ctx, db, schema, req, true)
}

// DaysReport says what MaintainDays changed in processed_messages_daily.
type DaysReport = claims.DaysReport

// MaintainDays keeps the day partitions of processed_messages_daily (Config.PartitionByDay): it
// drops every day that ended before dropBefore's day, then, unless ahead is negative, creates the
// partitions from today's day through ahead days later, so that claims never wait for a
// partition to be created. It does nothing while the table has no partition. The report counts
// what was done before an error too. A day goes as a whole, with every consumer's claims of that
// day, so pass the cut-off of the consumer that keeps claims longest. Concurrent calls on one
// schema are serialised; claims keep flowing meanwhile (DETACH CONCURRENTLY).
func MaintainDays(ctx context.Context, db *sql.DB, schema string, dropBefore, today time.Time, ahead int) (DaysReport, error) {
	return claims.MaintainDays(ctx, db, schema, dropBefore, today, ahead)
}

// prune deletes claims in batches: PruneClaims, or PruneDailyClaims with daily. The deletes
// are the owner's (ARCHITECTURE.md): internal/claims only reads these tables.
func prune(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest, daily bool) (int64, error) {
	op, scope := "prune claims", owner.PerConsumer
	if daily {
		op, scope = "prune daily claims", owner.AnyConsumer
	}
	plainTable, dailyTable, err := claims.Tables(op, db, &schema)
	if err != nil {
		return 0, err
	}
	_, req, before, err := owner.CheckPrune(ctx, db, schema, req, scope)
	if err != nil {
		return 0, fmt.Errorf("once: %s: %w", op, err)
	}
	// ctid = ANY(ARRAY(...)) makes a TID scan: the batch is located once through the
	// (consumer, processed_at) index and deleted by physical address.
	query := `DELETE FROM ` + plainTable + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + plainTable + ` WHERE consumer = $1 AND processed_at < $2 LIMIT $3))`
	if daily {
		if ok, err := claims.HasDaily(ctx, db, dailyTable); err != nil || !ok {
			return 0, claims.WrapErr(op, err)
		}
		// The table is partitioned: ctid is not unique across partitions, so rows are
		// addressed by their primary key.
		query = `DELETE FROM ` + dailyTable + ` WHERE (consumer, message_id, occurred_on) IN (
    SELECT consumer, message_id, occurred_on FROM ` + dailyTable + ` WHERE ($1 = '' OR consumer = $1) AND processed_at < $2 LIMIT $3)`
	}
	n, err := pgtx.DeleteInBatches(ctx, db, req.BatchSize, query, req.Consumer, before)
	if err != nil && !daily {
		return n, fmt.Errorf("once: prune claims of %q: %w", req.Consumer, err)
	}
	return n, claims.WrapErr(op, err)
}
