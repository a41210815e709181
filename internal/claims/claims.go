// Package claims holds the operations on the middleware's claim tables, processed_messages and
// processed_messages_daily, and on duplicates_per_minute, other than the middleware's own
// claims: what retention, admin and the CLI read and delete. With middleware/once it owns these
// tables: no other package holds SQL on them. Each operation takes the schema the middleware
// was configured with ("" means pgtx.DefaultSchema). Errors keep the "once:" prefix: these are
// the middleware's tables, and the exported ones (once.PruneClaims, once.MaintainDays) return
// them.
package claims

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// Tables checks schema ("" becomes pgtx.DefaultSchema) and names the two claim tables in it;
// errors are op's, with the "once:" prefix.
func Tables(op string, db *sql.DB, schema *string) (plain, daily string, err error) {
	if db == nil {
		return "", "", fmt.Errorf("once: %s: db is nil", op)
	}
	if *schema == "" {
		*schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", *schema); err != nil {
		return "", "", fmt.Errorf("once: %s: %w", op, err)
	}
	return pgtx.QualifiedName(*schema, "processed_messages"), pgtx.QualifiedName(*schema, partition.Parent), nil
}

// HasDaily reports whether schema has processed_messages_daily: a schema older than migration
// 004 has none, and all its claims are in processed_messages.
func HasDaily(ctx context.Context, db *sql.DB, daily string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, daily).Scan(&ok)
	return ok, err
}

// ClaimConsumers lists, in name order, the consumers with claims in processed_messages,
// one index probe per consumer (owner.DistinctConsumers), not a scan of the table. Consumers whose
// claims are all in processed_messages_daily are not listed: that table is pruned by whole days
// (MaintainDays).
func ClaimConsumers(ctx context.Context, db *sql.DB, schema string) ([]string, error) {
	pm, _, err := Tables("claim consumers", db, &schema)
	if err != nil {
		return nil, err
	}
	out, err := owner.DistinctConsumers(ctx, db, pm)
	if err != nil {
		return nil, fmt.Errorf("once: claim consumers: %w", err)
	}
	return out, nil
}

// CountClaims counts the claims of consumer ("": every consumer) applied before the given
// time, in processed_messages and processed_messages_daily: what once.PruneClaims and
// once.PruneDailyClaims would delete. It only reads.
func CountClaims(ctx context.Context, db *sql.DB, schema, consumer string, before time.Time) (int64, error) {
	pm, daily, err := Tables("count claims", db, &schema)
	if err != nil {
		return 0, err
	}
	const where = ` WHERE ($1 = '' OR consumer = $1) AND processed_at < $2`
	var n int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+pm+where, consumer, before).Scan(&n); err != nil {
		return 0, fmt.Errorf("once: count claims: %w", err)
	}
	ok, err := HasDaily(ctx, db, daily)
	if err != nil || !ok {
		return n, WrapErr("count claims", err)
	}
	var d int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+daily+where, consumer, before).Scan(&d); err != nil {
		return n, fmt.Errorf("once: count claims: %w", err)
	}
	return n + d, nil
}

// ClaimStats are one consumer's claims in the database.
type ClaimStats struct {
	// Claims counts the consumer's rows in processed_messages and processed_messages_daily:
	// messages applied and not yet deleted by retention.
	Claims int64
	// NewestClaim is when the most recent of them was applied (zero when there are none).
	NewestClaim time.Time
}

// Stats returns ClaimStats for every consumer with claims in schema. It scans the claim
// tables: on tables of many millions of rows this takes seconds, so bound ctx with a deadline.
// A schema without processed_messages (not migrated) is an error for which
// pgtx.IsUndefinedTable is true, not an empty map.
func Stats(ctx context.Context, db *sql.DB, schema string) (map[string]ClaimStats, error) {
	pm, daily, err := Tables("stats", db, &schema)
	if err != nil {
		return nil, err
	}
	const part = `SELECT consumer, count(*) AS n, max(processed_at) AS newest FROM %s GROUP BY consumer`
	union := fmt.Sprintf(part, pm)
	ok, err := HasDaily(ctx, db, daily)
	if err != nil {
		return nil, fmt.Errorf("once: stats: %w", err)
	}
	if ok {
		union += "\nUNION ALL\n" + fmt.Sprintf(part, daily)
	}
	out := map[string]ClaimStats{}
	err = pgtx.QueryEach(ctx, db, func(s pgtx.Scanner) error {
		var consumer string
		var st ClaimStats
		var newest sql.NullTime
		err := s.Scan(&consumer, &st.Claims, &newest)
		st.NewestClaim = newest.Time
		out[consumer] = st
		return err
	}, `SELECT consumer, sum(n)::bigint, max(newest) FROM (`+union+`) x GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("once: stats: %w", err)
	}
	return out, nil
}

// ClaimHistory counts the claims of each consumer (or only of consumer, when not "") per
// bucket of width from start, over n buckets, by processed_at: the time of the transaction
// that applied the message. It reads processed_messages and, when the schema has it,
// processed_messages_daily. Claims deleted by retention are not counted. Without a consumer it
// scans the claim tables; with one, only processed_messages_daily.
func ClaimHistory(ctx context.Context, db *sql.DB, schema, consumer string, start time.Time, width time.Duration, n int) (map[string][]int64, error) {
	pm, daily, err := Tables("claim history", db, &schema)
	if err != nil {
		return nil, err
	}
	if width <= 0 || n < 1 {
		return nil, fmt.Errorf("once: claim history: width must be positive and n at least 1, got %s and %d", width, n)
	}
	args := []any{start, start.Add(time.Duration(n) * width), width.Seconds()}
	where := `processed_at >= $1 AND processed_at < $2`
	if consumer != "" {
		args = append(args, consumer)
		where += ` AND consumer = $4`
	}
	union := `SELECT consumer, processed_at FROM ` + pm + ` WHERE ` + where
	ok, err := HasDaily(ctx, db, daily)
	if err != nil {
		return nil, fmt.Errorf("once: claim history: %w", err)
	}
	if ok {
		union += "\nUNION ALL\nSELECT consumer, processed_at FROM " + daily + ` WHERE ` + where
	}
	rows, err := db.QueryContext(ctx, `SELECT consumer, floor(extract(epoch FROM processed_at - $1::timestamptz) / $3)::int AS b, count(*)
FROM (`+union+`) x GROUP BY 1, 2`, args...)
	if err != nil {
		return nil, fmt.Errorf("once: claim history: %w", err)
	}
	out, err := readBuckets(rows, n)
	return out, WrapErr("claim history", err)
}

// readBuckets reads rows of (consumer, bucket index, count) into n buckets per consumer,
// leaving out indexes outside 0..n-1, and closes rows.
func readBuckets(rows *sql.Rows, n int) (map[string][]int64, error) {
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var c string
		var k int
		var cnt int64
		if err := rows.Scan(&c, &k, &cnt); err != nil {
			return nil, err
		}
		if k < 0 || k >= n {
			continue
		}
		if out[c] == nil {
			out[c] = make([]int64, n)
		}
		out[c][k] += cnt
	}
	return out, rows.Err()
}

// WrapErr prefixes err with the operation ("once: op: ..."); nil stays nil.
func WrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("once: %s: %w", op, err)
}

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
	pm, daily, err := Tables("lookup claim", db, &schema)
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

// DuplicateHistory returns, for each consumer (or only consumer, when not empty) that skipped
// duplicates between start and start + n*width, the number it skipped in each of the n buckets
// of width, from duplicates_per_minute (recorded by every process's middleware, within a
// second; a bucket narrower than a minute gets the whole minute). It only reads.
// A schema without the table is an error for which pgtx.IsUndefinedTable is true.
func DuplicateHistory(ctx context.Context, db *sql.DB, schema, consumer string, start time.Time, width time.Duration, n int) (map[string][]int64, error) {
	if db == nil {
		return nil, fmt.Errorf("once: duplicate history: db is nil")
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return nil, fmt.Errorf("once: duplicate history: %w", err)
	}
	if width <= 0 || n < 1 {
		return nil, fmt.Errorf("once: duplicate history: width must be positive and n at least 1, got %s and %d", width, n)
	}
	rows, err := db.QueryContext(ctx, `SELECT consumer, floor(extract(epoch FROM minute - $1::timestamptz) / $3)::int AS b, sum(duplicates)::bigint
FROM `+pgtx.QualifiedName(schema, "duplicates_per_minute")+`
WHERE minute >= $1 AND minute < $2 AND ($4 = '' OR consumer = $4) GROUP BY 1, 2`,
		start, start.Add(time.Duration(n)*width), width.Seconds(), consumer)
	if err != nil {
		return nil, fmt.Errorf("once: duplicate history: %w", err)
	}
	out, err := readBuckets(rows, n)
	return out, WrapErr("duplicate history", err)
}

// DaysReport says what MaintainDays changed in processed_messages_daily.
type DaysReport struct {
	// Dropped are the days whose partition was dropped, oldest first.
	Dropped []time.Time
	// Created counts the days whose partition was created ahead.
	Created int
}

// dropLockKey serialises the drops of concurrent MaintainDays calls on one schema.
func dropLockKey(schema string) int64 { return worker.LockKey("retention-drop", schema) }

// MaintainDays keeps the day partitions of processed_messages_daily (Config.PartitionByDay):
// it drops every day that ended before dropBefore's day, then, unless ahead is negative,
// creates the partitions from today's day through ahead days later, so that claims never wait
// for a partition to be created. It does nothing while the table has no partition (the table
// is not in use). The report counts what was done before an error too.
//
// Guarantee and limit: a day goes as a whole, with every consumer's claims of that day (the
// table is shared), so pass the cut-off of the consumer that keeps claims longest. DETACH
// CONCURRENTLY keeps claims flowing meanwhile; concurrent calls on one schema are serialised
// by an advisory lock held around the drops.
func MaintainDays(ctx context.Context, db *sql.DB, schema string, dropBefore, today time.Time, ahead int) (DaysReport, error) {
	var rep DaysReport
	if _, _, err := Tables("maintain days", db, &schema); err != nil {
		return rep, err
	}
	days, err := partition.List(ctx, db, schema)
	if err != nil {
		return rep, fmt.Errorf("once: maintain days: %w", err)
	}
	if len(days) == 0 {
		return rep, nil
	}
	// DETACH ... CONCURRENTLY cannot run in a transaction, so the lock is a session-level one
	// on a connection of its own.
	conn, err := db.Conn(ctx)
	if err != nil {
		return rep, fmt.Errorf("once: maintain days: %w", err)
	}
	defer conn.Close()
	key := dropLockKey(schema)
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		return rep, fmt.Errorf("once: maintain days: lock: %w", err)
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, key)
	}()
	rep.Dropped, err = partition.DropBefore(ctx, db, schema, dropBefore)
	if err != nil {
		return rep, fmt.Errorf("once: maintain days: %w", err)
	}
	if ahead < 0 {
		return rep, nil
	}
	first := partition.Day(today)
	last := first.AddDate(0, 0, ahead)
	if err := partition.Ensure(ctx, db, schema, first, last); err != nil {
		return rep, fmt.Errorf("once: maintain days: %w", err)
	}
	have := map[time.Time]bool{}
	for _, d := range days {
		have[d] = true
	}
	for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
		if !have[d] {
			rep.Created++
		}
	}
	return rep, nil
}
