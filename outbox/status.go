package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// RelayStats is how far one relay (a row of outbox_offsets) has come.
type RelayStats struct {
	Name string
	// Source is the source whose rows the relay forwards (RelayConfig.Source); "" also for a
	// position registered before migration 012, whose relay forwards every row.
	Source string
	// Backlog counts committed rows of the relay's source it has not published yet: rows of
	// transactions that are not visible in its position's snapshot or written after it was
	// recorded (offset_high: rows written after a restore count whatever their transaction
	// id), less the part of a round in progress that it published, plus the rows it holds (Held).
	Backlog int64
	// OldestPending is when the oldest waiting row was written (zero when Backlog is 0); now
	// minus it is the relay lag.
	OldestPending time.Time
	// Lag is now minus OldestPending, measured by the database clock (zero when caught up).
	Lag time.Duration
	// Held lists the topics the relay holds because publishing to them failed: their rows wait
	// in outbox_held while the other topics go on (package doc, When the broker refuses).
	Held []HeldTopic
	// Delayed counts rows set aside in outbox_delayed until they are due (package doc, Delayed
	// delivery), and NextDue is when the earliest is (zero when Delayed is 0). They are not in
	// Backlog: a row waiting for its time is not late.
	Delayed int64
	NextDue time.Time
	// PausedAt is when the relay was paused (PauseRelay); zero when it is not.
	PausedAt time.Time
	// Position is whether the position was recorded on another cluster (CheckPositions):
	// when Position.Moved(), the relay forwards nothing and Position.Finding says what to run.
	Position PositionCheck
}

// HeldTopic is a topic a relay holds.
type HeldTopic struct {
	Topic string
	// Rows waiting in outbox_held for it.
	Rows int64
	// Since is when its oldest waiting row was held.
	Since time.Time
}

func scanRelayStats(s pgtx.Scanner) (RelayStats, error) {
	var r RelayStats
	var oldest, nextDue, pausedAt sql.NullTime
	var lagSeconds float64
	if err := s.Scan(&r.Name, &r.Source, &r.Backlog, &oldest, &lagSeconds, &r.Delayed, &nextDue, &pausedAt); err != nil {
		return RelayStats{}, err
	}
	r.OldestPending, r.NextDue, r.PausedAt = oldest.Time, nextDue.Time, pausedAt.Time
	r.Lag = time.Duration(lagSeconds * float64(time.Second))
	return r, nil
}

// Stats reports every relay's backlog and lag in schema, the topics it holds, and the number
// of rows set aside in outbox_rejected. A relay that has never run has no row and is not
// listed. It reads with plain SELECTs and changes nothing.
func Stats(ctx context.Context, db *sql.DB, schema string) (relays []RelayStats, rejected int64, err error) {
	if db == nil {
		return nil, 0, errors.New("outbox: status: db is nil")
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return nil, 0, fmt.Errorf("outbox: %w", err)
	}
	// One read-only transaction, without JIT: compiling these index-range counts costs far more
	// than it saves (0.5 s instead of 10 ms at 200,000 rows when the planner, before
	// outbox_offsets was analysed, estimates 110 relays).
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET LOCAL jit = off`); err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	table := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	held := pgtx.QualifiedName(schema, "outbox_held")
	relays, err = pgtx.QueryAll(ctx, tx, scanRelayStats, `
SELECT o.consumer_group, coalesce(o.source, ''), b.backlog + h.held, least(b.oldest, h.oldest),
    coalesce(extract(epoch FROM now() - least(b.oldest, h.oldest)), 0), d.delayed, d.next_due, o.paused_at
FROM `+offsets+` o
CROSS JOIN LATERAL (
    SELECT count(*) AS backlog, min(t.created_at)::timestamptz AS oldest
    FROM (
        SELECT t.transaction_id, t."offset", t.created_at, t.source FROM `+table+` t
        WHERE t.transaction_id >= pg_snapshot_xmin(o.snapshot)
        UNION ALL
        -- Rows below the snapshot's xmin written after it was recorded: written after a
        -- restore. Two index ranges rather than one OR, which would scan the whole outbox.
        SELECT t.transaction_id, t."offset", t.created_at, t.source FROM `+table+` t
        WHERE t."offset" > o.offset_high AND t.transaction_id < pg_snapshot_xmin(o.snapshot)
    ) t
    WHERE NOT (pg_visible_in_snapshot(t.transaction_id, o.snapshot) AND t."offset" <= o.offset_high)
      AND NOT coalesce(pg_visible_in_snapshot(t.transaction_id, o.target_snapshot) AND t."offset" <= o.target_offset, false)
      AND (o.source IS NULL OR t.source = o.source)
) b
CROSS JOIN LATERAL (
    SELECT count(*) AS held, min(h.created_at)::timestamptz AS oldest FROM `+held+` h WHERE h.relay = o.consumer_group
) h
CROSS JOIN LATERAL (
    SELECT count(*) AS delayed, min(d.due_at) AS next_due FROM `+pgtx.QualifiedName(schema, "outbox_delayed")+` d WHERE d.relay = o.consumer_group
) d
ORDER BY o.consumer_group`)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	byName := make(map[string]int, len(relays))
	for i, s := range relays {
		byName[s.Name] = i
	}
	err = pgtx.QueryEach(ctx, tx, func(s pgtx.Scanner) error {
		var relay string
		var h HeldTopic
		if err := s.Scan(&relay, &h.Topic, &h.Rows, &h.Since); err != nil {
			return err
		}
		if i, ok := byName[relay]; ok { // held rows of a forgotten relay are gone with it
			relays[i].Held = append(relays[i].Held, h)
		}
		return nil
	}, `SELECT relay, topic, count(*), min(held_at) FROM `+held+` GROUP BY relay, topic ORDER BY relay, topic`)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: status: held topics: %w", err)
	}
	check, err := checkPositions(ctx, tx, schema, "")
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	for _, c := range check.Positions {
		if i, ok := byName[c.Name]; ok {
			relays[i].Position = c
		}
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_rejected")).Scan(&rejected); err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	return relays, rejected, nil
}
