package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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

// Ops are the operator's tools on the inbox: look at rows, count them, replay, skip, pause.
// Every change is one statement and wakes the processors; none touches IN_PROGRESS rows.
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
	config.Schema = cmp.Or(config.Schema, pgtx.DefaultSchema)
	if err := pgtx.ValidateIdentifier("schema", config.Schema); err != nil {
		return nil, fmt.Errorf("inbox: invalid ops config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Ops{db: db, schema: config.Schema, q: newQueries(config.Schema), logger: logger}, nil
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

// where returns the SQL condition and arguments that select f's rows, defaultStatuses when f
// names none.
func (f Filter) where(defaultStatuses []Status) (string, []any, error) {
	if err := validateConsumer(f.Consumer); err != nil {
		return "", nil, err
	}
	if len(f.Statuses) > 0 {
		defaultStatuses = f.Statuses
	}
	statuses, err := statusTexts(defaultStatuses)
	if err != nil {
		return "", nil, err
	}
	// Each field that is set adds one condition on one argument ($n: its place in args).
	conds := []struct {
		set  bool
		cond string
		arg  any
	}{
		{true, "consumer = $%d", f.Consumer},
		{len(statuses) > 0, "status = ANY($%d::text[])", statuses},
		{len(f.IDs) > 0, "id = ANY($%d::bigint[])", f.IDs},
		{len(f.MessageIDs) > 0, "message_id = ANY($%d::text[])", f.MessageIDs},
		{f.OrderingKey != "", "ordering_key = $%d", f.OrderingKey},
		{f.Topic != "", "topic = $%d", f.Topic},
		{!f.ReceivedAfter.IsZero(), "received_at >= $%d", f.ReceivedAfter},
		{!f.ReceivedBefore.IsZero(), "received_at < $%d", f.ReceivedBefore},
		{f.ErrorContains != "", "strpos(last_error, $%d) > 0", f.ErrorContains},
		{f.AfterID > 0, "id > $%d", f.AfterID},
	}
	var sql []string
	var args []any
	for _, c := range conds {
		if c.set {
			args = append(args, c.arg)
			sql = append(sql, fmt.Sprintf(c.cond, len(args)))
		}
	}
	return strings.Join(sql, " AND "), args, nil
}

// statusTexts returns statuses as the text[] argument of a query, refusing unknown ones.
func statusTexts(statuses []Status) ([]string, error) {
	out := make([]string, len(statuses))
	for i, st := range statuses {
		if !st.valid() {
			return nil, fmt.Errorf("unknown status %q: use PENDING, IN_PROGRESS, DONE, FAILED or SKIPPED", st)
		}
		out[i] = string(st)
	}
	return out, nil
}

// changeableStatuses are the statuses each change may select: the one rule of which rows an
// operator may change, which the CLI and the admin page check too (inboxops.CheckChange).
// IN_PROGRESS is never one: those rows belong to a worker.
var changeableStatuses = map[string][]Status{
	"replay": {StatusFailed, StatusPending, StatusDone, StatusSkipped},
	"skip":   {StatusFailed, StatusPending},
}

// changeable refuses the statuses in f that the change op may not select.
func changeable(op string, f Filter) error {
	allowed := changeableStatuses[op]
	for _, s := range f.Statuses {
		if s == StatusInProgress {
			return errors.New("IN_PROGRESS rows belong to a worker and cannot be changed: wait for it, or its lease, to settle them")
		}
		if !slices.Contains(allowed, s) {
			return fmt.Errorf("status %s cannot be changed by %s (allowed: %s)", s, op, joinStatuses(allowed))
		}
	}
	return nil
}

func joinStatuses(ss []Status) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}

// Replay sends the rows matching f (default: FAILED) back to PENDING, due now, with the
// attempt count reset, and returns how many it changed. With dryRun it only counts them.
// DONE and SKIPPED rows may be replayed too (select them in f.Statuses): their handler runs
// again, once, on the next claim. A replayed row is ordered after the older rows of its key
// and holds back the newer unfinished ones, like any PENDING row.
func (o *Ops) Replay(ctx context.Context, f Filter, dryRun bool) (int, error) {
	if err := changeable("replay", f); err != nil {
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
	if err := changeable("skip", f); err != nil {
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
