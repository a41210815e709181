package retention

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/lifecycle"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/pgtx"
)

// Report says what one round deleted.
type Report struct {
	// Claims deleted from processed_messages, in all and per consumer.
	Claims           int64
	ClaimsByConsumer map[string]int64
	// DailyPartitionsDropped counts whole days of processed_messages_daily dropped;
	// DailyPartitionsCreated the days created ahead.
	DailyPartitionsDropped int64
	DailyPartitionsCreated int64
	// InboxRows counts finished inbox rows deleted, in all and per consumer.
	InboxRows           int64
	InboxRowsByConsumer map[string]int64
	// OutboxRows counts relayed outbox rows deleted.
	OutboxRows int64
	// HTTPKeys counts stored httpidem responses deleted (Config.HTTPKeysKeep).
	HTTPKeys int64
	// Duration is how long the round took.
	Duration time.Duration
}

// Counters are a janitor's running totals since it was created, for metrics.
type Counters struct {
	Claims                 uint64 // rows deleted from processed_messages
	DailyPartitionsDropped uint64 // days of processed_messages_daily dropped
	InboxRows              uint64 // finished inbox rows deleted
	OutboxRows             uint64 // relayed outbox rows deleted
	HTTPKeys               uint64 // stored HTTP responses deleted
	Rounds                 uint64 // rounds finished (with or without errors)
	FailedRounds           uint64 // rounds in which some step failed
	IsLeader               bool   // Run holds the leadership lock right now
	LastRound              time.Time
}

// Janitor deletes expired dedupe records and relayed outbox rows.
//
// What it deletes, each in batches of at most BatchSize rows, one short transaction per batch:
//   - claims in processed_messages older than their consumer's Keep (by processed_at, the
//     database time the message was applied);
//   - whole days of processed_messages_daily once the day is older than the longest Keep of
//     all consumers (the table is shared; see the package documentation);
//   - DONE and SKIPPED inbox rows finished longer ago than their consumer's window;
//   - outbox rows older than OutboxKeep that every relay in outbox_offsets has forwarded;
//   - optionally, stored HTTP responses of httpidem (HTTPKeysKeep).
//
// What it never deletes: PENDING, IN_PROGRESS and FAILED inbox rows, outbox rows some relay
// has not forwarded, rows in outbox_rejected, intents. Every cut-off is computed from the
// database clock, so the clocks of application hosts do not matter.
//
// Guarantee and limit: a claim is kept for at least its consumer's Keep after it was applied.
// A copy arriving later than that is no longer recognised; the middleware's age guard
// (once.Config.MaxMessageAge, set a little below Keep) refuses such copies instead of
// applying them, and NewJanitor warns when a declared RedeliveryHorizon exceeds Keep.
//
// Close stops Run and waits for it to return. It is idempotent.
func (j *Janitor) Close() error { return j.life.Close() }

// Run elects one active janitor per schema with a session-level advisory lock; RunOnce runs one
// round without it (see RunOnce).
type Janitor struct {
	db       *sql.DB
	config   Config
	logger   watermill.LoggerAdapter
	lockKey  int64
	dropKey  int64
	warnings []string
	q        queries
	inboxOps *inbox.Ops

	claims, dailyDropped, inboxRows, outboxRows, httpKeys, rounds, failedRounds atomic.Uint64
	leader                                                                      atomic.Bool
	lastRound                                                                   atomic.Int64

	life lifecycle.Runner
}

type queries struct {
	consumers, deleteClaims                  string
	inboxConsumers                           string
	minRelayPosition, deleteOutbox           string
	deleteHTTPKeys                           string
	countClaims, countDaily, deleteDaily     string
	relays, deleteRelay, relayLockHeldByPeer string
}

func newQueries(schema string) queries {
	pm := pgtx.QualifiedName(schema, "processed_messages")
	daily := pgtx.QualifiedName(schema, partition.Parent)
	ib := pgtx.QualifiedName(schema, "inbox")
	ob := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	keys := pgtx.QualifiedName(schema, "http_idempotency_keys")
	// distinct walks a (consumer, ...) index one consumer at a time (a "loose index scan"),
	// so listing consumers costs one index probe per consumer, not a scan of the table.
	distinct := func(table string) string {
		return `WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM ` + table + ` ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer FROM ` + table + ` t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL`
	}
	return queries{
		consumers:      distinct(pm),
		inboxConsumers: distinct(ib),
		// ctid = ANY(ARRAY(...)) makes a TID scan: the batch is located once through the
		// (consumer, processed_at) index and deleted by physical address.
		deleteClaims: `DELETE FROM ` + pm + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + pm + ` WHERE consumer = $1 AND processed_at < $2 LIMIT $3))`,
		// A relay's position is a snapshot (outbox/relay.go): it has published every row whose
		// transaction is visible in snapshot, and, in a round in progress, the rows visible in
		// target_snapshot up to target_offset. Every such row lies below the xmax of the round's
		// snapshot, so the least of those over all relays bounds the rows any relay could have
		// published; no row means no relay has ever run.
		minRelayPosition: `SELECT pg_snapshot_xmax(coalesce(target_snapshot, snapshot))::text FROM ` + offsets + `
ORDER BY pg_snapshot_xmax(coalesce(target_snapshot, snapshot)) LIMIT 1`,
		// The batch is the oldest rows in transaction order that every relay has published,
		// and only those of them old enough go: the caller stops when a batch holds a younger
		// row, so a round never walks the rows kept for OutboxKeep. created_at is a timestamp
		// without time zone written with the session's clock, hence localtimestamp. The relays
		// are read again here, so one registered since the bound was read holds rows back too.
		deleteOutbox: `DELETE FROM ` + ob + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM (
        SELECT t.ctid, t.created_at FROM ` + ob + ` t
        WHERE t.transaction_id < $1::xid8
          AND NOT EXISTS (SELECT 1 FROM ` + offsets + ` o WHERE NOT (
                pg_visible_in_snapshot(t.transaction_id, o.snapshot)
                OR coalesce(pg_visible_in_snapshot(t.transaction_id, o.target_snapshot) AND t."offset" <= o.target_offset, false)))
        ORDER BY t.transaction_id, t."offset"
        LIMIT $3) head
    WHERE created_at < localtimestamp - $2::bigint * interval '1 microsecond'))`,
		deleteHTTPKeys: `DELETE FROM ` + keys + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + keys + ` WHERE created_at < now() - $1::bigint * interval '1 microsecond' LIMIT $2))`,
		countClaims: `SELECT count(*) FROM ` + pm + ` WHERE consumer = $1 AND processed_at < $2`,
		countDaily:  `SELECT count(*) FROM ` + daily + ` WHERE ($1 = '' OR consumer = $1) AND processed_at < $2`,
		// The daily table is partitioned: ctid is not unique across partitions, so rows are
		// addressed by their primary key.
		deleteDaily: `DELETE FROM ` + daily + ` WHERE (consumer, message_id, occurred_on) IN (
    SELECT consumer, message_id, occurred_on FROM ` + daily + ` WHERE ($1 = '' OR consumer = $1) AND processed_at < $2 LIMIT $3)`,
		relays:      `SELECT consumer_group FROM ` + offsets + ` ORDER BY consumer_group`,
		deleteRelay: `DELETE FROM ` + offsets + ` WHERE consumer_group = $1`,
		// An advisory lock on a bigint key shows in pg_locks as classid (high 32 bits), objid
		// (low 32 bits), objsubid 1.
		relayLockHeldByPeer: `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)`,
	}
}

func hashKey(s string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return int64(h.Sum64())
}

// NewJanitor validates config and returns a janitor. It does not touch the database. For every
// consumer whose Keep is shorter than its declared RedeliveryHorizon it logs an error-level
// warning; Warnings returns the same texts.
func NewJanitor(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Janitor, error) {
	if db == nil {
		return nil, errors.New("retention: db is nil: open one with pgtx.Open")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("retention: invalid config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	logger = logger.With(watermill.LogFields{"component": "retention", "schema": config.Schema})
	inboxOps, err := inbox.NewOps(db, inbox.OpsConfig{Schema: config.Schema}, logger)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	j := &Janitor{
		inboxOps: inboxOps,
		db:       db,
		config:   config,
		logger:   logger,
		lockKey:  hashKey("watermill-once/retention/" + config.Schema),
		dropKey:  hashKey("watermill-once/retention-drop/" + config.Schema),
		warnings: config.warnings(),
		q:        newQueries(config.Schema),
	}
	for _, w := range j.warnings {
		logger.Error("RETENTION TOO SHORT: "+w, errRetentionBelowHorizon, nil)
	}
	return j, nil
}

var errRetentionBelowHorizon = errors.New("retention window shorter than the declared redelivery horizon")

// Warnings returns the configuration warnings NewJanitor logged: one per window shorter than
// its declared redelivery horizon. Empty when every declared horizon is covered.
func (j *Janitor) Warnings() []string { return append([]string(nil), j.warnings...) }

// Config returns the configuration in force, defaults filled in.
func (j *Janitor) Config() Config { return j.config }

// Counters returns the janitor's running totals.
func (j *Janitor) Counters() Counters {
	var last time.Time
	if n := j.lastRound.Load(); n != 0 {
		last = time.Unix(0, n)
	}
	return Counters{
		Claims:                 j.claims.Load(),
		DailyPartitionsDropped: j.dailyDropped.Load(),
		InboxRows:              j.inboxRows.Load(),
		OutboxRows:             j.outboxRows.Load(),
		HTTPKeys:               j.httpKeys.Load(),
		Rounds:                 j.rounds.Load(),
		FailedRounds:           j.failedRounds.Load(),
		IsLeader:               j.leader.Load(),
		LastRound:              last,
	}
}

// Run deletes expired rows every Interval until ctx is cancelled or Close is called, and
// returns nil then. Only one instance per schema works at a time: it holds a session-level
// advisory lock on a connection of its own for as long as it leads; the others stand by and
// try again every Interval, so one takes over within an Interval after the leader stops or
// its connection breaks. Errors are logged and counted (Counters.FailedRounds), never returned.
func (j *Janitor) Run(ctx context.Context) error {
	ctx, done := j.life.Start(ctx)
	defer done()
	for ctx.Err() == nil {
		if err := j.lead(ctx); err != nil && ctx.Err() == nil {
			j.logger.Error("Janitor lost or could not take leadership, retrying", err, watermill.LogFields{"retry_in": j.config.Interval})
		}
		if !lifecycle.Sleep(ctx, j.config.Interval) {
			break
		}
	}
	return nil
}

// lead takes the leadership lock and runs rounds while it holds it. It returns nil at once
// when another instance leads.
func (j *Janitor) lead(ctx context.Context) error {
	conn, err := j.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("retention: leadership connection: %w", err)
	}
	defer conn.Close()
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, j.lockKey).Scan(&got); err != nil {
		return fmt.Errorf("retention: leadership lock: %w", err)
	}
	if !got {
		return nil
	}
	j.leader.Store(true)
	j.logger.Info("Janitor active", watermill.LogFields{"interval": j.config.Interval})
	defer func() {
		j.leader.Store(false)
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, j.lockKey)
	}()
	for {
		// The lock lives as long as this session: a query that succeeds on it proves it is
		// still ours. If the connection broke, the server released the lock and another
		// instance may lead now; stop before deleting anything more.
		if _, err := conn.ExecContext(ctx, `SELECT 1`); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("retention: leadership connection lost: %w", err)
		}
		if _, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.logger.Error("Janitor round failed in part; the next round tries again", err, nil)
		}
		if !lifecycle.Sleep(ctx, j.config.Interval) {
			return nil
		}
	}
}

// RunOnce runs one round now and reports what it deleted. It does not take the leadership
// lock, so the CLI can purge on demand while a janitor service runs: every delete is a short
// transaction that removes rows by address, and two rounds at once only share the work. The
// drop of expired day partitions is serialised by an advisory lock of its own. A step that
// fails does not stop the others; the error joins every failure and the report counts what
// was deleted before it.
func (j *Janitor) RunOnce(ctx context.Context) (Report, error) {
	start := time.Now()
	rep := Report{ClaimsByConsumer: map[string]int64{}}
	var now time.Time
	if err := j.db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		j.finishRound(start, &rep, err)
		return rep, fmt.Errorf("retention: read database clock: %w", err)
	}
	var errs []error
	step := func(name string, fn func() error) {
		if ctx.Err() != nil {
			return
		}
		if err := fn(); err != nil {
			err = fmt.Errorf("retention: %s: %w", name, hint(err))
			errs = append(errs, err)
			j.logger.Error("Retention step failed", err, watermill.LogFields{"step": name})
		}
	}
	step("claims", func() error { return j.deleteClaims(ctx, now, &rep) })
	step("daily partitions", func() error { return j.maintainPartitions(ctx, now, &rep) })
	step("inbox", func() error { return j.deleteInbox(ctx, now, &rep) })
	step("outbox", func() error { return j.deleteOutbox(ctx, &rep) })
	if j.config.HTTPKeysKeep > 0 {
		step("http idempotency keys", func() error { return j.deleteHTTPKeys(ctx, &rep) })
	}
	if ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("retention: round interrupted: %w", context.Cause(ctx)))
	}
	err := errors.Join(errs...)
	j.finishRound(start, &rep, err)
	return rep, err
}

func (j *Janitor) finishRound(start time.Time, rep *Report, err error) {
	rep.Duration = time.Since(start)
	j.rounds.Add(1)
	if err != nil {
		j.failedRounds.Add(1)
	}
	j.lastRound.Store(time.Now().UnixNano())
	if rep.Claims+rep.DailyPartitionsDropped+rep.InboxRows+rep.OutboxRows+rep.HTTPKeys > 0 {
		j.logger.Info("Retention round deleted rows", watermill.LogFields{
			"claims": rep.Claims, "daily_partitions_dropped": rep.DailyPartitionsDropped,
			"inbox_rows": rep.InboxRows, "outbox_rows": rep.OutboxRows, "http_keys": rep.HTTPKeys,
			"duration": rep.Duration,
		})
	}
}

// hint adds what to do to the errors an operator will meet first.
func hint(err error) error {
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("%w (a watermill-once table is missing: run the migrations, `wmonce migrate up`)", err)
	}
	return err
}

func (j *Janitor) deleteClaims(ctx context.Context, now time.Time, rep *Report) error {
	consumers, err := listConsumers(ctx, j.db, j.q.consumers)
	if err != nil {
		return err
	}
	for _, c := range consumers {
		cutoff := now.Add(-j.config.policy(c).Keep)
		n, err := deleteInBatches(ctx, j.db, j.config.BatchSize, j.q.deleteClaims, c, cutoff)
		if n > 0 {
			rep.Claims += n
			rep.ClaimsByConsumer[c] += n
			j.claims.Add(uint64(n))
		}
		if err != nil {
			return fmt.Errorf("consumer %q: %w", c, err)
		}
	}
	return nil
}

func (j *Janitor) maintainPartitions(ctx context.Context, now time.Time, rep *Report) error {
	days, err := partition.List(ctx, j.db, j.config.Schema)
	if err != nil {
		return err
	}
	if len(days) == 0 {
		return nil // the day-partitioned table is not in use
	}
	// DETACH ... CONCURRENTLY cannot run in a transaction, so concurrent rounds (Run and a
	// RunOnce from the CLI) are kept apart by a session-level lock held around the drops.
	conn, err := j.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, j.dropKey); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, j.dropKey)
	}()
	dropped, err := partition.DropBefore(ctx, j.db, j.config.Schema, now.Add(-j.config.longestKeep()))
	rep.DailyPartitionsDropped += int64(len(dropped))
	j.dailyDropped.Add(uint64(len(dropped)))
	for _, d := range dropped {
		j.logger.Info("Dropped expired day of claims", watermill.LogFields{"day": d.Format(time.DateOnly)})
	}
	if err != nil {
		return err
	}
	if j.config.PartitionsAhead < 0 {
		return nil
	}
	today := partition.Day(now)
	last := today.AddDate(0, 0, j.config.PartitionsAhead)
	have := map[time.Time]bool{}
	for _, d := range days {
		have[d] = true
	}
	if err := partition.Ensure(ctx, j.db, j.config.Schema, today, last); err != nil {
		return err
	}
	for d := today; !d.After(last); d = d.AddDate(0, 0, 1) {
		if !have[d] {
			rep.DailyPartitionsCreated++
		}
	}
	return nil
}

func (j *Janitor) deleteInbox(ctx context.Context, now time.Time, rep *Report) error {
	consumers, err := listConsumers(ctx, j.db, j.q.inboxConsumers)
	if err != nil {
		return err
	}
	rep.InboxRowsByConsumer = map[string]int64{}
	for _, c := range consumers {
		n, err := j.deleteFinishedInbox(ctx, c, now.Add(-j.config.inboxKeep(c)))
		if n > 0 {
			rep.InboxRows += n
			rep.InboxRowsByConsumer[c] += n
			j.inboxRows.Add(uint64(n))
		}
		if err != nil {
			return fmt.Errorf("consumer %q: %w", c, err)
		}
	}
	return nil
}

// deleteFinishedInbox deletes one consumer's finished rows in batches through the inbox's own
// operation, so that what "finished" means is defined in one place.
func (j *Janitor) deleteFinishedInbox(ctx context.Context, consumer string, before time.Time) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		n, err := j.inboxOps.DeleteFinished(ctx, consumer, before, j.config.BatchSize)
		total += int64(n)
		if err != nil || n < j.config.BatchSize {
			return total, err
		}
	}
	return total, ctx.Err()
}

func (j *Janitor) deleteOutbox(ctx context.Context, rep *Report) error {
	var bound string
	err := j.db.QueryRowContext(ctx, j.q.minRelayPosition).Scan(&bound)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // no relay has ever run: nothing is known to be forwarded
	}
	if err != nil {
		return fmt.Errorf("read relay positions: %w", err)
	}
	keep := j.config.OutboxKeep.Microseconds()
	for ctx.Err() == nil {
		res, err := j.db.ExecContext(ctx, j.q.deleteOutbox, bound, keep, j.config.BatchSize)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		rep.OutboxRows += n
		j.outboxRows.Add(uint64(n))
		if n < int64(j.config.BatchSize) {
			break
		}
	}
	return ctx.Err()
}

func (j *Janitor) deleteHTTPKeys(ctx context.Context, rep *Report) error {
	keep := j.config.HTTPKeysKeep.Microseconds()
	for ctx.Err() == nil {
		res, err := j.db.ExecContext(ctx, j.q.deleteHTTPKeys, keep, j.config.BatchSize)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		rep.HTTPKeys += n
		j.httpKeys.Add(uint64(n))
		if n < int64(j.config.BatchSize) {
			break
		}
	}
	return ctx.Err()
}

func listConsumers(ctx context.Context, db *sql.DB, query string) ([]string, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, fmt.Errorf("list consumers: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	return out, nil
}

// deleteInBatches runs query (which deletes at most its last argument rows) with args and
// the batch size until a batch comes back short. Each statement is its own transaction.
func deleteInBatches(ctx context.Context, db *sql.DB, batch int, query string, args ...any) (int64, error) {
	args = append(args, batch)
	var total int64
	for ctx.Err() == nil {
		res, err := db.ExecContext(ctx, query, args...)
		if err != nil {
			return total, err
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
	return total, ctx.Err()
}
