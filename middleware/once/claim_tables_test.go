package once_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// claimsFixture stores claims applied at chosen times. In processed_messages, consumer "a" has
// 5 claims two days old and 1 new one, consumer "b" 2 claims two days old; in
// processed_messages_daily, "a" has 3 claims two days old and "b" 1 new one.
func claimsFixture(t *testing.T) (db *sql.DB, schema string, old time.Time) {
	t.Helper()
	db = pgtest.DB(t)
	schema = pgtest.Schema(t, db)
	pm := pgtx.QualifiedName(schema, "processed_messages")
	daily := pgtx.QualifiedName(schema, partition.Parent)
	require.NoError(t, db.QueryRow(`SELECT now() - interval '2 days'`).Scan(&old))
	pgtest.Exec(t, db, `INSERT INTO `+pm+` (consumer, message_id, payload_sha256, processed_at)
SELECT 'a', 'old-' || g, '\x00', $1 FROM generate_series(1, 5) g`, old)
	pgtest.Exec(t, db, `INSERT INTO `+pm+` (consumer, message_id, payload_sha256) VALUES ('a', 'new', '\x00')`)
	pgtest.Exec(t, db, `INSERT INTO `+pm+` (consumer, message_id, payload_sha256, processed_at)
SELECT 'b', 'old-' || g, '\x00', $1 FROM generate_series(1, 2) g`, old)
	today := partition.Day(time.Now())
	require.NoError(t, partition.Ensure(context.Background(), db, schema, today.AddDate(0, 0, -3), today.AddDate(0, 0, 1)))
	pgtest.Exec(t, db, `INSERT INTO `+daily+` (consumer, message_id, occurred_on, payload_sha256, processed_at)
SELECT 'a', 'd-' || g, $1::date, '\x00', $2 FROM generate_series(1, 3) g`, today.AddDate(0, 0, -2), old)
	pgtest.Exec(t, db, `INSERT INTO `+daily+` (consumer, message_id, occurred_on, payload_sha256) VALUES ('b', 'd-new', $1::date, '\x00')`, today)
	return db, schema, old
}

func TestPruneAndCountClaims(t *testing.T) {
	t.Parallel()
	db, schema, old := claimsFixture(t)
	ctx := context.Background()
	cutoff := old.Add(time.Hour)

	consumers, err := claims.ClaimConsumers(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, consumers)

	n, err := claims.CountClaims(ctx, db, schema, "a", cutoff)
	require.NoError(t, err)
	require.Equal(t, int64(5+3), n, "both tables")
	n, err = claims.CountClaims(ctx, db, schema, "", cutoff)
	require.NoError(t, err)
	require.Equal(t, int64(5+2+3), n)

	n, err = once.PruneClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: "a", Before: cutoff, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "over three batches, the new claim kept")
	n, err = claims.CountClaims(ctx, db, schema, "", cutoff)
	require.NoError(t, err)
	require.Equal(t, int64(2+3), n, "b's claims and the daily table untouched")
	require.Equal(t, 3, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))

	n, err = once.PruneDailyClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: "", Before: cutoff, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, partition.Parent)), "the new daily claim kept")

	_, err = once.PruneClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: "", Before: cutoff, BatchSize: 2})
	require.ErrorContains(t, err, "Consumer is required")
	_, err = once.PruneClaims(ctx, db, schema, pgtx.PruneRequest{Consumer: "a", Before: cutoff, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize must be positive")
	_, err = claims.ClaimConsumers(ctx, db, `bad"schema`)
	require.Error(t, err)
	_, err = claims.ClaimConsumers(ctx, db, "no_such_schema_here")
	require.True(t, pgtx.IsUndefinedTable(err), "%v", err)
}

func TestClaimStatsAndHistory(t *testing.T) {
	t.Parallel()
	db, schema, old := claimsFixture(t)
	ctx := context.Background()

	stats, err := claims.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, int64(6+3), stats["a"].Claims)
	require.Equal(t, int64(2+1), stats["b"].Claims)
	require.True(t, stats["a"].NewestClaim.After(old), "a's newest claim is the new one")
	require.WithinDuration(t, time.Now(), stats["b"].NewestClaim, time.Hour, "b's newest is in the daily table")

	// Buckets of one day starting 3 days ago: the old claims fall in bucket 1, the new in 3.
	start := old.Add(-24 * time.Hour)
	hist, err := claims.ClaimHistory(ctx, db, schema, "", start, 24*time.Hour, 4)
	require.NoError(t, err)
	require.Equal(t, []int64{0, 5 + 3, 0, 1}, hist["a"])
	require.Equal(t, []int64{0, 2, 0, 1}, hist["b"])
	hist, err = claims.ClaimHistory(ctx, db, schema, "b", start, 24*time.Hour, 4)
	require.NoError(t, err)
	require.Len(t, hist, 1)
	_, err = claims.ClaimHistory(ctx, db, schema, "", start, 0, 4)
	require.ErrorContains(t, err, "width must be positive")

	_, err = claims.Stats(ctx, db, "no_such_schema_here")
	require.True(t, pgtx.IsUndefinedTable(err), "not migrated is an error, not an empty map: %v", err)
}

func TestMaintainDaysDropsExpiredDaysAndCreatesAhead(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	today := partition.Day(time.Now())

	rep, err := once.MaintainDays(ctx, db, schema, today, today, 2)
	require.NoError(t, err)
	require.Equal(t, once.DaysReport{}, rep, "the table is not in use: nothing created")

	require.NoError(t, partition.Ensure(ctx, db, schema, today.AddDate(0, 0, -4), today.AddDate(0, 0, -1)))
	rep, err = once.MaintainDays(ctx, db, schema, today.AddDate(0, 0, -2), today, 2)
	require.NoError(t, err)
	require.Equal(t, []time.Time{today.AddDate(0, 0, -4), today.AddDate(0, 0, -3)}, rep.Dropped)
	require.Equal(t, 3, rep.Created, "today and two days ahead")
	days, err := partition.List(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, []time.Time{today.AddDate(0, 0, -2), today.AddDate(0, 0, -1), today, today.AddDate(0, 0, 1), today.AddDate(0, 0, 2)}, days)

	rep, err = once.MaintainDays(ctx, db, schema, today.AddDate(0, 0, -2), today, -1)
	require.NoError(t, err)
	require.Equal(t, once.DaysReport{}, rep, "nothing more to drop, nothing created with ahead < 0")
}
