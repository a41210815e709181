package inbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// ErrNotFound is returned by Inspect for a row that does not exist.
var ErrNotFound = errors.New("inbox: row not found")

// OpsConfig configures Ops.
type OpsConfig struct {
	// Schema holds the inbox table. Default pgtx.DefaultSchema.
	Schema string
}

// Ops are the operator's tools on the inbox: look at rows, count them, send parked rows back
// to work, skip what must not run, and delete old finished rows. A CLI and an admin page call
// these. Every change is one statement (one transaction) and wakes the processors.
//
// Changes never touch IN_PROGRESS rows: they belong to a worker until it settles them or its
// lease expires.
type Ops struct {
	db     *sql.DB
	schema string
	q      queries
	logger watermill.LoggerAdapter
}

// NewOps returns the operations on the inbox in config.Schema.
func NewOps(db *sql.DB, config OpsConfig, logger watermill.LoggerAdapter) (*Ops, error) {
	if db == nil {
		return nil, errors.New("inbox: db is nil: open one with pgtx.Open")
	}
	if config.Schema == "" {
		config.Schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", config.Schema); err != nil {
		return nil, fmt.Errorf("inbox: invalid ops config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Ops{db: db, schema: config.Schema, q: newQueries(config.Schema), logger: logger}, nil
}

// Row is one inbox row as stored.
type Row struct {
	ID            int64
	Consumer      string
	MessageID     string // dedupe key
	MessageUUID   string
	OrderingKey   string // "" when unordered
	Topic         string
	Payload       []byte
	Metadata      map[string]string
	Status        Status
	Attempts      int // attempts started
	NextAttemptAt time.Time
	LeaseUntil    time.Time // zero unless IN_PROGRESS
	LastError     string    // most recent failure, kept after a later success for the record
	ReceivedAt    time.Time
	FinishedAt    time.Time // DONE or SKIPPED time; zero otherwise
}

// Filter selects rows for List, Replay and Skip. Consumer is required; every other field
// narrows the selection when set.
type Filter struct {
	Consumer string
	// Statuses to match. Default: FAILED for Replay and Skip, every status for List.
	Statuses       []Status
	IDs            []int64
	MessageIDs     []string
	OrderingKey    string
	Topic          string
	ReceivedAfter  time.Time // inclusive
	ReceivedBefore time.Time // exclusive
	ErrorContains  string    // substring of last_error
	// AfterID pages List: only rows with a larger id.
	AfterID int64
}

func (f Filter) where(defaultStatuses []Status) (string, []any, error) {
	if err := validateConsumer(f.Consumer); err != nil {
		return "", nil, err
	}
	statuses := f.Statuses
	if len(statuses) == 0 {
		statuses = defaultStatuses
	}
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds = append(conds, "consumer = "+arg(f.Consumer))
	if len(statuses) > 0 {
		s := make([]string, len(statuses))
		for i, st := range statuses {
			if !st.valid() {
				return "", nil, fmt.Errorf("unknown status %q: use PENDING, IN_PROGRESS, DONE, FAILED or SKIPPED", st)
			}
			s[i] = string(st)
		}
		conds = append(conds, "status = ANY("+arg(s)+"::text[])")
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id = ANY("+arg(f.IDs)+"::bigint[])")
	}
	if len(f.MessageIDs) > 0 {
		conds = append(conds, "message_id = ANY("+arg(f.MessageIDs)+"::text[])")
	}
	if f.OrderingKey != "" {
		conds = append(conds, "ordering_key = "+arg(f.OrderingKey))
	}
	if f.Topic != "" {
		conds = append(conds, "topic = "+arg(f.Topic))
	}
	if !f.ReceivedAfter.IsZero() {
		conds = append(conds, "received_at >= "+arg(f.ReceivedAfter))
	}
	if !f.ReceivedBefore.IsZero() {
		conds = append(conds, "received_at < "+arg(f.ReceivedBefore))
	}
	if f.ErrorContains != "" {
		conds = append(conds, "strpos(last_error, "+arg(f.ErrorContains)+") > 0")
	}
	if f.AfterID > 0 {
		conds = append(conds, "id > "+arg(f.AfterID))
	}
	return strings.Join(conds, " AND "), args, nil
}

// changeable refuses IN_PROGRESS in a filter that changes rows.
func changeable(f Filter, allowed ...Status) error {
	for _, s := range f.Statuses {
		if s == StatusInProgress {
			return errors.New("IN_PROGRESS rows belong to a worker: wait for it (or its lease) to settle them")
		}
		ok := false
		for _, a := range allowed {
			ok = ok || s == a
		}
		if !ok {
			return fmt.Errorf("status %q cannot be changed by this operation (allowed: %v)", s, allowed)
		}
	}
	return nil
}

// Replay sends the rows matching f (default: FAILED) back to PENDING, due now, with the
// attempt count reset, and returns how many it changed. With dryRun it only counts them.
// DONE and SKIPPED rows may be replayed too (select them in f.Statuses): their handler runs
// again, once, on the next claim. A replayed row is ordered after the older rows of its key
// and holds back the newer unfinished ones, like any PENDING row.
func (o *Ops) Replay(ctx context.Context, f Filter, dryRun bool) (int, error) {
	if err := changeable(f, StatusFailed, StatusPending, StatusDone, StatusSkipped); err != nil {
		return 0, fmt.Errorf("inbox: replay: %w", err)
	}
	where, args, err := f.where([]Status{StatusFailed})
	if err != nil {
		return 0, fmt.Errorf("inbox: replay: %w", err)
	}
	n, err := o.change(ctx, f.Consumer, dryRun, where, args, `status = 'PENDING', attempts = 0, next_attempt_at = now(), finished_at = NULL`)
	if err != nil {
		return 0, fmt.Errorf("inbox: replay: %w", err)
	}
	if !dryRun {
		o.logger.Info("Inbox rows replayed", watermill.LogFields{"consumer": f.Consumer, "rows": n})
	}
	return n, nil
}

// Skip marks the rows matching f (default: FAILED; PENDING allowed) SKIPPED with reason: they
// will not run, count as finished for their ordering key (which moves on), and stay as dedupe
// records. It returns how many rows it changed; with dryRun it only counts them.
func (o *Ops) Skip(ctx context.Context, f Filter, reason string, dryRun bool) (int, error) {
	if strings.TrimSpace(reason) == "" {
		return 0, errors.New("inbox: skip: give a reason; it is kept in last_error")
	}
	if err := changeable(f, StatusFailed, StatusPending); err != nil {
		return 0, fmt.Errorf("inbox: skip: %w", err)
	}
	where, args, err := f.where([]Status{StatusFailed})
	if err != nil {
		return 0, fmt.Errorf("inbox: skip: %w", err)
	}
	set := ""
	if !dryRun {
		args = append(args, "skipped: "+reason)
		set = `status = 'SKIPPED', finished_at = now(), last_error = $` + strconv.Itoa(len(args)) + ` || coalesce('; last error: ' || last_error, '')`
	}
	n, err := o.change(ctx, f.Consumer, dryRun, where, args, set)
	if err != nil {
		return 0, fmt.Errorf("inbox: skip: %w", err)
	}
	if !dryRun {
		o.logger.Info("Inbox rows skipped", watermill.LogFields{"consumer": f.Consumer, "rows": n, "reason": reason})
	}
	return n, nil
}

// SkipKey skips the FAILED rows of one ordering key, so the key's later rows run.
func (o *Ops) SkipKey(ctx context.Context, consumer, orderingKey, reason string) (int, error) {
	if orderingKey == "" {
		return 0, errors.New("inbox: skip key: ordering key is empty")
	}
	return o.Skip(ctx, Filter{Consumer: consumer, OrderingKey: orderingKey}, reason, false)
}

// UnparkKey replays the FAILED rows of one ordering key: they run again, and the key's later
// rows follow them.
func (o *Ops) UnparkKey(ctx context.Context, consumer, orderingKey string) (int, error) {
	if orderingKey == "" {
		return 0, errors.New("inbox: unpark key: ordering key is empty")
	}
	return o.Replay(ctx, Filter{Consumer: consumer, OrderingKey: orderingKey}, false)
}

// change runs one UPDATE (or its count for a dry run) and wakes the consumer's processors.
func (o *Ops) change(ctx context.Context, consumer string, dryRun bool, where string, args []any, set string) (int, error) {
	var n int
	if dryRun {
		err := o.db.QueryRowContext(ctx, `SELECT count(*) FROM `+o.q.table+` WHERE `+where, args...).Scan(&n)
		return n, err
	}
	args = append(args, o.q.channel, consumer)
	ch, cons := "$"+strconv.Itoa(len(args)-1), "$"+strconv.Itoa(len(args))
	query := `WITH c AS (
    UPDATE ` + o.q.table + ` SET ` + set + `, claim_token = NULL, lease_until = NULL
    WHERE ` + where + `
    RETURNING 1
)
SELECT n, CASE WHEN n > 0 THEN pg_notify(` + ch + `::text, ` + cons + `::text)::text END FROM (SELECT count(*) AS n FROM c) x`
	var notified sql.NullString
	err := o.db.QueryRowContext(ctx, query, args...).Scan(&n, &notified)
	return n, err
}

const rowColumns = `id, consumer, message_id, message_uuid, coalesce(ordering_key, ''), topic, payload, metadata::text,
status, attempts, next_attempt_at, lease_until, coalesce(last_error, ''), received_at, finished_at`

func scanRow(s interface{ Scan(...any) error }) (Row, error) {
	var r Row
	var md, status string
	var lease, finished sql.NullTime
	if err := s.Scan(&r.ID, &r.Consumer, &r.MessageID, &r.MessageUUID, &r.OrderingKey, &r.Topic, &r.Payload, &md,
		&status, &r.Attempts, &r.NextAttemptAt, &lease, &r.LastError, &r.ReceivedAt, &finished); err != nil {
		return Row{}, err
	}
	r.Status = Status(status)
	r.LeaseUntil, r.FinishedAt = lease.Time, finished.Time
	if err := json.Unmarshal([]byte(md), &r.Metadata); err != nil {
		return Row{}, fmt.Errorf("row %d: metadata: %w", r.ID, err)
	}
	return r, nil
}

// Inspect returns one row by id.
func (o *Ops) Inspect(ctx context.Context, id int64) (Row, error) {
	r, err := scanRow(o.db.QueryRowContext(ctx, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("inbox: inspect row %d: %w", id, err)
	}
	return r, nil
}

// InspectMessage returns the row of one consumer's message by its dedupe key.
func (o *Ops) InspectMessage(ctx context.Context, consumer, messageID string) (Row, error) {
	r, err := scanRow(o.db.QueryRowContext(ctx, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE consumer = $1 AND message_id = $2`, consumer, messageID))
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: consumer %q, message %q", ErrNotFound, consumer, messageID)
	}
	if err != nil {
		return Row{}, fmt.Errorf("inbox: inspect message %q: %w", messageID, err)
	}
	return r, nil
}

// List returns up to limit rows matching f (default: every status) in received order. Page
// with f.AfterID set to the last id returned.
func (o *Ops) List(ctx context.Context, f Filter, limit int) ([]Row, error) {
	if limit < 1 || limit > MaxBatchSize {
		return nil, fmt.Errorf("inbox: list: limit must be between 1 and %d, got %d", MaxBatchSize, limit)
	}
	where, args, err := f.where(nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	args = append(args, limit)
	rs, err := o.db.QueryContext(ctx, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE `+where+` ORDER BY id LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	defer rs.Close()
	var out []Row
	for rs.Next() {
		r, err := scanRow(rs)
		if err != nil {
			return nil, fmt.Errorf("inbox: list: %w", err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return out, nil
}

// Stats is a snapshot of one consumer's unfinished rows, read from the database.
type Stats struct {
	Pending    int64 // waiting for a worker, including rows waiting out a retry backoff
	Retrying   int64 // the part of Pending that failed before (attempts > 0)
	InProgress int64
	Failed     int64 // parked: alert on this
	// OldestPendingReceivedAt is the receive time of the oldest PENDING row (zero if none);
	// OldestPendingAge is how long ago that was by the database clock: alert on this, it grows
	// when processing stalls or falls behind.
	OldestPendingReceivedAt time.Time
	OldestPendingAge        time.Duration
}

const statsSelect = `SELECT consumer,
    count(*) FILTER (WHERE status = 'PENDING'),
    count(*) FILTER (WHERE status = 'PENDING' AND attempts > 0),
    count(*) FILTER (WHERE status = 'IN_PROGRESS'),
    count(*) FILTER (WHERE status = 'FAILED'),
    min(received_at) FILTER (WHERE status = 'PENDING'),
    coalesce(extract(epoch FROM now() - min(received_at) FILTER (WHERE status = 'PENDING')), 0)::float8
FROM `

func scanStats(s interface{ Scan(...any) error }) (string, Stats, error) {
	var consumer string
	var st Stats
	var oldest sql.NullTime
	var age float64
	if err := s.Scan(&consumer, &st.Pending, &st.Retrying, &st.InProgress, &st.Failed, &oldest, &age); err != nil {
		return "", Stats{}, err
	}
	st.OldestPendingReceivedAt = oldest.Time
	st.OldestPendingAge = time.Duration(age * float64(time.Second))
	return consumer, st, nil
}

// Stats counts one consumer's unfinished rows. It reads only unfinished rows (through the
// work index), so its cost grows with the backlog, not with the table.
func (o *Ops) Stats(ctx context.Context, consumer string) (Stats, error) {
	rs, err := o.db.QueryContext(ctx, statsSelect+o.q.table+` WHERE consumer = $1 AND status IN `+unfinished+` GROUP BY consumer`, consumer)
	if err != nil {
		return Stats{}, fmt.Errorf("inbox: stats: %w", err)
	}
	defer rs.Close()
	var st Stats
	if rs.Next() {
		if _, st, err = scanStats(rs); err != nil {
			return Stats{}, fmt.Errorf("inbox: stats: %w", err)
		}
	}
	if err := rs.Err(); err != nil {
		return Stats{}, fmt.Errorf("inbox: stats: %w", err)
	}
	return st, nil
}

// AllStats returns Stats for every consumer with unfinished rows.
func (o *Ops) AllStats(ctx context.Context) (map[string]Stats, error) {
	rs, err := o.db.QueryContext(ctx, statsSelect+o.q.table+` WHERE status IN `+unfinished+` GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	defer rs.Close()
	out := map[string]Stats{}
	for rs.Next() {
		c, st, err := scanStats(rs)
		if err != nil {
			return nil, fmt.Errorf("inbox: stats: %w", err)
		}
		out[c] = st
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	return out, nil
}

// PruneFinished deletes the DONE and SKIPPED rows of req.Consumer ("" for every consumer)
// finished before req's cutoff (Before, or Keep ago by the database clock), oldest first, in
// batches of at most req.BatchSize rows (one statement each), and returns how many it deleted,
// also when it stops on an error or a cancelled ctx. PENDING, IN_PROGRESS and FAILED rows are
// never deleted.
//
// A deleted row no longer deduplicates its message: keep rows for longer than the broker can
// redeliver (retention, DLQ redrives, consumer-group resets). The scan walks the table in id
// order and stops at the batch size, so it is cheap while old rows are mostly finished.
func PruneFinished(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	schema, req, cutoff, err := pgtx.CheckPrune(ctx, db, schema, req, pgtx.AnyConsumer)
	if err != nil {
		return 0, fmt.Errorf("inbox: prune finished: %w", err)
	}
	q := newQueries(schema)
	// The batch is located through inbox_finished_idx (consumer, finished_at) and deleted by
	// physical address (a TID scan); rows an operator holds locked are skipped. A separate
	// statement per form keeps the consumer condition sargable under a generic plan.
	where := `consumer = $1 AND status IN ('DONE', 'SKIPPED') AND finished_at < $2`
	args := []any{req.Consumer, cutoff}
	if req.Consumer == "" {
		where = `status IN ('DONE', 'SKIPPED') AND finished_at < $1`
		args = []any{cutoff}
	}
	limitParam := fmt.Sprintf("$%d", len(args)+1)
	// The attempt records of the deleted rows (ClaimLock, migration 007) go with them: a
	// finished row's record is stale, and nothing else would ever delete it.
	query := `WITH gone AS (
    DELETE FROM ` + q.table + ` WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM ` + q.table + ` WHERE ` + where + ` LIMIT ` + limitParam + ` FOR UPDATE SKIP LOCKED))
    RETURNING id
), attempts AS (
    DELETE FROM ` + q.attempts + ` WHERE inbox_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`
	var total int64
	for ctx.Err() == nil {
		var n int64
		if err := db.QueryRowContext(ctx, query, append(args, req.BatchSize)...).Scan(&n); err != nil {
			return total, fmt.Errorf("inbox: prune finished: %w", err)
		}
		total += n
		if n < int64(req.BatchSize) {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// Consumers lists, in name order, every consumer with rows in the inbox. It walks the
// (consumer, ...) index one consumer at a time (a "loose index scan"), so it costs one index
// probe per consumer, not a scan of the table.
func (o *Ops) Consumers(ctx context.Context) ([]string, error) {
	rs, err := o.db.QueryContext(ctx, `WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM `+o.q.table+` ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer FROM `+o.q.table+` t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("inbox: consumers: %w", err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var c string
		if err := rs.Scan(&c); err != nil {
			return nil, fmt.Errorf("inbox: consumers: %w", err)
		}
		out = append(out, c)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("inbox: consumers: %w", err)
	}
	return out, nil
}

// FinishedStats counts one consumer's finished rows: the dedupe records PruneFinished prunes.
type FinishedStats struct {
	Done    int64
	Skipped int64
}

// FinishedStats returns FinishedStats for every consumer with DONE or SKIPPED rows. Unlike
// AllStats it scans the table (finished rows are most of it): bound ctx with a deadline.
func (o *Ops) FinishedStats(ctx context.Context) (map[string]FinishedStats, error) {
	rs, err := o.db.QueryContext(ctx, `SELECT consumer,
    count(*) FILTER (WHERE status = 'DONE'), count(*) FILTER (WHERE status = 'SKIPPED')
FROM `+o.q.table+` WHERE status IN ('DONE', 'SKIPPED') GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: finished stats: %w", err)
	}
	defer rs.Close()
	out := map[string]FinishedStats{}
	for rs.Next() {
		var c string
		var st FinishedStats
		if err := rs.Scan(&c, &st.Done, &st.Skipped); err != nil {
			return nil, fmt.Errorf("inbox: finished stats: %w", err)
		}
		out[c] = st
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("inbox: finished stats: %w", err)
	}
	return out, nil
}
