package once

import (
	"context"
	"database/sql"
	"time"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/pgtx"
)

// The retention operations on the claim tables, for a service that runs its own scheduler
// instead of ops/retention's janitor; the SQL is in internal/claims, which with this package
// owns the tables.

// PruneClaims deletes the claims of req.Consumer (required) in processed_messages applied
// (processed_at) before req's cutoff (Before, or Keep ago by the database clock), in batches of
// at most req.BatchSize rows (one short transaction each), and returns how many it deleted,
// also when it stops on an error or a cancelled ctx.
//
// A deleted claim no longer deduplicates: a copy of its message arriving later is applied
// again unless the age guard (Config.MaxMessageAge) refuses it. Keep claims for longer than
// any redelivery can come.
func PruneClaims(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	return claims.Prune(ctx, db, schema, req, false)
}

// PruneDailyClaims deletes row by row the claims in processed_messages_daily of req.Consumer
// ("": every consumer) applied before req's cutoff, in batches like PruneClaims. It is for
// operators purging by hand; routine retention drops whole days (MaintainDays), which costs
// no row deletes. A schema without the table (older than migration 004) has nothing to delete.
func PruneDailyClaims(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	return claims.Prune(ctx, db, schema, req, true)
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
