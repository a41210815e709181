// Package claims holds the operations on the middleware's claim tables, processed_messages and
// processed_messages_daily, and on duplicates_per_minute, other than the middleware's own
// claims: what retention, admin and the CLI read and delete. With middleware/once it owns these
// tables: no other package holds SQL on them. Each operation takes the schema the middleware
// was configured with ("" means pgtx.DefaultSchema). Errors keep the "once:" prefix: these are
// the middleware's tables, and the exported ones (once.PruneClaims, once.MaintainDays) return
// them.
package claims

import (
	"cmp"
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
	*schema = cmp.Or(*schema, pgtx.DefaultSchema)
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

// bothTables returns query, a SELECT over the table named by %s, over processed_messages and,
// when the schema has it, processed_messages_daily too (UNION ALL).
func bothTables(ctx context.Context, db *sql.DB, pm, daily, query string) (string, error) {
	ok, err := HasDaily(ctx, db, daily)
	if err != nil || !ok {
		return fmt.Sprintf(query, pm), err
	}
	return fmt.Sprintf(query, pm) + "\nUNION ALL\n" + fmt.Sprintf(query, daily), nil
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
	union, err := bothTables(ctx, db, pm, daily, `SELECT count(*) AS n FROM %s WHERE ($1 = '' OR consumer = $1) AND processed_at < $2`)
	var n int64
	if err == nil {
		err = db.QueryRowContext(ctx, `SELECT sum(n)::bigint FROM (`+union+`) x`, consumer, before).Scan(&n)
	}
	return n, WrapErr("count claims", err)
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
	union, err := bothTables(ctx, db, pm, daily, `SELECT consumer, count(*) AS n, max(processed_at) AS newest FROM %s GROUP BY consumer`)
	if err != nil {
		return nil, WrapErr("stats", err)
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
		return nil, WrapErr("stats", err)
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
	args, where := []any{start, start.Add(time.Duration(n) * width), width.Seconds()}, ""
	if consumer != "" { // not ($4 = '' OR ...): a generic plan would not use the consumer's index
		args, where = append(args, consumer), ` AND consumer = $4`
	}
	union, err := bothTables(ctx, db, pm, daily, `SELECT consumer, processed_at FROM %s WHERE processed_at >= $1 AND processed_at < $2`+where)
	if err != nil {
		return nil, WrapErr("claim history", err)
	}
	out, err := bucketCounts(ctx, db, width, n, `SELECT consumer, floor(extract(epoch FROM processed_at - $1::timestamptz) / $3)::int AS b, count(*)
FROM (`+union+`) x GROUP BY 1, 2`, args...)
	return out, WrapErr("claim history", err)
}

// bucketCounts runs query, whose rows are (consumer, bucket index, count), and adds them up in
// n buckets (of width) per consumer, leaving out indexes outside 0..n-1.
func bucketCounts(ctx context.Context, db *sql.DB, width time.Duration, n int, query string, args ...any) (map[string][]int64, error) {
	if width <= 0 || n < 1 {
		return nil, fmt.Errorf("width must be positive and n at least 1, got %s and %d", width, n)
	}
	out := map[string][]int64{}
	err := pgtx.QueryEach(ctx, db, func(s pgtx.Scanner) error {
		var c string
		var k int
		var cnt int64
		if err := s.Scan(&c, &k, &cnt); err != nil || k < 0 || k >= n {
			return err
		}
		if out[c] == nil {
			out[c] = make([]int64, n)
		}
		out[c][k] += cnt
		return nil
	}, query, args...)
	return out, err // with an error, what was read before it
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
	if err := checkLookup(consumer, key); err != nil {
		return Claim{}, false, WrapErr("lookup claim", err)
	}
	c = Claim{Consumer: consumer, Key: key}
	err = db.QueryRowContext(ctx, `SELECT payload_sha256, processed_at FROM `+pm+
		` WHERE consumer = $1 AND message_id = $2`, consumer, key).Scan(&c.PayloadSHA256, &c.ProcessedAt)
	if errors.Is(err, sql.ErrNoRows) {
		err = lookupDaily(ctx, db, daily, &c)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Claim{}, false, nil
	case err != nil:
		return Claim{}, false, WrapErr("lookup claim", err)
	}
	return c, true, nil
}

// lookupDaily reads c's newest claim in processed_messages_daily into c (sql.ErrNoRows: none).
func lookupDaily(ctx context.Context, db *sql.DB, daily string, c *Claim) error {
	return db.QueryRowContext(ctx, `SELECT payload_sha256, processed_at, occurred_on FROM `+daily+
		` WHERE consumer = $1 AND message_id = $2 ORDER BY occurred_on DESC LIMIT 1`, c.Consumer, c.Key).Scan(&c.PayloadSHA256, &c.ProcessedAt, &c.OccurredOn)
}

// checkLookup refuses a name or key PostgreSQL text cannot hold: it was never claimed, and
// saying so beats the server's encoding error.
func checkLookup(consumer, key string) error {
	if err := setup.CheckText("consumer", consumer); err != nil {
		return err
	}
	if err := setup.CheckText("key", key); err != nil {
		return fmt.Errorf("%w: %w", wmonce.ErrInvalidKey, err)
	}
	return nil
}

// DuplicateHistory returns, for each consumer (or only consumer, when not empty) that skipped
// duplicates between start and start + n*width, the number it skipped in each of the n buckets
// of width, from duplicates_per_minute (recorded by every process's middleware, within a
// second; a bucket narrower than a minute gets the whole minute). It only reads.
// A schema without the table is an error for which pgtx.IsUndefinedTable is true.
func DuplicateHistory(ctx context.Context, db *sql.DB, schema, consumer string, start time.Time, width time.Duration, n int) (map[string][]int64, error) {
	if _, _, err := Tables("duplicate history", db, &schema); err != nil {
		return nil, err
	}
	out, err := bucketCounts(ctx, db, width, n, `SELECT consumer, floor(extract(epoch FROM minute - $1::timestamptz) / $3)::int AS b, sum(duplicates)::bigint
FROM `+pgtx.QualifiedName(schema, "duplicates_per_minute")+`
WHERE minute >= $1 AND minute < $2 AND ($4 = '' OR consumer = $4) GROUP BY 1, 2`,
		start, start.Add(time.Duration(n)*width), width.Seconds(), consumer)
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
	if err != nil || len(days) == 0 {
		return rep, WrapErr("maintain days", err)
	}
	unlock, err := lockDrops(ctx, db, schema)
	if err != nil {
		return rep, WrapErr("maintain days", err)
	}
	defer unlock()
	rep.Dropped, err = partition.DropBefore(ctx, db, schema, dropBefore)
	if err == nil && ahead >= 0 {
		rep.Created, err = createAhead(ctx, db, schema, days, partition.Day(today), ahead)
	}
	return rep, WrapErr("maintain days", err)
}

// lockDrops takes the advisory lock that serialises the drops of concurrent MaintainDays calls
// on schema, and returns its release. DETACH ... CONCURRENTLY cannot run in a transaction, so
// the lock is a session-level one on a connection of its own.
func lockDrops(ctx context.Context, db *sql.DB, schema string) (unlock func(), err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	key := dropLockKey(schema)
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	return func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, key)
		_ = conn.Close()
	}, nil
}

// createAhead creates the partitions from first through ahead days later and returns how many
// of those days had none (days: the days that had one before).
func createAhead(ctx context.Context, db *sql.DB, schema string, days []time.Time, first time.Time, ahead int) (int, error) {
	last := first.AddDate(0, 0, ahead)
	if err := partition.Ensure(ctx, db, schema, first, last); err != nil {
		return 0, err
	}
	created := ahead + 1
	for _, d := range days {
		if !d.Before(first) && !d.After(last) {
			created--
		}
	}
	return created, nil
}
