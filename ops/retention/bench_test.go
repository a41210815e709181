package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/pgtx"
)

// sizingRows is how many claims the sizing benchmarks write: enough for per-row figures to be
// stable (page and index overheads amortised), small enough for a laptop.
const sizingRows = 100_000

// BenchmarkClaimSize measures the disk space of one claim in processed_messages (heap, primary
// key and the retention index) with 36-character UUID keys, a 15-character consumer name and
// distinct processed_at times (equal ones would let B-tree deduplication shrink the index), then
// how fast the janitor deletes them in its default batches. Run with
//
//	go test -run '^$' -bench 'ClaimSize' -benchtime 1x ./ops/retention/
func BenchmarkClaimSize(b *testing.B) {
	db := pgtest.DB(b)
	ctx := context.Background()
	for range b.N {
		schema := pgtest.Schema(b, db)
		pm := pgtx.QualifiedName(schema, "processed_messages")
		size := func() (table, indexes int64) {
			pgtest.Exec(b, db, `VACUUM ANALYZE `+pm)
			require.NoError(b, db.QueryRow(`SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`, pm).Scan(&table, &indexes))
			return table, indexes
		}
		t0, i0 := size()
		pgtest.Exec(b, db, `INSERT INTO `+pm+` (consumer, message_id, payload_sha256, processed_at)
SELECT 'payments-ledger', gen_random_uuid()::text, sha256(g::text::bytea), now() - interval '30 days' + g * interval '1 millisecond'
FROM generate_series(1, $1::int) g`, sizingRows)
		t1, i1 := size()
		b.ReportMetric(float64(t1-t0)/sizingRows, "heap-bytes/claim")
		b.ReportMetric(float64(i1-i0)/sizingRows, "index-bytes/claim")
		b.ReportMetric(float64(t1-t0+i1-i0)/sizingRows, "bytes/claim")

		j, err := retention.NewJanitor(db, retention.Config{Schema: schema}, nil)
		require.NoError(b, err)
		start := time.Now()
		rep, err := j.RunOnce(ctx)
		require.NoError(b, err)
		require.Equal(b, int64(sizingRows), rep.Claims)
		b.ReportMetric(float64(sizingRows)/time.Since(start).Seconds(), "deleted-claims/s")
	}
}

// BenchmarkDailyClaimSize is BenchmarkClaimSize for the day-partitioned table: one partition
// holding the claims, dropped whole by the janitor.
func BenchmarkDailyClaimSize(b *testing.B) {
	db := pgtest.DB(b)
	ctx := context.Background()
	for range b.N {
		schema := pgtest.Schema(b, db)
		old := partition.Day(time.Now().AddDate(0, 0, -30))
		require.NoError(b, partition.Ensure(ctx, db, schema, old, old))
		part := pgtx.QualifiedName(schema, partition.Name(old))
		size := func() int64 {
			pgtest.Exec(b, db, `VACUUM ANALYZE `+part)
			var n int64
			require.NoError(b, db.QueryRow(`SELECT pg_total_relation_size($1::regclass)`, part).Scan(&n))
			return n
		}
		s0 := size()
		pgtest.Exec(b, db, `INSERT INTO `+pgtx.QualifiedName(schema, partition.Parent)+` (consumer, message_id, occurred_on, payload_sha256)
SELECT 'payments-ledger', gen_random_uuid()::text, $2::date, sha256(g::text::bytea)
FROM generate_series(1, $1::int) g`, sizingRows, old)
		b.ReportMetric(float64(size()-s0)/sizingRows, "bytes/claim")

		j, err := retention.NewJanitor(db, retention.Config{Schema: schema, PartitionsAhead: -1}, nil)
		require.NoError(b, err)
		start := time.Now()
		rep, err := j.RunOnce(ctx)
		require.NoError(b, err)
		require.Equal(b, int64(1), rep.DailyPartitionsDropped)
		b.ReportMetric(time.Since(start).Seconds()*1000, "ms/drop-100k-claims")
	}
}
